"""vLLM 0.34.0 with async scheduling, drafts (K = 2) and a reused request id
(campaign `--versions 0.34.0 --async --reuse-ids --spec-tokens 2`, seeds 32
and 33): the id-reuse bug (docs/vllm-0.33-id-reuse.md, "vLLM 0.34, async
scheduling and drafts") binds an aborted request's batch to the new request
of its id, and three things on our side hid or misjudged it. Each trace
below was recorded on vLLM 0.34.0's `AsyncScheduler` (tests/data/vllm/reuse-ids/,
with its workload):

* `placeholder-assert` (seed 32 index 27): vLLM raises in
  `_update_request_with_output` (`num_output_placeholders >= 0`) after
  appending the old batch's tokens to the new r1; the recorder writes that
  completion before the exception goes on (check-trace: S7 there), and the
  reference's run with vLLM's behaviour, which raises at the same update,
  agrees up to it;
* `count-rolled-below-zero` (seed 32 index 54; 0.33.0 too): the old batch's
  two rejected drafts, rolled back on the new r2 (`update_from_output`),
  take its num_computed_tokens to -1, and its next entry starts there: a
  line the format refuses, after the completion check-trace rejects. The
  campaign reads the trace line by line as check-trace does;
* `rollback-while-waiting` (seed 33 index 4): the old batch completes while
  the new r2 still waits (vLLM 0.34 rolls back only a count above 0), then
  another rolls the scheduled r2 back under its drafts; the reference as
  released follows both (reference/update.py `_subtract_rejections`,
  reference/scheduler.py `_cached_entry`'s sampling rule);
* `chunks-bound-to-new-id` (minimised from campaign `--versions 0.34.0
  --all-features --async --reuse-ids --spec-tokens 3`, seed 49, indexes 17,
  22, 29): the aborted r1's three prefill chunks complete after the new r1
  was scheduled with its k placeholder drafts; bound to it by id they apply
  nothing but take its in-flight counter down, and the recorder writes the
  drafts the new r1 holds (`next_drafts`) on each. The reference drops
  those outputs and writes none, so the first difference names no request
  in its tokens: the differential called it unexplained until it read the
  requests of `next_drafts` too (decision_rules.py `_concerns`);
* `drift-ends-deferral-early` (campaign `--versions 0.34.0,0.33.0
  --all-features --spec-tokens 2 --reuse-ids --workloads 80 --seed 46`,
  index 58, async on both releases, kept as `...-seed46_58`; minimised with
  the reference alone, then replayed on both): the aborted r0's last
  prefill chunk, bound to the new r0 by id, takes 3 off its in-flight
  count; r2's decode then preempts the new r0 with two batches of its own
  in flight, and `_preempt_request` copies the short count into
  `num_stale_output_tokens`. The count runs out when the first of them
  returns, so the waiting loop stops deferring r0's resumption while its
  second is still out: r0 heads the queue, does not fit and stops the loop;
  the reference, counting right, still skips r0 and admits r1 behind it.
  The differential named the deferral only where vLLM was the side that
  scheduled (differential.py `_classify`);
* `reused-id-reset-stale-assert-seed52_70` (the same campaign, seed 52
  index 70, async on both releases): two resets of the running requests
  preempt the new r2 in drop mode, and the aborted r2's batch (6 tokens),
  bound to it by id, drains its stale share (2) below 0: `update_from_output`
  raises (`num_stale_output_tokens >= 0`) before the replay's ground truth
  read the counters, so it named nothing and the differential nothing
  either. The recorder now reads them when vLLM raises (recording.py). The
  trace shows that completion as dropped and stale (counted against a
  stale share), which check-trace accepted (`accepted, MISSED bug`) until it
  read `stale` for an older incarnation: the only share the older batch can
  have drained is the new r2's (verification/traces/incarnations.py), so
  the completion is rejected there, as IF2 (0.33.0's trace, kept beside it,
  the same).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flightcheck.verification.traces.check import MalformedTrace, check_events, check_trace
from flightcheck.vllm.campaign import check_verdict, verdict
from flightcheck.vllm.differential import (compare, decisions, first_difference, profile_for, read_trace,
                                           run_reference)
from flightcheck.vllm.replay import ReplayWorker

from .vllm_support import DATA, require_venv

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

REUSE = DATA / "reuse-ids"
PROFILE = profile_for("0.34.0", True)


def recorded(name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A recorded case: its workload and vLLM's trace."""
    return (json.loads((REUSE / f"034-async-drafts-{name}.workload.json").read_text()),
            read_trace(REUSE / f"034-async-drafts-{name}.jsonl"))


def vllm_result(ending: str, stale: list[tuple[str, int]]) -> dict[str, Any]:
    """What the replay said of the recorded run (the ground truth's stale
    tokens: request, batch), as far as the comparison and verdict read it."""
    return {"vllm_version": "0.34.0", "async_scheduling": True, "ending": ending, "batches_in_flight": 0,
            "ground_truth": {"stale_tokens": [{"req": req, "batch": batch, "step": 0, "why": "aborted and re-added"}
                                              for req, batch in stale]}}


def test_the_completion_vllm_raised_in_is_rejected_and_explained() -> None:
    raw, events = recorded("placeholder-assert")
    assert events[-1]["ev"] == "complete" and events[-1]["tokens"]["r1"] and "r1" not in events[-1]["dropped"]
    check = check_verdict(REUSE / "034-async-drafts-placeholder-assert.jsonl")
    assert (check["ok"], check["property"], check["line"]) == (False, "S7_output_binding", len(events))
    conforming = run_reference(raw, PROFILE, vllm_outputs=True)
    assert conforming.ending == "exception" and "placeholders below 0" in str(conforming.exception)
    comparison = compare(raw["name"], vllm_result("exception", [("r1", 6)]), events, run_reference(raw, PROFILE),
                         conforming)
    assert comparison.explained and comparison.deviation == "reused_id_output_dropped", comparison.describe()
    # without the completion vLLM raised in, nothing is rejected and nothing explained
    assert not compare(raw["name"], vllm_result("exception", [("r1", 6)]), events[:-1], run_reference(raw, PROFILE),
                       conforming).explained


def test_a_violation_before_a_line_the_format_refuses_is_the_campaign_s_verdict() -> None:
    trace = REUSE / "034-async-drafts-count-rolled-below-zero.jsonl"
    events = read_trace(trace)
    negative = next(i for i, e in enumerate(events, 1) if e["ev"] == "schedule"
                    and any(x["start"] < 0 for x in e["entries"]))
    with pytest.raises(MalformedTrace, match="start"):
        check_trace(trace)                                   # the whole-file reader refuses it first
    check = check_verdict(trace)
    assert (check["ok"], check["property"]) == (False, "S7_output_binding") and check["line"] < negative
    category, _ = verdict(vllm_result("done", [("r2", 8)]), check)
    assert category == "rejected, real bug"


def test_the_released_reference_rolls_back_as_vllm_0_34_does() -> None:
    raw, events = recorded("rollback-while-waiting")
    conforming = run_reference(raw, PROFILE, vllm_outputs=True)
    assert decisions(conforming.events, block_offset=1) == decisions(events)
    comparison = compare(raw["name"], vllm_result("done", [("r2", 5)]), events, run_reference(raw, PROFILE), conforming)
    assert comparison.explained and comparison.deviation == "reused_id_output_dropped", comparison.describe()


def test_an_older_batchs_drafts_read_off_the_new_request_are_the_id_reuse_bug() -> None:
    raw, events = recorded("chunks-bound-to-new-id")
    old_chunk = next(e for e in events if e["ev"] == "complete" and e["batch"] == 2)
    assert old_chunk["tokens"] == {"r1": []} and old_chunk["next_drafts"] == {"r1": 3}
    result = {**vllm_result("done", []), "ground_truth": {
        "in_flight_counter_mismatches": [{"step": 8, "req": "r1", "num_in_flight_tokens": 0, "in_flight": 3}],
        "negative_counters": [{"step": 10, "req": "r1", "counter": "num_in_flight_tokens", "value": -3}]}}
    comparison = compare(raw["name"], result, events, run_reference(raw, PROFILE),
                         run_reference(raw, PROFILE, vllm_outputs=True))
    assert comparison.explained and comparison.deviation == "reused_id_output_dropped", comparison.describe()
    check = check_verdict(REUSE / "034-async-drafts-chunks-bound-to-new-id.jsonl")
    assert (check["ok"], check["property"]) == (False, "IF1_in_flight_counter")
    assert verdict(result, check)[0] == "rejected, real bug"


DRIFT = "async-drafts-drift-ends-deferral-early"
DRIFT_KEPT = [f"034-{DRIFT}", f"033-{DRIFT}", f"034-{DRIFT}-seed46_58"]


def kept(stem: str) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """A kept case: its workload, what the replay said of vLLM's run, and vLLM's trace."""
    return (json.loads((REUSE / f"{stem}.workload.json").read_text()),
            json.loads((REUSE / f"{stem}.result.json").read_text()), read_trace(REUSE / f"{stem}.jsonl"))


@pytest.mark.parametrize("stem", DRIFT_KEPT)
def test_a_stale_count_cut_short_by_a_reused_id_ends_the_deferral_early(stem: str) -> None:
    raw, result, events = kept(stem)
    profile = profile_for(result["vllm_version"], True)
    ours, conforming = run_reference(raw, profile), run_reference(raw, profile, vllm_outputs=True)
    theirs, mine = decisions(events), decisions(ours.events, block_offset=1)
    assert decisions(conforming.events, block_offset=1) == theirs          # vLLM's run, event for event
    index = first_difference(theirs, mine)
    assert index is not None and theirs[index][0] == "complete"             # vLLM admits nothing
    assert mine[index][0] == "schedule" and [entry[0] for entry in mine[index][1]] == ["r1"]
    comparison = compare(raw["name"], result, events, ours, conforming)
    assert comparison.explained and comparison.deviation == "reused_id_output_dropped", comparison.describe()
    check = check_verdict(REUSE / f"{stem}.jsonl")
    assert (check["ok"], check["property"]) == (False, "IF1_in_flight_counter")
    assert verdict(result, check)[0] == "rejected, real bug"


RESET_ASSERT = "034-async-reused-id-reset-stale-assert-seed52_70"


def test_an_older_batch_that_drains_a_reset_requests_share_below_0_is_the_id_reuse_bug() -> None:
    raw, result, events = kept(RESET_ASSERT)
    assert "num_stale_output_tokens >= 0" in result["exception"]
    assert {"req": "r2", "counter": "num_stale_output_tokens", "value": -4, "step": 29} \
        in result["ground_truth"]["negative_counters"]
    conforming = run_reference(raw, PROFILE, vllm_outputs=True)
    assert conforming.ending == "exception" and "stale share below 0 (-4)" in str(conforming.exception)
    comparison = compare(raw["name"], result, events, run_reference(raw, PROFILE), conforming)
    assert comparison.explained and comparison.deviation == "reused_id_output_dropped", comparison.describe()
    truthless = {**result, "ground_truth": {}}          # what the replay said before it read the counters
    assert not compare(raw["name"], truthless, events, run_reference(raw, PROFILE), conforming).explained


RESET_ASSERT_TRACES = [REUSE / f"{release}-async-reused-id-reset-stale-assert-seed52_70.jsonl"
                       for release in ("034", "033")]


@pytest.mark.parametrize("trace", RESET_ASSERT_TRACES, ids=lambda path: path.name[:3])
def test_check_trace_rejects_the_older_batch_counted_against_the_new_requests_stale_share(trace: Path) -> None:
    _, result, _ = kept(RESET_ASSERT)
    events = read_trace(trace)
    last = events[-1]
    assert (last["ev"], last["batch"], last["dropped"], last["stale"]) == ("complete", 5, ["r2"], ["r2"])
    check = check_verdict(trace)
    assert (check["ok"], check["property"], check["line"]) == (False, "IF2_stale_counter", len(events)), check
    assert "share (2 tokens) drops to -4" in check["message"]
    assert verdict(result, check)[0] == "rejected, real bug"


def test_the_same_completion_dropped_without_a_stale_share_and_a_reset_beside_own_outputs_are_legal() -> None:
    """The converse: the older batch dropped and counted against no share
    (what a scheduler with an incarnation check writes) is legal, and so are
    vLLM's runs whose reset left a request's own outputs in flight, each
    listed in `stale` when it returned (tests/test_feature_pairs.py)."""
    events = read_trace(RESET_ASSERT_TRACES[0])
    unbound = events[:-1] + [{k: v for k, v in events[-1].items() if k != "stale"}]
    said = check_events(unbound)
    assert said.ok and said.events == len(events), said
    for name in ("034_async_priority_reset_order", "033_reset_takes_tables_again"):
        trace = DATA / "pairs" / f"{name}.jsonl"
        own = read_trace(trace)
        resets = [i for i, e in enumerate(own) if e["ev"] == "reset" and e.get("preempted")]
        assert any(e["ev"] == "complete" and e.get("stale") for e in own[resets[0]:]), name
        check = check_verdict(trace)
        assert check["ok"], check


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
def test_vllm_drains_the_reset_share_below_0_and_check_trace_rejects_it_there(version: str, tmp_path: Path) -> None:
    require_venv(version)
    raw, _, _ = kept(RESET_ASSERT)
    trace = tmp_path / "trace.jsonl"
    from flightcheck.vllm import ASYNC_RECORDER
    with ReplayWorker(version) as worker:
        replayed = worker.replay(raw, trace=str(trace), scheduler_cls=ASYNC_RECORDER)
    assert replayed["ending"] == "exception" and "num_stale_output_tokens >= 0" in replayed["exception"]
    events = read_trace(trace)
    # the update vLLM raised in wrote its complete, then `raised` (raised_recording.py): rejected at that complete
    assert events[-1]["ev"] == "raised" and events[-1]["in"] == "update_from_output", events[-1]
    assert events[-2]["ev"] == "complete"
    check = check_verdict(trace)
    assert (check["ok"], check["property"], check["line"]) == (False, "IF2_stale_counter", len(events) - 1), check
    assert verdict(replayed, check)[0] == "rejected, real bug"


@pytest.mark.vllm
@pytest.mark.slow
def test_the_recorder_reads_the_counters_vllm_moved_before_it_raised(tmp_path: Path) -> None:
    require_venv("0.34.0")
    raw, result, events = kept(RESET_ASSERT)
    trace = tmp_path / "trace.jsonl"
    from flightcheck.vllm import ASYNC_RECORDER
    with ReplayWorker("0.34.0") as worker:
        replayed = worker.replay(raw, trace=str(trace), scheduler_cls=ASYNC_RECORDER)
    assert replayed["exception"] == result["exception"]
    assert {k: v for k, v in replayed["ground_truth"].items() if v} == result["ground_truth"]
    assert decisions(read_trace(trace)) == decisions(events)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
def test_vllm_ends_the_deferral_early_on_the_minimal_workload(version: str, tmp_path: Path) -> None:
    require_venv(version)
    raw, result, events = kept(f"{version[:4].replace('.', '')}-{DRIFT}")
    trace = tmp_path / "trace.jsonl"
    from flightcheck.vllm import ASYNC_RECORDER
    with ReplayWorker(version) as worker:
        replayed = worker.replay(raw, trace=str(trace), scheduler_cls=ASYNC_RECORDER)
    assert {k: v for k, v in replayed["ground_truth"].items() if v} == result["ground_truth"]
    assert decisions(read_trace(trace)) == decisions(events)


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_0_34_raises_on_a_reused_id_s_older_batch_and_check_trace_flags_it(tmp_path: Path) -> None:
    require_venv("0.34.0")
    raw, _ = recorded("placeholder-assert")
    trace = tmp_path / "trace.jsonl"
    from flightcheck.vllm import ASYNC_RECORDER
    with ReplayWorker("0.34.0") as worker:
        result = worker.replay(raw, trace=str(trace), scheduler_cls=ASYNC_RECORDER)
    assert result["ending"] == "exception" and "num_output_placeholders >= 0" in result["exception"]
    category, detail = verdict(result, check_verdict(trace))
    assert category == "rejected, real bug" and detail.endswith("S7_output_binding"), detail
    events = read_trace(trace)
    comparison = compare(raw["name"], result, events, run_reference(raw, PROFILE),
                         run_reference(raw, PROFILE, vllm_outputs=True))
    assert comparison.explained and comparison.deviation == "reused_id_output_dropped", comparison.describe()
