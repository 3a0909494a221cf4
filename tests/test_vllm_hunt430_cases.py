"""What the hunt over seeds 424-430, releases alone and the connector, found
(campaigns of `python -m flightcheck.vllm.campaign ... --reuse-ids --jobs 1
--no-mutants`, one seed a campaign; the trace, workload and replay result of
each case kept in tests/data/vllm/hunt430 as 07x_<seed>_..., x the release's
minor: 074 for 0.34.0).

* A check-trace miss of KV7, 0.34.0 sync: seed 429 index 44 (`--versions
  0.34.0 --kv-connector --stages 3 --no-mid-step-inputs`; a consumer and
  producer under the recompute policy, prefix caching on). r0 (prefix `p`,
  24 tokens) loads 24 tokens synchronously in batch 1 and is aborted while
  the batch is in flight; r1 loads in the same batch. The batch's output
  reports both failures (`kv_failed` r0 from block 2, then r1 from block
  0): vLLM 0.34.0 `Scheduler.update_from_output` hands the output's whole
  `invalid_block_ids` to `_handle_invalid_blocks`, which finds no request
  holding r0's block 3 and, under the recompute policy, leaves it cached.
  r4, sharing the prefix, takes blocks 1-3 as a prefix hit and is
  scheduled at 24 on block 3 (step 9): the ground truth's
  `kv_computed_on_invalid_kv` (vLLM #37827, finding 7's stale hit after an
  aborted loader). check-trace marked block 3 invalid at r0's report
  (`mark_finished_load_invalid`), then judged r1's report as the output's
  joint step from the state before the output, which had no mark: the mark
  was lost and the read accepted. The output now carries the finished
  loads' failures into each joint step (verification/traces/connector.py
  `KvOutput.with_finished_marks`).
* A false rejection, a spec error, 0.34.0 sync: seed 424 index 89
  (`--versions 0.33.0,0.34.0 --kv-connector --stages 2
  --no-mid-step-inputs`, an audit at 260 workloads; recompute policy,
  prefix caching). r0's sync load of block 1 fails from block 0 while r1
  and r3, parked for async loads, both hold block 1 as a prefix hit. 0.34.0
  `_update_requests_with_invalid_blocks` scans the parked loads with one
  set of marks: r1, first, marks block 1 and is cut to 0; r3's only invalid
  block is marked, so it keeps its 19 tokens (its load failed all the
  same), and its own failure later cuts it to 8 with its blocks [1, 5, 6]
  kept (`_update_waiting_for_remote_kv` caches them). The spec cut every
  parked holder (r3 to 0), so at promotion it freed r3's blocks and
  allocated them again in another order: a false S9_kv_ownership at line
  29. spec/kv_reports.py `_cut_parked_holders` now applies the marks
  (reference/kv_transfer.py `_invalid_block_holders` already did).
* A reading of the ground truth that came too late, 0.33.0 async: seed 426
  index 48 (`--versions 0.33.0 --async --spec-tokens 2 --lookahead
  --stages 2`, an aborted request's id reused). The older r1's batch 3
  completes under the newer r1's name and moves its in-flight counter
  (check-trace: IF1_in_flight_counter at that `complete`, line 18; the
  ground truth: `in_flight_counter_mismatches` at step 8, the same event);
  the stale token follows at batch 4. `expected_verdict` placed the
  rejection at the stale token alone (the audit's "rejected before the
  first bug"); a counter gone wrong began before vLLM shows it, so with one
  recorded the rejection may fall anywhere up to the first exact event
  (verification/traces/ground_truth.py).
* The same reading, 0.8.4 sync: seed 425 index 47 (`--versions 0.8.5,0.8.4
  --stages 4`). r4 is preempted with batch 5 in flight and admitted again
  (batch 7); batch 5's stale completion takes r4 out of
  `scheduled_req_ids` (the ground truth's `in_flight_set_mismatches`,
  missing r4, step 17), and the next `schedule()`, r4 no longer gated,
  finds no block for it and preempts it with batch 7 in flight
  (check-trace: illegal_schedule there, line 21). `expected_verdict` looked
  for the next call that schedules r4 (line 39); it now takes one that
  preempts it too.
* The same reading, 0.34.0 sync: seed 428 index 170 (`--versions
  0.34.0,0.33.0 --kv-connector --spec-tokens 2 --lookahead --stages 2`;
  0.33.0 alike). r4's sync load fails from block 0 with its sampling entry
  (batch 2) in flight; the rollback supersedes that entry, and batch 3
  samples r4 from 0. The ground truth names a double sample at that
  schedule, but the entry in flight is superseded (its token is to be
  dropped): the bug is that 0.34.0 applies it at batch 2's completion
  (`kv_superseded_tokens`), where check-trace rejects S7_output_binding.
  `expected_verdict` now skips a double sample whose entry in flight a
  rollback superseded.
* A suspected false rejection that is vLLM's, 0.34.0 sync: seed 425 index
  64 (`--versions 0.34.0,0.33.0 --kv-connector --stages 3 --spec-tokens 3
  --reuse-ids`, fail policy; 0.33.0 alike). With batches 1 and 2 in
  flight, the engine hands r0's drafts for batch 2 to the scheduler at
  submission (`drafts_handed_over_at_submission`, EngineCore.post_step), so
  0.34.0 `Scheduler.schedule` takes r0 first, for 3 draft tokens on top of
  its sampling entry in flight; `allocate_slots` finds no free block,
  `_request_blocks_can_be_freed` refuses to preempt r2 (in flight, the
  connector defers frees) and the running loop breaks: nothing is formed,
  and r2's last two prompt tokens wait. Without those drafts the same call
  schedules r2 for 2 (a replay with r0's `spec_token_ids` cleared at that
  call), as the spec does: check-trace's Eb_complete_only_when_needed at
  line 9 is right. The ground truth named only the later double sample
  (step 17), so `expected_verdict` placed the rejection there; the recorder
  now keeps the attempt (`double_sample_attempts`, flightcheck/vllm/
  ground_truth.py: a running request left out because its allocation,
  drafts counted in, failed while its sampling entry is in flight), and a
  rejection may begin at its step (verification/traces/ground_truth.py).
* Also named in the audit and left as they are: stuck runs that
  check-trace's L2 rejects a few events before `end`, where vLLM has
  already stopped scheduling (expected at `end`).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flightcheck.verification.traces.check import check_events
from flightcheck.verification.traces.ground_truth import expected_verdict
from flightcheck.vllm.differential import read_trace
from flightcheck.vllm.replay import findings

from .vllm_support import DATA, KeptCase, Workers, replay_kept_workload, workers

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

HUNT = DATA / "hunt430"
ABORTED_LOADER = KeptCase(HUNT / "074_429_sync_aborted_loaders_invalid_block_kept_past_a_second_failure_seed429_44")
MISSING_ID = KeptCase(HUNT / "070_425_084_sync_missing_in_flight_id_preempted_at_the_next_call_seed425_47")
SUPERSEDED = KeptCase(HUNT / "074_428_sync_sampling_again_after_a_rollback_superseded_the_entry_in_flight_seed428_170")
SECOND_SHARER = KeptCase(HUNT / "074_424_sync_second_parked_sharer_keeps_its_tokens_seed424_89")
BLOCKED_BY_DRAFTS = KeptCase(HUNT / "075_425_sync_drafts_handed_over_at_submission_block_the_running_loop_seed425_64")
COUNTER_FIRST = KeptCase(HUNT / "073_426_async_reused_id_counter_drifts_before_the_stale_token_seed426_48")


def _failures_swapped(events: list[dict]) -> list[dict]:
    """The trace with its one output's two `kv_failed` events in the other order."""
    at = [i for i, e in enumerate(events) if e["ev"] == "kv_failed"]
    assert len(at) == 2 and at[1] == at[0] + 1
    swapped = list(events)
    swapped[at[0]], swapped[at[1]] = events[at[1]], events[at[0]]
    return swapped


def test_the_aborted_loaders_failure_comes_first_in_an_output_of_two() -> None:
    events = read_trace(ABORTED_LOADER.trace)
    assert (events[0]["vllm_version"], events[0]["kv_connector"]["load_failure_policy"]) == ("0.34.0", "recompute")
    failed = [(e["req"], e["from_block"], e["of"], e["step"]) for e in events if e["ev"] == "kv_failed"]
    assert failed == [("r0", 2, 2, 4), ("r1", 0, 2, 4)]
    aborted = next(i for i, e in enumerate(events) if e["ev"] == "finish" and e["req"] == "r0")
    assert events[aborted]["reason"] == "abort" and aborted < next(i for i, e in enumerate(events)
                                                                   if e["ev"] == "kv_failed")
    truth = ABORTED_LOADER.result()["ground_truth"]["kv_computed_on_invalid_kv"]
    assert truth == [{"step": 9, "req": "r4", "start": 24, "blocks": [3], "reported": [3]}]


@pytest.mark.parametrize("order", ["as written", "swapped"])
def test_check_trace_rejects_the_read_of_the_aborted_loaders_block_in_either_order(order: str) -> None:
    events = read_trace(ABORTED_LOADER.trace)
    events = events if order == "as written" else _failures_swapped(events)
    verdict = check_events(events)
    assert not verdict.ok and verdict.property == "KV7_no_compute_on_invalid_kv", verdict.to_json()
    rejected = events[verdict.event_index]
    assert (rejected["ev"], rejected["step"], rejected["batch"]) == ("schedule", 9, 3)
    assert "[3]" in verdict.message
    assert expected_verdict(ABORTED_LOADER.result(), events).agrees(verdict)


def test_a_second_parked_sharer_of_a_marked_block_keeps_its_tokens_and_the_run_is_accepted() -> None:
    events = read_trace(SECOND_SHARER.trace)
    assert SECOND_SHARER.result()["ground_truth"].get("kv_computed_on_invalid_kv", []) == []
    assert SECOND_SHARER.result()["ending"] == "done" and not findings(SECOND_SHARER.result())
    loads = next(e for e in events if e["ev"] == "schedule")["kv_loads"]
    assert [(x["req"], x["block_ids"][0]) for x in loads] == [("r1", 1), ("r3", 1)]      # both hit block 1
    failed = [(e["req"], e["from_block"], e["computed"], e.get("holders")) for e in events if e["ev"] == "kv_failed"]
    assert failed == [("r0", 0, 0, [{"req": "r1", "computed": 0}]), ("r1", 0, 0, None), ("r3", 1, 8, None)]
    promoted = next(e for e in events if e["ev"] == "schedule" and e["entries"] and e["entries"][0]["req"] == "r3")
    assert (promoted["entries"][0]["start"], promoted["entries"][0]["block_ids"]) == (8, [1, 5, 6])
    verdict = check_events(events)
    assert verdict.ok, verdict.to_json()


def test_the_reused_ids_counter_drift_is_rejected_where_the_ground_truth_shows_it() -> None:
    events = read_trace(COUNTER_FIRST.trace)
    truth = COUNTER_FIRST.result()["ground_truth"]
    verdict = check_events(events)
    assert not verdict.ok and verdict.property == "IF1_in_flight_counter"
    rejected = events[verdict.event_index]
    assert (rejected["ev"], rejected["batch"], rejected["step"]) == ("complete", 3, 8)
    assert [m["step"] for m in truth["in_flight_counter_mismatches"]] == [8]
    stale = next(i for i, e in enumerate(events) if e["ev"] == "complete" and e["batch"] == 4)
    assert [s["batch"] for s in truth["stale_tokens"]] == [4] and verdict.event_index < stale
    expected = expected_verdict(COUNTER_FIRST.result(), events)
    assert (expected.kind, expected.earliest, expected.latest) == ("bug", None, stale)
    assert expected.agrees(verdict)


def test_a_missing_in_flight_id_shows_at_the_call_that_preempts_the_request() -> None:
    events = read_trace(MISSING_ID.trace)
    truth = MISSING_ID.result()["ground_truth"]
    assert truth["in_flight_set_mismatches"] == [{"step": 17, "extra": [], "missing": ["r4"]}]
    verdict = check_events(events)
    assert not verdict.ok and verdict.property == "illegal_schedule"
    rejected = events[verdict.event_index]
    assert (rejected["ev"], rejected["batch"], rejected["preempted"], rejected["step"]) == ("schedule", None, ["r4"], 18)
    stale = events[verdict.event_index - 1]
    assert (stale["ev"], stale["batch"], stale["tokens"]) == ("complete", 5, {"r4": []})
    expected = expected_verdict(MISSING_ID.result(), events)
    assert (expected.kind, expected.earliest, expected.latest) == ("bug", verdict.event_index, verdict.event_index)


def test_sampling_again_after_a_rollback_is_no_double_sample_the_superseded_token_is_the_bug() -> None:
    events = read_trace(SUPERSEDED.trace)
    truth = SUPERSEDED.result()["ground_truth"]
    assert truth["double_samples"][0] == {"step": 4, "batch": 3, "req": "r4", "in_flight": 2}
    assert truth["kv_superseded_tokens"][0] == {"step": 5, "req": "r4", "batch": 2}
    failed = next(e for e in events if e["ev"] == "kv_failed")
    assert (failed["req"], failed["from_block"]) == ("r4", 0)
    verdict = check_events(events)
    assert not verdict.ok and verdict.property == "S7_output_binding"
    rejected = events[verdict.event_index]
    assert (rejected["ev"], rejected["batch"], rejected["tokens"]) == ("complete", 2, {"r4": [650]})
    expected = expected_verdict(SUPERSEDED.result(), events)
    assert (expected.kind, expected.earliest, expected.latest) == ("bug", verdict.event_index, verdict.event_index)
    # without the superseded token the double sample is the first bug, at its schedule
    alone = {**SUPERSEDED.result(), "ground_truth": {**truth, "kv_superseded_tokens": []}}
    assert expected_verdict(alone, events).latest == verdict.event_index - 1


STALE = {"stale_tokens": [{"batch": 2, "step": 5}]}


@pytest.mark.parametrize("findings, earliest", [
    (STALE, 5),                                                                  # the stale token alone: there
    ({**STALE, "in_flight_counter_mismatches": [{"step": 2, "req": "r1"}]}, None),  # a counter first: up to it
    ({**STALE, "negative_counters": [{"step": 2, "req": "r1"}]}, None),
    ({**STALE, "placeholder_mismatches": [{"step": 2, "req": "r1"}]}, None),       # placeholders: a state too
    ({"stale_tokens": [], "kv_superseded_tokens": [{"batch": 2, "step": 5}]}, 5),  # a rollback's token: there
])
def test_a_state_gone_wrong_lets_the_rejection_come_before_the_first_exact_event(findings: dict,
                                                                                earliest: int | None) -> None:
    events = [{"ev": "config"}] + [{"ev": "schedule", "batch": b, "step": b} for b in (1, 2)] + \
        [{"ev": "complete", "batch": 1, "step": 3}, {"ev": "schedule", "batch": 3, "step": 4},
         {"ev": "complete", "batch": 2, "step": 5}, {"ev": "end"}]
    truth = {"partial_chunk_tokens": [], "in_flight_set_mismatches": [], **findings}
    expected = expected_verdict({"ground_truth": truth, "ending": "done"}, events)
    assert (expected.kind, expected.earliest, expected.latest) == ("bug", earliest, 5)


# --- on vLLM itself (slow): the kept workload, the differential and check-trace together


def test_drafts_handed_over_at_submission_leave_the_call_empty_and_the_rejection_may_begin_there() -> None:
    events = read_trace(BLOCKED_BY_DRAFTS.trace)
    second = next(e for e in events if e["ev"] == "schedule" and e["batch"] == 2)
    assert [(x["req"], x["start"], x["n"], x["samples"]) for x in second["entries"]] == \
        [("r0", 12, 3, True), ("r2", 16, 1, False)]          # r2: 2 of its 19 prompt tokens left
    failed = next(e for e in events if e["ev"] == "kv_failed")
    assert [(x["ev"], x["step"]) for x in failed["empty_batches_before"]] == [("schedule", 3)]   # nothing formed
    verdict = check_events(events)
    assert not verdict.ok and verdict.property == "Eb_complete_only_when_needed", verdict.to_json()
    rejected = events[verdict.event_index]
    assert (verdict.event_index, rejected["ev"], rejected["batch"]) == (8, "complete", 1)
    truth = BLOCKED_BY_DRAFTS.result()["ground_truth"]
    assert [d["step"] for d in truth["double_samples"]] == [17]
    assert [(a["step"], a["batch"], a["req"], a["in_flight"]) for a in truth["double_sample_attempts"]] == \
        [(3, None, "r0", 2)]
    expected = expected_verdict(BLOCKED_BY_DRAFTS.result(), events)
    assert (expected.kind, expected.earliest) == ("bug", 5) and expected.agrees(verdict)   # from kv_failed's step 3
    unrecorded = {**BLOCKED_BY_DRAFTS.result(), "ground_truth": {**truth, "double_sample_attempts": []}}
    assert not expected_verdict(unrecorded, events).agrees(verdict)       # the double sample's call alone: too early


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


# Each kept case replayed on vLLM: (case, release, async, the ground truth's
# keys that must come back equal, the campaign's category, the property
# check-trace names; None where it accepts).
REPLAYS = {
    "aborted_loaders_invalid_block": (ABORTED_LOADER, "0.34.0", False, ("kv_computed_on_invalid_kv",),
                                      "rejected, real bug", "KV7_no_compute_on_invalid_kv"),
    "missing_in_flight_id": (MISSING_ID, "0.8.4", False, ("in_flight_set_mismatches",),
                             "rejected, real bug", "illegal_schedule"),
    "superseded_token": (SUPERSEDED, "0.34.0", False, ("kv_superseded_tokens",),
                         "rejected, real bug", "S7_output_binding"),
    "second_parked_sharer": (SECOND_SHARER, "0.34.0", False, (), "accepted, correct run", None),
    "reused_id_counter": (COUNTER_FIRST, "0.33.0", True, ("in_flight_counter_mismatches",),
                          "rejected, real bug", "IF1_in_flight_counter"),
    "blocked_by_handed_over_drafts": (BLOCKED_BY_DRAFTS, "0.34.0", False, ("double_samples", "double_sample_attempts"),
                                      "rejected, real bug", "Eb_complete_only_when_needed"),
}


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("name", sorted(REPLAYS))
def test_vllm_replays_each_kept_case_the_same_and_the_campaign_judges_it_again(running: Workers, name: str) -> None:
    case, version, asynchronous, truth_keys, category, prop = REPLAYS[name]
    replayed = replay_kept_workload(running[version], case, version, asynchronous=asynchronous)
    assert replayed.result["batches"] == case.result()["batches"]
    for key in truth_keys:
        assert replayed.result["ground_truth"][key] == case.result()["ground_truth"][key]
    assert replayed.category == category, replayed.detail
    assert prop is None or prop in replayed.detail, replayed.detail
