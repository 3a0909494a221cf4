"""Differentials with drafts that named nothing, kept as regression tests:
vLLM 0.8.x with one pipeline stage (the campaign's generator draws 2-4; an
adversarial hunt drew 1), and a reused id under 0.33's async scheduling.

* vLLM 0.8.4 at k=1 (one stage, budget 3, long-prefill threshold 2): r4's
  decode holds its draft while the budget leaves its entry 1 token and no
  draft; 0.8.x's `KVCacheManager.allocate_slots` caches the computed tokens
  less the drafts held (`num_computed_tokens + num_tokens -
  len(request.spec_token_ids)`), so r4's full first block is not cached;
  r4 is preempted and readmitted with no prefix hit (vLLM) where the
  reference, which drops unscheduled drafts, hits 2 tokens. The ground truth
  names the cause (`drafts_held_at_allocation`), and the differential called
  the first difference unexplained: it named `unscheduled_drafts_dropped`
  only for a request admitted holding drafts (`drafts_held_at_admission`).
  After it vLLM's runner samples a chunk its scheduler scheduled as partial
  (a real bug); check-trace rejects the run one event earlier, at the
  schedule whose prefix hit is smaller than the spec's (the known early
  position of held drafts on 0.8.4).

The default tests read the kept trace and vLLM's result; the slow one
replays the workload on vLLM 0.8.4.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from flightcheck.verification.traces.check import check_events
from flightcheck.verification.traces.ground_truth import expected_verdict
from flightcheck.vllm.differential import compare, decisions, read_trace, run_reference

from .vllm_support import DATA, Workers, workers

pytestmark = pytest.mark.usefixtures("both_checkers")       # checks traces: both checkers compared

HERE = DATA / "one-stage"
HELD = "084_held_draft_left_uncached"


def _kept(stem: str) -> tuple[dict, dict, list[dict]]:
    return (json.loads((HERE / f"{stem}.workload.json").read_text()),
            json.loads((HERE / f"{stem}.result.json").read_text()), read_trace(HERE / f"{stem}.jsonl"))


def test_a_draft_held_at_allocation_explains_a_smaller_prefix_hit_after_preemption():
    raw, result, events = _kept(HELD)
    assert [held["req"] for held in result["ground_truth"]["drafts_held_at_allocation"]] == ["r4"]
    assert not result["ground_truth"]["drafts_held_at_admission"]
    comparison = compare(raw["name"], result, events, run_reference(raw, "vllm-0.8.4"),
                         run_reference(raw, "vllm-0.8.4", vllm_outputs=True))
    assert comparison.explained and comparison.deviation == "unscheduled_drafts_dropped", comparison.describe()


def test_check_trace_rejects_the_run_no_later_than_the_partial_chunks_token():
    """The ground truth puts the bug at batch 5's completion (the partial
    chunk's token); check-trace rejects one event before, at batch 5's
    schedule, whose prefix hit (none) is smaller than the spec's (2 tokens):
    the spec drops unscheduled drafts and caches r4's first block. A smaller
    hit is no finding of the ground truth's (flightcheck/vllm/README.md, the
    0.8.4 false rejections of held drafts): a known early position."""
    _, result, events = _kept(HELD)
    verdict = check_events(events)
    expected = expected_verdict(result, events)
    assert expected.kind == "bug" and expected.earliest == 13 and events[13]["ev"] == "complete"
    assert not verdict.ok and verdict.property == "schedule_decision" and verdict.event_index == 12
    assert events[12]["ev"] == "schedule" and events[12]["entries"][0]["cached"] == 0


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_0_8_4_replays_the_kept_trace(running: Workers, tmp_path: Path):
    raw, kept, events = _kept(HELD)
    trace = tmp_path / "held.jsonl"
    result = running["0.8.4"].replay(raw, trace=str(trace))
    assert result["ground_truth"] == kept["ground_truth"] and decisions(read_trace(trace)) == decisions(events)


def test_an_older_batch_bound_by_a_reused_id_that_differs_only_in_drafts_is_the_id_reuse_bug():
    """vLLM 0.33 async, k=1 (campaign `--all-features --async --reuse-ids
    --spec-tokens 1` seed 92 index 4): the aborted r2's prefill batch
    completes while the new r2's batch is in flight; `update_from_output`
    binds it by id, moves the new r2's counters (below 0) and the completion
    leaves the new r2 a draft: the first difference names r2 only in the
    drafts, which the differential did not read, so it was unexplained."""
    stem = "033-async-reused-id-drafts-only"
    where = DATA / "reuse-ids"
    raw = json.loads((where / f"{stem}.workload.json").read_text())
    result = json.loads((where / f"{stem}.result.json").read_text())
    events = read_trace(where / f"{stem}.jsonl")
    comparison = compare(raw["name"], result, events, run_reference(raw, "vllm-0.33-async"),
                         run_reference(raw, "vllm-0.33-async", vllm_outputs=True))
    assert comparison.explained and comparison.deviation == "reused_id_output_dropped", comparison.describe()


def test_a_hand_off_after_the_last_completion_sets_the_drafts_a_schedule_shows():
    """vLLM 0.33 sync, one stage, k=1 (an adversarial workload: threshold 2,
    streaming sessions): r8, admitted for its session's next turn holding
    the draft handed over for its previous entry, still holds it when batch
    40 completes (`next_drafts`: 1); that step's `post_step` hands over the
    drafts proposed for batch 40 (none), after `update_from_output`, and
    vLLM schedules r8 alone at batch 41. check-trace took a hand-off only for
    a request with an entry in flight and rejected batch 41
    (`schedule_decision`, the spec scheduling r8 with its old draft); the
    spec's `hand_over_drafts` allows any count there, which the entry shows."""
    events = read_trace(HERE / "033_session_drafts_handed_over_after_completion.jsonl")
    (held,) = [e for e in events if e["ev"] == "complete" and e.get("batch") == 40]
    (taken,) = [e for e in events if e["ev"] == "schedule" and e.get("batch") == 41]
    assert held["next_drafts"] == {"r8": 1}
    assert [(x["req"], x["n"], x["drafts"]) for x in taken["entries"] if x["req"] == "r8"] == [("r8", 1, 0)]
    checked = check_events(events)
    assert checked.ok, (checked.property, checked.message, checked.event_index)


def test_drafts_handed_over_after_the_last_completion_may_preempt_with_no_entry_showing_them():
    """vLLM 0.33 sync, one stage, k=2 (an adversarial workload: priority,
    sessions, LoRA; 5 tokens of budget): r7's batch 35 completes with no
    `next_drafts`; that step's `post_step` hands it the drafts proposed for
    batch 35, and at batch 36 the slots for them find no room, so vLLM
    preempts r7 (the trace lists it, with no entry showing its drafts).
    check-trace, with r7 holding none, scheduled it and rejected the run
    (`schedule_decision`); the spec's `hand_over_drafts` allows the count
    that makes its schedule vLLM's."""
    events = read_trace(HERE / "033_drafts_handed_over_preempt_their_holder.jsonl")
    (complete,) = [e for e in events if e["ev"] == "complete" and e.get("batch") == 35]
    (preempting,) = [e for e in events if e["ev"] == "schedule" and e.get("batch") == 36]
    assert "next_drafts" not in complete and preempting["preempted"] == ["r7"]
    checked = check_events(events)
    assert checked.ok, (checked.property, checked.message, checked.event_index)


@pytest.mark.slow
@pytest.mark.vllm
def test_a_reused_ids_counter_below_zero_is_seen_when_vllm_finishes_the_request_in_that_update(running: Workers):
    """vLLM 0.33 async (campaign `--all-features --reuse-ids --spec-tokens 1`
    seed 99 index 43): the aborted r2's batch completes while the new r2,
    whose grammar failed, waits; `update_from_output` looks it up by id and
    takes its 3 tokens off the new r2's `num_in_flight_tokens` (-3), then vLLM
    finishes it with an error and drops it from `requests`. check-trace
    rejects there (IF1); the ground truth checked only the requests still in
    `requests` and called the run correct (a false rejection, by it)."""
    from flightcheck.vllm.campaign import ReplayJob, replay_workload

    raw = json.loads((DATA / "reuse-ids" / "033-async-reused-id-error-finish-counter.workload.json").read_text())
    replayed = replay_workload(running["0.33.0"], ReplayJob("0.33.0", True, 0, raw, 0))
    negative = replayed.result["ground_truth"]["negative_counters"]
    assert [(n["req"], n["counter"], n["value"]) for n in negative] == [("r2", "num_in_flight_tokens", -3)]
    assert replayed.category == "rejected, real bug", replayed.detail
