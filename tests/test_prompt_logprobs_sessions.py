"""Prompt logprobs beside streaming sessions (docs/request-states.md,
"Prompt logprobs and the prefix cache" and "Features together"): a
session's prefix-cache limit across turns. vLLM 0.34's
`_update_request_as_session` recomputes `prefix_cache_hit_limit` from each
input's sampling parameters; 0.33's keeps `skip_reading_prefix_cache` as
`Request.__init__` set it from the first input. The flag counts only at a
lookup: a turn preempted and readmitted from no computed tokens.

The model prompt-logprobs-session-k2 (PL1 and SS1-SS4 hold, state counts
pinned), vLLM's traces of two workloads (the next input asks / the first
input asks) checked under their release and refused under the other, the
workload key, and the campaign drawing the pair."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from flightcheck.spec import Schedule
from flightcheck.spec.invariants import invariants_for
from flightcheck.spec.transitions import transition_properties_for
from flightcheck.verification.explicit.search import initial, search, successors
from flightcheck.verification.lora_models import LORA_MODELS, PROMPT_LOGPROBS_SESSION_K2
from flightcheck.verification.models import Model
from flightcheck.verification.traces.check import check_events
from flightcheck.vllm.differential import read_trace

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

DATA = Path(__file__).parent / "data" / "vllm" / "prompt-logprobs-sessions"
PAIR = {profile: next(m for m in models if m.name.startswith("prompt-logprobs-session-k2"))
        for profile, models in LORA_MODELS.items()}
# (states, edges) of prompt-logprobs-session-k2 under each profile.
STATE_COUNTS = {"vllm-0.34": (1086, 2238), "vllm-0.33": (1060, 2199),
                "vllm-0.34-async": (2887, 6393), "vllm-0.33-async": (2801, 6251)}


@pytest.mark.parametrize("profile", [pytest.param(p, marks=() if p == "vllm-0.34" else pytest.mark.slow)
                                     for p in STATE_COUNTS])
def test_the_pair_model_keeps_pl1_and_ss1_to_ss4(profile: str) -> None:
    model = PAIR[profile]
    names = {i.name for i in invariants_for(model.cfg)} | {p.name for p in transition_properties_for(model.cfg)}
    assert {"PL1_prompt_logprobs_read_no_cache", "SS1_old_output_never_bound", "SS2_old_turn_given_up",
            "SS3_waiting_session_holds_blocks", "SS4_waiting_session_keeps_seat"} <= names
    result = search(model)
    assert result.violations == [], [(v.property, v.message) for v in result.violations]
    assert (result.num_states, result.num_edges) == STATE_COUNTS[profile]


def _readmissions(model: Model) -> set[tuple[bool, int]]:
    """(the session's flag, its entry's start) of each schedule step that
    readmits the session in its second turn from no computed tokens."""
    root = initial(model)
    seen, todo, found = {root}, [root], set()
    while todo:
        s = todo.pop()
        for action, t in successors(model, s):
            q = s.requests[0]
            if isinstance(action, Schedule) and q.turn >= 1 and q.num_computed == 0 and 0 in s.waiting:
                found |= {(q.prompt_logprobs, e.start) for b in t.in_flight for e in b
                          if e.req == 0 and e.turn == q.turn}
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return found


def test_a_turn_that_asks_reads_nothing_cached_under_0_34_and_its_first_inputs_flag_under_0_33() -> None:
    """The session's second turn asks for prompt logprobs, its first did
    not; preempted in that turn, it looks up its whole prompt: 0.34 reads
    nothing (the input's flag), 0.33 hits the block it kept (the first
    input's). Without the 0.34 rule both would hit."""
    assert _readmissions(PAIR["vllm-0.34"]) == {(True, 0)}
    assert _readmissions(PAIR["vllm-0.33"]) == {(False, 2)}


def test_pl1_counts_a_lookup_only_not_a_next_turn_admitted_from_its_kept_blocks() -> None:
    """A session's next turn is admitted from the blocks it kept, with no
    lookup: PL1 leaves it out (stated on every admission, it would reject
    the correct spec at 5 steps)."""
    from flightcheck.spec import lora_properties

    def every_admission(before, scheduled, cfg) -> bool:      # PL1 without its lookup clause
        waiting = before.waiting_set | before.kv_holding_set
        return all(e.cached == 0 and e.start == 0 for e in scheduled.entries
                   if before.requests[e.req].prompt_logprobs and e.req in waiting)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lora_properties, "pl1_prompt_logprobs_read_no_cache", every_admission)
        result = search(PROMPT_LOGPROBS_SESSION_K2, stop_at_first=True, check_liveness=False)
    kills = [(v.property, len(v.path)) for v in result.violations if not v.message.startswith("sometimes")]
    assert kills == [("PL1_prompt_logprobs_read_no_cache", 5)], kills


# vLLM's async traces of the two workloads (recorded 2026-12-07, the replay
# worker, vLLM 0.34.0 and 0.33.0): `pl-session-a`, the next input asks;
# `pl-session-b`, the first input asks. The session is preempted in its
# second turn and readmitted from token 0 or after a 2-token hit.
READMITTED_AT = {("a", "0.34"): 0, ("a", "0.33"): 2, ("b", "0.34"): 2, ("b", "0.33"): 0}


@pytest.mark.parametrize("workload,release", sorted(READMITTED_AT))
def test_vllms_traces_are_accepted_under_their_release_and_refused_under_the_other(workload: str,
                                                                                    release: str) -> None:
    events = read_trace(DATA / f"pl-session-{workload}-{release}-async.jsonl")
    assert _readmission_start(events) == READMITTED_AT[(workload, release)]
    checked = check_events(events)
    assert checked.ok, (checked.property, checked.message)
    other = "0.33.0" if release == "0.34" else "0.34.0"
    swapped = check_events([dict(e, vllm_version=other) if e["ev"] == "config" else e for e in events])
    assert (swapped.ok, swapped.property) == (False, "schedule_decision"), swapped.message


def _readmission_start(events: list[dict]) -> int:
    """The start of the session's first entry after its preemption."""
    preempted = False
    for e in events:
        if e["ev"] == "schedule" and "entries" in e:
            starts = [x["start"] for x in e["entries"] if x["req"] == "s0"]
            if preempted and starts:
                return starts[0]
            preempted = preempted or "s0" in e.get("preempted", [])
    raise AssertionError("the session was never preempted")


def test_a_session_inputs_prompt_logprobs_key_is_read_and_checked() -> None:
    from flightcheck.vllm.inputs import session_inputs
    from flightcheck.vllm.lora_workload import asks_prompt_logprobs
    from flightcheck.vllm.workload import WorkloadError, workload_from_json

    raw = json.loads((DATA / "pl-session-a.workload.json").read_text())
    workload = workload_from_json(raw)
    session = workload.requests[0]
    assert not session.prompt_logprobs and [i.prompt_logprobs for i in session.session] == [True, False]
    assert asks_prompt_logprobs(session) and not asks_prompt_logprobs(workload.requests[1])
    updates = [spec for _, _, _, spec in session_inputs(workload, 0)]
    assert [u.prompt_logprobs for u in updates] == [True, False]       # each update its own sampling params
    raw["requests"][0]["session"]["inputs"][0]["prompt_logprobs"] = "yes"
    with pytest.raises(WorkloadError, match="prompt_logprobs"):
        workload_from_json(raw)


def test_the_campaign_draws_the_pair() -> None:
    """prompt-logprobs no longer excludes streaming-sessions: the pair meets
    in a seeded share of `--all-features` workloads with prefix caching, and
    in some a session's flag changes across turns."""
    from flightcheck.vllm.features import registered
    from flightcheck.vllm.generate import campaign_workloads

    assert "streaming-sessions" not in {f.name: f for f in registered()}["prompt-logprobs"].excludes
    met = changing = 0
    for w in campaign_workloads(5, 120, features_of="0.34.0"):
        if {"prompt-logprobs", "streaming-sessions"} <= set(w["features"]) and w["config"].get("prefix_caching", True):
            met += 1
            changing += any(bool(i.get("prompt_logprobs")) != bool(r.get("prompt_logprobs"))
                            for r in w["requests"] if r.get("session") for i in r["session"]["inputs"])
    assert met >= 10 and changing >= 3, (met, changing)       # 16 and 4 when written


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_the_workloads_replay_alike_on_vllm_and_the_reference(tmp_path, version: str, async_scheduling: bool) -> None:
    """Both workloads on vLLM's real scheduler: the reference decides
    alike, vLLM's ground truth flags nothing, check-trace accepts, and the
    session's readmission (async: it is preempted) starts where its
    release's rule says."""
    if os.environ.get("FLIGHTCHECK_SKIP_VLLM"):
        pytest.skip("FLIGHTCHECK_SKIP_VLLM")
    from flightcheck.vllm import ASYNC_RECORDER
    from flightcheck.vllm.differential import decisions, run_reference
    from flightcheck.vllm.replay import findings

    from .vllm_support import workers

    profile = ("vllm-0.34" if version == "0.34.0" else "vllm-0.33") + ("-async" if async_scheduling else "")
    running = workers()
    shared = next(running)
    try:
        for name in ("a", "b"):
            raw = json.loads((DATA / f"pl-session-{name}.workload.json").read_text())
            raw = {**raw, "config": {**raw["config"], "async_scheduling": async_scheduling}}
            trace = tmp_path / f"{name}.jsonl"
            result = shared[version].replay(raw, trace=str(trace),
                                            scheduler_cls=ASYNC_RECORDER if async_scheduling else None)
            assert result["ending"] == "done" and not findings(result), result
            events = read_trace(trace)
            assert decisions(events) == decisions(run_reference(raw, profile).events, block_offset=1)
            checked = check_events(events)
            assert checked.ok, (checked.property, checked.message)
            if async_scheduling:
                assert _readmission_start(events) == READMITTED_AT[(name, version[:4])]
    finally:
        running.close()


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["vllm-0.34", "vllm-0.33", "vllm-0.34-async", "vllm-0.33-async"])
def test_the_references_traces_of_the_workloads_are_accepted(profile: str) -> None:
    """The reference replays both workloads under each profile; check-trace
    (the spec) accepts its traces, and the async runs readmit the session
    where the release's rule says."""
    from flightcheck.vllm.differential import run_reference

    for name in ("a", "b"):
        raw = json.loads((DATA / f"pl-session-{name}.workload.json").read_text())
        raw = {**raw, "config": {**raw["config"], "async_scheduling": profile.endswith("async")}}
        run = run_reference(raw, profile)
        assert run.ending == "done"
        checked = check_events(run.events)
        assert checked.ok, (checked.property, checked.message)
        if profile.endswith("async"):
            assert _readmission_start(run.events) == READMITTED_AT[(name, profile[5:9])]
