"""Streaming sessions in the spec (spec/sessions.py; docs/request-states.md,
"Streaming sessions"): the lifecycle step by step, the session models proved
by exhaustive search under every profile that has sessions (state counts
pinned), the session mutants killed by the property and at the length their
registry entries record, and a configuration without sessions unchanged."""

from __future__ import annotations

import pytest

from flightcheck.spec import (Arrive, CompleteOldest, Config, Prompt, Sample, Schedule, SendInput, State, Status,
                              initial_state, invariants_for, step, transition_properties_for)
from flightcheck.spec.state import Fate, content_label
from flightcheck.verification.explicit.search import search
from flightcheck.verification.mutants import SESSION_MUTANTS
from flightcheck.verification.session_models import (SESSION_MUTANT_MODELS, SESSION_PROFILE_MODELS,
                                                     session_mutant_model)

# (states, edges) of each session model, per profile.
STATE_COUNTS = {
    "session-k2": (901, 2272), "session-pressure-k2": (568, 1229), "session-drafts-k2": (80, 245),
    "session-cache-k2": (1047, 2234),
    "session-k2@async": (2068, 5261), "session-pressure-k2@async": (1317, 2906), "session-drafts-k2@async": (131, 324),
    "session-cache-k2@async": (2845, 6497),
}


def _run(cfg: Config, prompts: tuple[Prompt, ...], actions: list) -> list[State]:
    """The states after each action, every invariant and transition property checked on the way."""
    state, states = initial_state(len(prompts), cfg.num_blocks), []
    for action in actions:
        nxt = step(state, cfg, action)
        assert nxt is not None, f"{action} is disabled"
        broken = [i.name for i in invariants_for(cfg) if not i.holds(nxt, cfg)]
        broken += [p.name for p in transition_properties_for(cfg) if not p.holds(state, nxt, action, cfg)]
        assert not broken, f"{action}: {broken}"
        state = nxt
        states.append(state)
    return states


def test_a_session_stops_with_its_old_turn_in_flight_waits_holding_blocks_and_seat_and_drops_the_old_output():
    cfg = Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=1, block_size=2, num_blocks=4,
                 max_model_len=8, prefix_caching=False, profile="vllm-0.34-async", streaming_sessions=True)
    session = Prompt(2, 2, session=((1, 2), (0, 0)))
    states = _run(cfg, (session, Prompt(1, 1)), [
        Arrive(0, session), Arrive(1, Prompt(1, 1)),
        Schedule(), Schedule(), Schedule(),         # the prefill, an empty batch, the decode ahead of its token
        CompleteOldest((Sample(stop_at=0),)),       # the prefill's token is a stop: the decode is still in flight
    ])
    stopped = states[-1]
    r0 = stopped.requests[0]
    assert r0.status is Status.WAITING_FOR_STREAMING_REQ and r0.turn == 1
    assert r0.block_table and stopped.kv_holding == (0,) and r0.num_computed == r0.num_tokens - 1
    assert r0.drop_stale and r0.num_stale == r0.num_in_flight > 0
    assert [e.fate for e in stopped.entries_of(0, fate=None)] == [Fate.SUPERSEDED]
    # r1 waits: the parked session holds the one seat (the call queues an empty batch)
    held = step(stopped, cfg, Schedule())
    assert held is not None and held.in_flight[-1] == () and held.requests[1].status is Status.WAITING
    # the next input (1 token): every output but the last sampled one is kept as prompt
    resumed = _run(cfg, (session, Prompt(1, 1)), [Arrive(0, session), Arrive(1, Prompt(1, 1)), Schedule(), Schedule(),
                                                   Schedule(), CompleteOldest((Sample(stop_at=0),)), SendInput(0),
                                                   Schedule()])[-1]
    q = resumed.requests[0]
    assert q.status is Status.RUNNING and q.prompt_len == 2 + 1 - 1 + 1 and q.num_output == 0 and q.max_tokens == 2
    old, new = resumed.entries_of(0, fate=None)
    assert (old.turn, old.fate, new.turn, new.fate) == (0, Fate.SUPERSEDED, 1, Fate.LIVE)


def test_an_input_sent_while_the_session_runs_waits_in_its_queue_and_the_end_finishes_it_at_the_stop():
    cfg = Config(num_stages=1, max_num_batched_tokens=4, max_num_seqs=1, block_size=2, num_blocks=4,
                 max_model_len=8, prefix_caching=False, profile="vllm-0.34", streaming_sessions=True)
    session = Prompt(2, 1, session=((1, 1), (0, 0)))
    states = _run(cfg, (session,), [Arrive(0, session), Schedule(), SendInput(0), SendInput(0),
                                   CompleteOldest((Sample(),)),        # stop: the queued input starts turn 1
                                   Schedule(), CompleteOldest((Sample(),))])   # its stop meets the end
    assert states[3].requests[0].queued_inputs == ((1, 1), (0, 0))
    assert states[4].requests[0].status is Status.WAITING and states[4].kv_holding == (0,)
    assert states[-1].requests[0].status is Status.FINISHED_LENGTH and states[-1].pool.free_queue


def test_without_sessions_a_resumable_prompt_is_an_ordinary_request():
    cfg = Config(prefix_caching=False, profile="vllm-0.34")
    state = step(initial_state(1, cfg.num_blocks), cfg, Arrive(0, Prompt(2, 1, session=((1, 1), (0, 0)))))
    assert state is not None and not state.requests[0].resumable
    assert step(state, cfg, SendInput(0)) is None


def test_with_prefix_caching_a_kept_output_block_keeps_the_label_it_was_cached_under_as_a_prompt_block():
    cfg = Config(num_stages=1, max_num_batched_tokens=4, max_num_seqs=1, block_size=2, num_blocks=4,
                 max_model_len=8, prefix_caching=True, profile="vllm-0.34", streaming_sessions=True)
    session = Prompt(1, 3, session=((2, 1), (0, 0)))
    states = _run(cfg, (session,), [Arrive(0, session), Schedule(), CompleteOldest((Sample(),)),
                                    Schedule(), CompleteOldest((Sample(),)),     # [p, o1] full and computed: cached
                                    Schedule(), CompleteOldest((Sample(),)),     # o3: the turn's length, a stop
                                    SendInput(0)])                               # p, o1, o2 kept, then 2 new tokens
    parked, resumed = states[-2], states[-1]
    assert parked.requests[0].status is Status.WAITING_FOR_STREAMING_REQ and parked.requests[0].num_computed == 3
    q = resumed.requests[0]
    assert q.status is Status.WAITING and q.prompt_len == 5 and q.num_output == 0 and q.prompt_labels == ()
    first = q.block_table[0]
    # the block of [p, o1] is a prompt block now, under the label it was cached under as an output block
    assert resumed.pool.labels[first] == content_label(resumed, 0, 0, cfg.block_size) == parked.pool.labels[first]
    # [o2, n1] was never full of computed tokens under its old content: nothing caches its label
    assert content_label(resumed, 0, 1, cfg.block_size) not in resumed.pool.labels
    finished = _run(cfg, (session,), [Arrive(0, session), Schedule(), CompleteOldest((Sample(),)), Schedule(),
                                      CompleteOldest((Sample(),)), Schedule(), CompleteOldest((Sample(),)),
                                      SendInput(0), Schedule(), CompleteOldest((Sample(),)), SendInput(0)])[-1]
    assert finished.requests[0].status is Status.FINISHED_ABORTED
    assert content_label(finished, 0, 1, cfg.block_size) in finished.pool.labels   # its next turn cached it


@pytest.mark.parametrize("profile", ["vllm-0.34", "vllm-0.34-async"])
def test_every_session_model_is_proved_with_its_state_count_pinned(profile: str):
    for model in SESSION_PROFILE_MODELS[profile]:
        result = search(model)
        key = model.name.split("@")[0] + ("@async" if profile.endswith("async") else "")
        assert result.ok, [(v.property, v.message) for v in result.violations]
        assert all(result.liveness.values())
        assert (result.num_states, result.num_edges) == STATE_COUNTS[key]


@pytest.mark.parametrize("name", sorted(SESSION_MUTANTS))
def test_each_session_mutant_is_killed_by_its_recorded_property_at_its_length(name: str):
    m = SESSION_MUTANTS[name]
    result = search(session_mutant_model(name), check_liveness=False)
    kills = {v.property: len(v.path) for v in result.violations}
    assert kills.get(m.killed_by) == m.shortest, kills
    # (the correct spec keeps it on that model: each is one of SESSION_PROFILE_MODELS, proved above)
    assert SESSION_MUTANT_MODELS[name] in SESSION_PROFILE_MODELS["vllm-0.34-async"]


def test_each_issue_bug_is_a_mutant_named_for_its_number():
    for number in ("52693", "52765", "42655", "5183"):
        assert any(name.endswith(number) for name in SESSION_MUTANTS)


# session-cache-k2 under the priority policy, the session of priority 1 beside
# the plain request of priority 0 (states per profile): SS5 beside prefix caching.
PRIORITY_CACHE_STATES = {"vllm-0.34": (1610, 3296), "vllm-0.34-async": (4140, 9105),
                         "vllm-0.33": (1610, 3296), "vllm-0.33-async": (4140, 9105)}


@pytest.mark.slow
@pytest.mark.parametrize("profile", sorted(PRIORITY_CACHE_STATES))
def test_with_prefix_caching_and_priorities_a_session_keeps_ss1_to_ss5(profile: str):
    from dataclasses import replace

    from flightcheck.verification.session_models import SESSION_CACHE_K2

    cfg = replace(SESSION_CACHE_K2.cfg, scheduling_policy="priority")
    prompts = (Prompt(1, 2, session=((2, 1), (0, 0)), priority=1), Prompt(2, 2, labels=(1,)))
    model = replace(SESSION_CACHE_K2, name="prio-session-cache-k2", cfg=cfg, prompts=prompts)
    result = search(replace(model.under_profile(profile), name=f"prio-session-cache-k2@{profile}"))
    assert result.ok and all(result.liveness.values()), [(v.property, v.message) for v in result.violations]
    assert (result.num_states, result.num_edges) == PRIORITY_CACHE_STATES[profile]
    assert "SS5_session_queues_in_priority_order" in {i.name for i in invariants_for(cfg)}
