"""SS4 beside two running requests (docs/request-states.md, "Finding: a
session stopped while preempted counts a seat it gave up"; docs/proofs.md,
"Streaming sessions"): on the finding's model session-seats-k3 (three
requests, two seats, three batches in flight) the explicit search finds
SS4 broken, under vLLM 0.33 and 0.34, sync and async, at 9 and 10 steps,
and nothing else; its shortest path replays on the spec step by step.
SA10 (the auxiliary invariant that excludes the state with at most two
batches in flight) holds on every session model it applies to, and is
reached there (session-pressure-k2 preempts a session with deliver-mode
stale output in flight)."""

from __future__ import annotations

from collections import deque
from dataclasses import replace

import pytest

from flightcheck.spec import Arrive, CompleteOldest, Sample, Schedule, State, Status, initial_state, invariants_for, step
from flightcheck.spec.sessions import seats_taken
from flightcheck.verification.explicit.search import search, successors
from flightcheck.verification.session_models import SESSION_FINDING_MODELS, SESSION_PROFILE_MODELS

SS4, SA10 = "SS4_waiting_session_keeps_seat", "SA10_stale_preemption_leaves_a_seat"
PROFILES = ("vllm-0.33", "vllm-0.33-async", "vllm-0.34", "vllm-0.34-async")
# (states, edges) of session-seats-k3, and the length of SS4's shortest violation.
SEATS_COUNTS = {"sync": (8554, 22245, 9), "async": (18203, 46373, 10)}


def _shortest_path(profile: str) -> list:
    """session-seats-k3's shortest SS4 violation: the three arrivals, the
    first request's prompt with the session's first chunk, the session's last
    chunk (async: then two calls, the first request's decode ahead of its token
    and an empty one), the first output, the call that preempts the session,
    the call that admits the third request past it, and the stale output."""
    model = SESSION_FINDING_MODELS[profile]
    arrive = [Arrive(r, p) for r, p in enumerate(model.prompts)]
    if profile.endswith("async"):
        return arrive + [Schedule()] * 4 + [CompleteOldest((Sample(),)), Schedule(), CompleteOldest((Sample(),))]
    return arrive + [Schedule(), Schedule(), CompleteOldest((Sample(),)), Schedule(), Schedule(),
                     CompleteOldest((Sample(),))]


@pytest.mark.parametrize("profile", PROFILES)
def test_the_session_stopped_while_preempted_parks_beside_two_running_requests(profile: str):
    model = SESSION_FINDING_MODELS[profile]
    cfg = model.cfg
    s: State = initial_state(len(model.prompts), cfg.num_blocks)
    broken = []
    for action in _shortest_path(profile):
        before, s = s, step(s, cfg, action)
        assert s is not None, f"{action} is disabled"
        broken.append([i.name for i in invariants_for(cfg) if not i.holds(s, cfg)])
    assert broken[:-1] == [[]] * (len(broken) - 1) and broken[-1] == [SS4]
    session = s.requests[1]
    assert before.requests[1].status is Status.PREEMPTED and before.requests[1].num_stale > 0
    assert not before.requests[1].drop_stale and seats_taken(before) == cfg.max_num_seqs
    assert session.status is Status.WAITING_FOR_STREAMING_REQ and not session.block_table
    assert s.running == (0, 2) and seats_taken(s) == 3 > cfg.max_num_seqs
    assert cfg.queue_depth >= 3 and SA10 not in {i.name for i in invariants_for(cfg)}


@pytest.mark.slow
@pytest.mark.parametrize("profile", PROFILES)
def test_the_search_finds_ss4_broken_on_session_seats_k3_and_nothing_else(profile: str):
    result = search(SESSION_FINDING_MODELS[profile])
    states, edges, shortest = SEATS_COUNTS["async" if profile.endswith("async") else "sync"]
    assert result.complete and (result.num_states, result.num_edges) == (states, edges)
    assert {(v.property, len(v.path)) for v in result.violations} == {(SS4, shortest)}
    assert all(result.liveness.values())


def test_sa10_applies_to_the_session_models_with_two_batches_in_flight():
    for profile in PROFILES:
        for model in SESSION_PROFILE_MODELS[profile]:
            assert (SA10 in {i.name for i in invariants_for(model.cfg)}) == (model.cfg.queue_depth <= 2)
    assert SA10 not in {i.name for i in invariants_for(replace(SESSION_PROFILE_MODELS["vllm-0.34"][0].cfg,
                                                                   streaming_sessions=False))}


@pytest.mark.parametrize("profile", ["vllm-0.34", "vllm-0.33"])
def test_sa10_holds_and_is_reached_on_session_pressure_k2(profile: str):
    """Every reachable state of session-pressure-k2 (two seats, 3 blocks, K = 2) satisfies SA10, and
    two of them have a session preempted with deliver-mode stale output in flight (its premise)."""
    model = next(m for m in SESSION_PROFILE_MODELS[profile] if m.name.startswith("session-pressure-k2"))
    sa10 = next(i for i in invariants_for(model.cfg) if i.name == SA10)
    root = initial_state(len(model.prompts), model.cfg.num_blocks)
    seen, frontier, premise = {root}, deque([root]), 0
    while frontier:
        s = frontier.popleft()
        assert sa10.holds(s, model.cfg), s
        premise += any(q.status is Status.PREEMPTED and q.num_stale > 0 and not q.drop_stale for q in s.requests)
        for _, nxt in successors(model, s):
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    assert (len(seen), premise) == (568, 2)


def test_sa10_breaks_where_its_premise_meets_a_full_seat_count():
    """SA10 can fail: the state before session-seats-k3's last step, read as if two batches were the
    most in flight, breaks it (the session preempted with stale output, both seats taken)."""
    model = SESSION_FINDING_MODELS["vllm-0.34"]
    s = initial_state(len(model.prompts), model.cfg.num_blocks)
    for action in _shortest_path("vllm-0.34")[:-1]:
        s = step(s, model.cfg, action)
    two = replace(model.cfg, num_stages=2)
    sa10 = next(i for i in invariants_for(two) if i.name == SA10)
    assert not sa10.holds(s, two)


def test_a_trace_is_not_held_to_a_proofs_auxiliary_invariant():
    """SA10 is a fact of the models its proof runs on (a preempting call that
    fills a queue of two), not a claim about every run a trace may record:
    the trace checkers ask `invariants_for(cfg, auxiliary=False)`."""
    cfg = next(m.cfg for m in SESSION_PROFILE_MODELS["vllm-0.34"] if m.cfg.queue_depth <= 2)
    checked = {i.name for i in invariants_for(cfg, auxiliary=False)}
    assert SA10 in {i.name for i in invariants_for(cfg)} and SA10 not in checked
    assert SS4 in checked
