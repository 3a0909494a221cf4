"""What the hunt over fresh seeds 300-330 found (campaigns of
`python -m flightcheck.vllm.campaign ... --no-mutants`, the trace and
workload of each case kept in tests/data/vllm/hunt300; the reused id's
block case of seed 301 is tests/test_vllm_reuse_blocks.py).

* 0.8.4 sync, seed 314 index 42 (`--versions 0.8.5,0.8.4 --reuse-ids
  --workloads 150`): r3 is preempted (batch 4) with its batch 3 in flight
  and admitted again (batch 5: 0.8.4's waiting loop does not read
  `scheduled_req_ids`); batch 3's completion finds r3 RUNNING and removes
  its mark (`Scheduler.update_from_output`: `scheduled_req_ids.remove`),
  though batch 5 is in flight (the ground truth: r3 missing from the set at
  step 11). The next `schedule()`'s running loop no longer skips r3, finds
  no room for it and preempts it, scheduling nothing (`batch: null`,
  `preempted: [r3]`); the reference, whose mark stays, completes batch 4
  there. The differential named the cleared mark only where vLLM's schedule
  had an entry for the request, and called this preemption unexplained; it
  now reads the schedule's preemptions too (differential.py `_classify`).
  check-trace rejects the trace (illegal_schedule), a real bug.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from flightcheck.vllm.campaign import check_verdict
from flightcheck.vllm.differential import compare, decisions, first_difference, profile_for, read_trace, run_reference

from .vllm_support import DATA

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

HUNT = DATA / "hunt300"
MARK_CLEARED = "084_sync_mark_cleared_then_self_preempted_seed314_42"


def _recorded(stem: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    return json.loads((HUNT / f"{stem}.workload.json").read_text()), read_trace(HUNT / f"{stem}.jsonl")


def _truth_084(missing: list[str]) -> dict[str, Any]:
    """vLLM 0.8.4's result as the comparison reads it: the mark the ground truth found missing."""
    return {"vllm_version": "0.8.4", "async_scheduling": False, "ending": "done", "batches_in_flight": 0,
            "ground_truth": {"in_flight_set_mismatches": [{"step": 11, "extra": [], "missing": missing}]}}


def test_a_preemption_of_a_request_whose_mark_was_cleared_is_the_named_deviation() -> None:
    raw, events = _recorded(MARK_CLEARED)
    profile = profile_for("0.8.4", False)
    reference, conforming = run_reference(raw, profile), run_reference(raw, profile, vllm_outputs=True)
    theirs = decisions(events)
    index = first_difference(theirs, decisions(reference.events, block_offset=1))
    assert index == 9 and theirs[index] == ("schedule", (), ("r3",))
    comparison = compare(raw["name"], _truth_084(["r3"]), events, reference, conforming)
    assert comparison.explained and comparison.deviation == "inflight_mark_cleared_on_preemption", \
        comparison.describe()
    # the reference as released keeps 0.8.4's mark: vLLM's decisions throughout
    assert first_difference(theirs, decisions(conforming.events, block_offset=1)) is None
    check = check_verdict(HUNT / f"{MARK_CLEARED}.jsonl")
    assert (check["ok"], check["property"]) == (False, "illegal_schedule")


@pytest.mark.parametrize("missing", [[], ["r2"]], ids=["no-mark-missing", "another-mark-missing"])
def test_the_preemption_alone_is_not_named(missing: list[str]) -> None:
    raw, events = _recorded(MARK_CLEARED)
    profile = profile_for("0.8.4", False)
    truth = _truth_084(missing)
    if not missing:
        truth["ground_truth"] = {}
    comparison = compare(raw["name"], truth, events, run_reference(raw, profile),
                         run_reference(raw, profile, vllm_outputs=True))
    assert not comparison.explained, comparison.describe()
