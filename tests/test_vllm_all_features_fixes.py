"""What `--all-features` campaigns with id reuse or forced drafts showed
(seed 32 on vLLM 0.34 with async scheduling), kept as regression tests:

* a streaming session preempted with deliver-mode stale output in flight,
  whose stale token is a stop: vLLM's `update_from_output` appends it
  (`_update_request_with_output(is_stale=True)`), `_handle_stopped_request`
  ends the turn and takes the session's next input, so the token was
  applied; the recorder wrote it `dropped` (it counted only live output as
  ending a turn), check-trace then rejected the next schedule
  (`schedule_decision`) and the differential called it `orphaned_token_kept`
  (campaign `--all-features --spec-tokens 2` seed 32 index 19, and
  `--reuse-ids` seed 32 index 56);
* a KV producer's request finished by the length cap while still waiting,
  with no blocks (an older request's output reached it by its reused id:
  `reused_id_output_dropped`): the fabricated connector held its (empty)
  table for a send, where vLLM's producers hold one only with blocks
  (NixlConnector's and MooncakeConnector's `request_finished`), as the
  reference's connector does (`--reuse-ids` seed 32 index 29);
* an async load parked in the waiting loop after a request admitted in the
  same call with its whole prompt: vLLM leaves that request out of
  `_inflight_prefills` (`num_computed_tokens + num_new_tokens <
  num_tokens` is false), so it reserves no blocks for it; the spec counted
  it by its count before the call and parked nothing (`kv_load_decision`,
  a false rejection: `--spec-tokens 2 --reuse-ids` seed 32 index 4, 0.33 and
  0.34 async);
* an older request's output bound by its reused id to a new structured
  request (vLLM's `update_from_output` looks it up by id alone): the
  bridge's grammar refuses another request's tokens, so vLLM finishes the
  new request with FINISHED_ERROR (`accept_tokens` false); the reference's
  conforming run (vLLM as released) now does too, where it said `length`
  (`--spec-tokens 2 --reuse-ids` seed 32 index 29, 0.33);
* vLLM's run ending in its `num_stale_output_tokens >= 0` assertion after
  older batches, looked up by a reused id, moved the new request's counters
  (the ground truth's counter mismatch): the differential named nothing (the
  difference is where vLLM's run ended); it now names
  `reused_id_output_dropped`, and the conforming run raises there too
  (seed 32 index 25, 0.33 and 0.34 async; a change to the differential's
  classification that any campaign with reused ids shares);
* the same assertion on 0.33.0 sync (`--versions 0.34.0,0.33.0
  --all-features --spec-tokens 2 --reuse-ids --workloads 80` seed 49 index
  46): session r0's KV load fails (fail policy) with batch 7 in flight, its
  client's next input arrives under the id as a new r0, batch 7's token
  reaches it by id and stops its one-token turn with a stale count of 2
  (`_handle_stopped_request` copies `num_in_flight_tokens`, short by batch
  7's 2), and batch 8's 4 tokens take it below 0 in the update that also
  reports the new r0's failed load. The conforming run raises in that update
  too, but vLLM's recorder writes the update's `kv_failed` before the
  completion it raised in: the differential trimmed only a completion
  (differential.py `_update_raised_in`);
* a session whose grammar failed finishes with an error before its client's
  end of session arrives, which then names a new structured request under
  its id, whose grammar fails in turn (seed 51 index 24, async on both
  releases): the reference marks it at its first `schedule()` and would
  finish it at the next `update_from_output`, but the replay's loop had
  counted the steps before the arrival as idle and ended the run `stuck`
  there (vLLM's side, whose grammar settled a step later, went on). An
  input handed over is new work now (engine.py `run_busy_loop`), as one
  handed over inside a wait already was.

The default tests read the kept traces; the slow ones replay the workloads
on vLLM 0.34.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from flightcheck.verification.traces.check import check_events
from flightcheck.vllm.differential import compare, decisions, read_trace, run_reference
from flightcheck.vllm.kv_transfers import KVTransfers
from flightcheck.vllm.kv_workload import KVConnectorConfig, KVRequestSpec
from flightcheck.vllm.recording import _turn_ended

from .vllm_support import DATA, workers

pytestmark = pytest.mark.usefixtures("both_checkers")       # checks traces: both checkers compared

HERE = DATA / "all-features"
STALE_STOP = "034_async_session_stale_stop_ends_turn"
REUSED_PRODUCER = "034_async_reused_id_finishes_waiting_producer"
REFUSED = "033_reused_id_output_refused_by_grammar"
CRASHED = "034_async_reused_id_stale_share_assert"
STALE_ASSERT_033 = "033_session_reused_id_stale_assert_beside_kv_failed"
END_AFTER_ERROR = "034_async_session_end_after_grammar_error_seed51_24"
PROFILE = "vllm-0.34-async"


def _workload(stem: str) -> dict:
    return json.loads((HERE / f"{stem}.workload.json").read_text())


def _session(status: str) -> SimpleNamespace:
    return SimpleNamespace(resumable=True, status=SimpleNamespace(name=status), is_finished=lambda: False)


def test_a_stale_output_that_ends_a_preempted_sessions_turn_counts_as_applied_unless_in_drop_mode():
    # deliver mode: vLLM appended the stale token, the stop took the next input
    assert _turn_ended(_session("WAITING"), stale_before=2, dropping_before=False)
    assert _turn_ended(_session("WAITING_FOR_STREAMING_REQ"), stale_before=2, dropping_before=False)
    # drop mode (a turn's stop, a reset): skipped before it reaches the request
    assert not _turn_ended(_session("WAITING_FOR_STREAMING_REQ"), stale_before=2, dropping_before=True)
    assert _turn_ended(_session("WAITING"), stale_before=0, dropping_before=True)       # live output
    assert not _turn_ended(_session("PREEMPTED"), stale_before=2, dropping_before=False)


def test_vllms_trace_of_the_stale_stop_is_legal_and_equals_the_reference():
    events = read_trace(HERE / f"{STALE_STOP}.jsonl")
    # batch 42's stale token (the stop) is applied: nothing of that completion is dropped
    (stop,) = [e for e in events if e["ev"] == "complete" and e.get("batch") == 42]
    assert stop["tokens"] == {"r3": [2]} and stop["stale"] == ["r3"] and "dropped" not in stop
    checked = check_events(events)
    assert checked.ok, (checked.property, checked.message)
    assert decisions(events) == decisions(run_reference(_workload(STALE_STOP), PROFILE).events, block_offset=1)


def test_a_parked_load_admitted_in_the_same_call_keeps_its_reservation():
    """vLLM adds a promoted load it admits to `_inflight_prefills` whatever its
    chunk (`request in self._parked_reservations`): r2's 4 remaining tokens
    complete its prompt, and r1's load of 20 tokens still does not fit beside
    r2's reservation (seed 32 index 9, 0.34 async)."""
    events = read_trace(HERE / "034_async_kv_drafts_admitted_parked_load_keeps_its_reservation.jsonl")
    checked = check_events(events)
    assert checked.ok, (checked.property, checked.message)


@pytest.mark.parametrize("stem", ["034_async_kv_drafts_admitted_whole_prompt_reserves_nothing",
                                  "033_async_kv_drafts_admitted_whole_prompt_reserves_nothing"])
def test_a_request_admitted_whole_in_the_same_call_reserves_nothing_for_a_later_async_load(stem: str):
    events = read_trace(HERE / f"{stem}.jsonl")
    # r0 admitted with its whole prompt (2 cached + 2), then r2's load of 20 tokens parked
    # in the 12 free blocks: 10 for it, 2 for one step of 1 + 2 drafts, none for r0
    (first,) = [e for e in events if e["ev"] == "schedule" and e.get("batch") == 1]
    assert [(e["req"], e["start"], e["n"]) for e in first["entries"]] == [("r0", 2, 2)]
    assert [(load["req"], load["start"]) for load in first["kv_loads"]] == [("r2", 20)]
    checked = check_events(events)
    assert checked.ok, (checked.property, checked.message)


def test_as_released_an_older_requests_output_refused_by_the_new_requests_grammar_finishes_it_with_an_error():
    raw = _workload(REFUSED)
    theirs = decisions(read_trace(HERE / f"{REFUSED}.jsonl"))
    assert ("finish", "r1", "error") in theirs
    conforming = decisions(run_reference(raw, "vllm-0.33", vllm_outputs=True).events, block_offset=1)
    assert conforming[:len(theirs)] == theirs           # vLLM's run stops at its assertion
    # the reference itself drops that output: the new r1 runs to its own length cap
    ours = decisions(run_reference(raw, "vllm-0.33").events, block_offset=1)
    assert ("finish", "r1", "error") not in ours and ("finish", "r1", "length") in ours


def test_vllms_assertion_after_a_reused_ids_counter_drift_is_the_id_reuse_bug():
    raw, events = _workload(CRASHED), read_trace(HERE / f"{CRASHED}.jsonl")
    result = {"vllm_version": "0.34.0", "async_scheduling": True, "ending": "exception",
              "ground_truth": {"in_flight_counter_mismatches": [{"step": 34, "req": "r2", "num_in_flight_tokens": 2,
                                                                  "in_flight": 3}]}}
    conforming = run_reference(raw, PROFILE, vllm_outputs=True)
    assert conforming.ending == "exception"             # the reference's own stale-share assertion
    comparison = compare(raw["name"], result, events, run_reference(raw, PROFILE), conforming)
    assert comparison.explained and comparison.deviation == "reused_id_output_dropped", comparison.describe()
    assert "still differs" not in comparison.describe()


def test_a_producer_holds_no_table_for_a_request_finished_without_blocks():
    transfers = KVTransfers(KVConnectorConfig(consumer=False, producer=True), block_size=4)
    transfers.bind("r1", KVRequestSpec(hit=0, send_steps=2))
    request = SimpleNamespace(request_id="r1")
    assert not transfers.finished(request, "FINISHED_LENGTH_CAPPED", [])
    assert transfers.pending() == 0
    assert transfers.finished(request, "FINISHED_LENGTH_CAPPED", [3, 4])
    assert transfers.pending() == 1


def test_the_reused_ids_waiting_producer_is_explained_by_the_id_reuse_alone():
    """vLLM applies the aborted r1's batch to the new r1, still waiting
    without blocks, which then finishes by its length cap and sends nothing;
    the reference drops that output (`reused_id_output_dropped`) and, switched
    to vLLM's binding, equals vLLM event for event."""
    raw, events = _workload(REUSED_PRODUCER), read_trace(HERE / f"{REUSED_PRODUCER}.jsonl")
    (finish,) = [e for e in events if e["ev"] == "finish" and e["req"] == "r1" and e["reason"] == "length"]
    assert not finish.get("held")
    result = {"vllm_version": "0.34.0", "async_scheduling": True, "ending": "done",
              "ground_truth": {"stale_tokens": [{"step": 14, "batch": 4, "req": "r1", "why": "aborted and re-added"}]}}
    comparison = compare(raw["name"], result, events, run_reference(raw, PROFILE),
                         run_reference(raw, PROFILE, vllm_outputs=True))
    assert comparison.explained and comparison.deviation == "reused_id_output_dropped", comparison.describe()
    assert "still differs" not in comparison.describe()


def test_vllms_raise_in_an_update_that_reported_a_failed_load_is_trimmed_whole():
    raw, events = _workload(STALE_ASSERT_033), read_trace(HERE / f"{STALE_ASSERT_033}.jsonl")
    result = json.loads((HERE / f"{STALE_ASSERT_033}.result.json").read_text())
    assert [e["ev"] for e in events[-2:]] == ["kv_failed", "complete"] and result["ending"] == "exception"
    conforming = run_reference(raw, "vllm-0.33", vllm_outputs=True)
    assert conforming.ending == "exception" and "stale share below 0" in str(conforming.exception)
    theirs = decisions(events)
    assert decisions(conforming.events, block_offset=1) == theirs[:-2]      # equal up to that update
    comparison = compare(raw["name"], result, events, run_reference(raw, "vllm-0.33"), conforming)
    assert comparison.explained and comparison.deviation == "drafts_handed_over_at_submission", \
        comparison.describe()


def test_an_arrival_after_idle_steps_is_not_a_stuck_run():
    raw, events = _workload(END_AFTER_ERROR), read_trace(HERE / f"{END_AFTER_ERROR}.jsonl")
    errors = [e for e in events if e["ev"] == "finish" and e["req"] == "r1" and e["reason"] == "error"]
    assert len(errors) == 2 and events[-1]["ev"] == "end"          # the session, then the new request
    ours = run_reference(raw, PROFILE)
    assert ours.ending == "done" and decisions(ours.events, block_offset=1) == decisions(events)


@pytest.fixture(scope="module")
def running():
    yield from workers()


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("stem", [STALE_STOP, REUSED_PRODUCER])
def test_the_kept_workloads_replay_on_vllm_to_the_kept_traces_decisions(running, tmp_path, stem: str):
    """vLLM 0.34 (async) records what the kept trace says, check-trace's
    verdict is the ground truth's, and the differential explains every
    difference (equal for the stale stop)."""
    from flightcheck.vllm import ASYNC_RECORDER
    from flightcheck.vllm.campaign import check_verdict, compare_workload, verdict

    raw, trace = _workload(stem), tmp_path / "trace.jsonl"
    result = running["0.34.0"].replay(raw, trace=str(trace), scheduler_cls=ASYNC_RECORDER)
    events = read_trace(trace)
    assert decisions(events) == decisions(read_trace(HERE / f"{stem}.jsonl"))
    comparison, _ = compare_workload(raw, result, events, PROFILE)
    assert comparison.equal or comparison.explained, comparison.describe()
    category, detail = verdict(result, check_verdict(trace))
    assert category in ("accepted, correct run", "rejected, real bug"), detail
    assert comparison.equal == (stem == STALE_STOP)


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_0_33_raises_in_the_update_that_reports_the_failed_load(running, tmp_path):
    raw, trace = _workload(STALE_ASSERT_033), tmp_path / "trace.jsonl"
    result = running["0.33.0"].replay(raw, trace=str(trace))
    kept = json.loads((HERE / f"{STALE_ASSERT_033}.result.json").read_text())
    assert result["exception"] == kept["exception"]
    assert {k: v for k, v in result["ground_truth"].items() if v} == kept["ground_truth"]
    assert decisions(read_trace(trace)) == decisions(read_trace(HERE / f"{STALE_ASSERT_033}.jsonl"))
