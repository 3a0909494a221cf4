"""The prefill cadence beside the features it meets (docs/request-states.md,
"Features together"): reset and pause, structured output, streaming
sessions. For each pair, a small model on which every property of both
holds by exhaustive search (pinned state counts), a search for the states
where the two features actually meet (witnesses: the rule of the pair, as
vLLM 0.33/0.34's `Scheduler.schedule` has it, shows up), and the
reference's traces of `--all-features` workloads holding both, checked.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from collections import deque
from typing import Callable

import pytest

from flightcheck.spec import Config, KvConnector
from flightcheck.spec.cadence import defers_prefills
from flightcheck.spec.state import Grammar, Pause, State, Status
from flightcheck.spec.transitions import Reset, Schedule
from flightcheck.verification.cadence_models import CADENCE_GRAMMAR_K2, CADENCE_RESET_PAUSE_K2, CADENCE_SESSIONS_K2
from flightcheck.verification.explicit.search import initial, search, successors
from flightcheck.verification.models import Model
from flightcheck.verification.traces.check import check_events
from flightcheck.verification.z3.encoding.cadence_state import refuse_unencoded_cadence
from flightcheck.vllm.differential import run_reference
from flightcheck.vllm.generate import campaign_workloads

pytestmark = pytest.mark.usefixtures("both_checkers")   # the reference's traces are checked

CADENCE_DATA = Path(__file__).parent / "data" / "vllm" / "cadence"

# The pinned state counts of the sessions pair's model.
STATES_SESSIONS, STATES_SESSIONS_ASYNC = 2515, 4920

# (before, action, after) -> the pair's rule shows on this edge
Witness = Callable[[State, object, State], bool]


def _witnesses(model: Model, wanted: dict[str, Witness], limit: int = 20_000) -> set[str]:
    """Breadth-first over `model`'s states until every witness is seen (or
    `limit` states): the names of the witnesses found."""
    seen, found = {initial(model)}, set()
    frontier = deque(seen)
    while frontier and len(found) < len(wanted) and len(seen) < limit:
        state = frontier.popleft()
        for action, nxt in successors(model, state):
            found |= {name for name, holds in wanted.items() if name not in found and holds(state, action, nxt)}
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    return found


def test_the_cadence_meets_every_feature():
    for knob in ("reset_and_pause", "structured_output", "streaming_sessions"):
        assert Config(profile="vllm-0.34", prefill_schedule_interval=2, prefix_caching=False,
                      **{knob: True}).prefill_schedule_interval == 2
    assert Config(profile="vllm-0.34", prefill_schedule_interval=2,          # the connector too (test_cadence_kv.py)
                  kv_connector=KvConnector()).prefill_schedule_interval == 2
    for model in (CADENCE_RESET_PAUSE_K2, CADENCE_GRAMMAR_K2, CADENCE_SESSIONS_K2):      # the Z3 encoding leaves the pairs to the explicit search
        with pytest.raises(ValueError, match="prefill cadence leaves out reset and pause, structured output"):
            refuse_unencoded_cadence(model)


# --- reset and pause


@pytest.mark.parametrize("profile, states", [("vllm-0.34", 2127),
                                             pytest.param("vllm-0.34-async", 5505, marks=pytest.mark.slow),
                                             pytest.param("vllm-0.33", 2127, marks=pytest.mark.slow)])
def test_cadence_with_reset_and_pause_keeps_every_property(profile: str, states: int):
    result = search(CADENCE_RESET_PAUSE_K2.under_profile(profile))
    assert result.violations == []
    assert result.num_states == states


def _paused_new_backs_up(before: State, action: object, after: State) -> bool:
    """vLLM: under PAUSED_NEW the waiting loop never looks at `waiting`, so a
    call that did not defer finds its requests not deferred: the queue
    counts as backed up (`prefill_capacity_bound`) and the hold is lifted."""
    return (isinstance(action, Schedule) and before.pause is Pause.PAUSED_NEW and not before.prefill_capacity_bound
            and after.prefill_capacity_bound and after.prefill_hold > 0 and bool(after.waiting))


def _reset_preempts_a_prefill_chunk(before: State, action: object, after: State) -> bool:
    """A reset preempts a running prefill chunk mid-prompt: it waits again
    with its hold and bound untouched, and is admitted as a fresh prefill."""
    return (isinstance(action, Reset) and action.running and before.prefill_hold > 0
            and any(before.requests[r].is_prefill_chunk and after.requests[r].status is Status.PREEMPTED
                    for r in before.running)
            and (after.prefill_hold, after.prefill_capacity_bound)
            == (before.prefill_hold, before.prefill_capacity_bound))


def test_cadence_meets_reset_and_pause():
    wanted = {"paused_new_backs_up": _paused_new_backs_up,
              "reset_preempts_a_prefill_chunk": _reset_preempts_a_prefill_chunk}
    assert _witnesses(CADENCE_RESET_PAUSE_K2, wanted) == set(wanted)


# --- structured output


@pytest.mark.parametrize("profile, states", [("vllm-0.34", 2136),
                                             pytest.param("vllm-0.34-async", 3654, marks=pytest.mark.slow),
                                             pytest.param("vllm-0.33", 2136, marks=pytest.mark.slow)])
def test_cadence_with_structured_output_keeps_every_property(profile: str, states: int):
    result = search(CADENCE_GRAMMAR_K2.under_profile(profile))
    assert result.violations == []
    assert result.num_states == states


def _release(before: State, action: object, model: Model = CADENCE_GRAMMAR_K2) -> bool:
    return isinstance(action, Schedule) and not defers_prefills(before, model.cfg)


def _grammar_queue_not_backed_up(before: State, action: object, after: State) -> bool:
    """A release call whose waiting loop skipped a request waiting for its
    grammar (`_handle_blocked_waiting_request`: `skip_request`), and only
    such requests wait: the queue does not count as backed up."""
    waiting = [after.requests[r] for r in after.waiting]
    return (_release(before, action) and bool(waiting) and not after.prefill_capacity_bound
            and all(q.status is Status.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR for q in waiting))


def _unvisited_grammar_is_deferred(before: State, action: object, after: State) -> bool:
    """A release call whose waiting loop stopped before a structured request
    whose grammar has compiled: it was never skipped, yet it is deferred
    from its arrival (`add_request` -> `_enqueue_waiting_request`), so the
    queue it alone makes does not count as backed up."""
    return (_release(before, action) and not after.prefill_capacity_bound
            and any(after.requests[r].status is Status.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
                    and after.requests[r].grammar is Grammar.READY and after.requests[r].deferred_waiting
                    for r in after.waiting))


def _held_call_skips_a_grammar(before: State, action: object, after: State) -> bool:
    """A held call passes a request still compiling its grammar (skipped, not
    a stop: vLLM skips before the cadence's `break`) and admits the one-token
    prompt behind it (one token left passes the gate)."""
    return (isinstance(action, Schedule) and defers_prefills(before, CADENCE_GRAMMAR_K2.cfg)
            and len(before.waiting) > 1 and before.requests[before.waiting[0]].grammar is Grammar.COMPILING
            and before.waiting[0] in after.waiting and any(r not in after.waiting for r in before.waiting[1:]))


def test_cadence_meets_structured_output():
    wanted = {"grammar_queue_not_backed_up": _grammar_queue_not_backed_up,
              "unvisited_grammar_is_deferred": _unvisited_grammar_is_deferred,
              "held_call_skips_a_grammar": _held_call_skips_a_grammar}
    assert _witnesses(CADENCE_GRAMMAR_K2, wanted) == set(wanted)


# --- streaming sessions


@pytest.mark.parametrize("profile, states", [("vllm-0.34", STATES_SESSIONS),
                                             pytest.param("vllm-0.34-async", STATES_SESSIONS_ASYNC,
                                                          marks=pytest.mark.slow),
                                             pytest.param("vllm-0.33", STATES_SESSIONS, marks=pytest.mark.slow)])
def test_cadence_with_streaming_sessions_keeps_every_property(profile: str, states: int):
    result = search(CADENCE_SESSIONS_K2.under_profile(profile))
    assert result.violations == []
    assert result.num_states == states


def _is_next_turn(state: State, r: int) -> bool:
    """r is a session's next turn waiting to be admitted (its input taken, its computed tokens kept)."""
    q = state.requests[r]
    return q.resumable and q.status is Status.WAITING and q.num_computed > 0


def _held_call_stops_at_a_next_turn(before: State, action: object, after: State) -> bool:
    """A held call stops at a session's next turn with more than one token
    left: admitted with its computed tokens (no prefix lookup), it is a
    prefill by the gate's own test (`num_computed_tokens < num_tokens - 1`)."""
    return (isinstance(action, Schedule) and defers_prefills(before, CADENCE_SESSIONS_K2.cfg)
            and any(_is_next_turn(before, r) and before.requests[r].num_computed < before.requests[r].num_tokens - 1
                    and r in after.kv_holding for r in before.kv_holding))


def _next_turn_restarts_the_hold(before: State, action: object, after: State) -> bool:
    """A session's next turn admitted with more than one token left carries
    a prefill (`prefill_admitted`): the hold restarts."""
    return (isinstance(action, Schedule) and any(
        _is_next_turn(before, r) and r in after.running
        and before.requests[r].num_computed < before.requests[r].num_tokens - 1 for r in before.kv_holding)
        and after.prefill_hold == CADENCE_SESSIONS_K2.cfg.prefill_schedule_interval - 1)


def _parked_session_is_not_backed_up(before: State, action: object, after: State) -> bool:
    """A release call with a session parked for input in `kv_holding_waiting`
    (deferred since its stop) and nothing else waiting: not backed up."""
    queued = after.waiting + after.kv_holding
    return (_release(before, action, CADENCE_SESSIONS_K2) and bool(after.kv_holding) and not after.prefill_capacity_bound
            and all(after.requests[r].status is Status.WAITING_FOR_STREAMING_REQ for r in queued))


def _taken_input_stays_deferred(before: State, action: object, after: State) -> bool:
    """A parked session takes its input (`_update_request_as_session`): it
    is WAITING again but stays in `deferred_waiting` until admitted."""
    return any(before.requests[r].status is Status.WAITING_FOR_STREAMING_REQ and _is_next_turn(after, r)
               and after.requests[r].deferred_waiting for r in before.kv_holding)


def test_cadence_meets_streaming_sessions():
    wanted = {"held_call_stops_at_a_next_turn": _held_call_stops_at_a_next_turn,
              "next_turn_restarts_the_hold": _next_turn_restarts_the_hold,
              "parked_session_is_not_backed_up": _parked_session_is_not_backed_up,
              "taken_input_stays_deferred": _taken_input_stays_deferred}
    assert _witnesses(CADENCE_SESSIONS_K2, wanted) == set(wanted)


def _pair_workloads(pair: str, version: str, seeds: range, count: int) -> list[dict]:
    return [w for seed in seeds for w in campaign_workloads(seed, count, features_of=version)
            if {"prefill-cadence", pair} <= set(w.get("features", ()))]


@pytest.mark.parametrize("pair", ["reset-pause", "streaming-sessions"])
def test_the_references_traces_of_the_pair_are_legal(pair: str):
    """The reference's own trace names no grammar (the bridge's recorder
    writes vLLM's grammar events), so the workloads with a grammar are left
    to the vLLM runs below. A reset beside a session that holds blocks
    raises, in vLLM and in the reference (docs/request-states.md, "Finding:
    a reset fails while a session waits for input"): RP4 flags that run."""
    workloads = [w for w in _pair_workloads(pair, "0.34.0", range(1, 4), 60) if "grammar" not in w["features"]][:2]
    assert len(workloads) == 2
    legal = 0
    for workload in workloads:
        for profile in ("vllm-0.34", "vllm-0.34-async"):
            run = run_reference(workload, profile)
            assert run.events[0]["prefill_schedule_interval"] >= 2
            result = check_events(run.events)
            if run.exception is not None:
                assert "reset" in repr(run.exception) and result.property == "RP4_prefix_cache_reset"
            else:
                assert result.ok, (workload["name"], profile)
                legal += 1
    assert legal >= 2


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("pair", ["reset-pause", "grammar", "streaming-sessions"])
@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_vllm_agrees_on_the_pair(pair: str, version: str, async_scheduling: bool) -> None:
    """The `--all-features` workloads of seeds 1 and 2 (80 each) that hold
    the cadence and `pair` (8 to 15 per release): identical to the reference
    but for named deviations, each verdict its ground truth."""
    if os.environ.get("FLIGHTCHECK_SKIP_VLLM"):
        pytest.skip("FLIGHTCHECK_SKIP_VLLM")
    from flightcheck.vllm.campaign import DISAGREEMENTS, run_version

    workloads = _pair_workloads(pair, version, range(1, 3), 80)
    assert workloads
    report = run_version(version, workloads, 0, False, lambda line: None, async_scheduling)
    assert report.workloads == len(workloads) and report.unexplained == []
    assert not set(report.verdicts) & DISAGREEMENTS, dict(report.verdict_details)


def test_a_sync_cadence_trace_notes_its_empty_calls():
    """The reference's sync trace with the cadence says it notes every empty
    `schedule()` call (`notes_empty_batches`), and must: an empty call's
    waiting loop records the capacity bound (here a LoRA-capped request
    skipped, so deferred, while the only running request's token is in
    flight), and a checker that missed it held the next call's prefill
    wrongly (`schedule_decision` at line 7; fixed in reference/trace.py)."""
    raw = json.loads((CADENCE_DATA / "034_lora_sessions_cadence_empty_call_seed2_20.workload.json").read_text())
    for profile in ("vllm-0.34", "vllm-0.33"):
        run = run_reference(raw, profile)
        assert run.ending == "done"
        assert any("empty_batches_before" in e for e in run.events)
        assert check_events(run.events).ok, profile
