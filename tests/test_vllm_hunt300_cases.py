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
* 0.34.0 async, seed 329 index 208 (`--versions 0.34.0 --all-features
  --async --spec-tokens 2 --stages 1 --reuse-ids --workloads 250`, inputs
  during waits): vLLM's "duplicate request id" (`Scheduler.add_request`),
  a miss, and the generator's error: the features moved r1's arrival and
  r2's (which reuses r1's id) to r1's abort step, whose abort comes in the
  step's wait (`abort_via`), and r2 arrived between steps, ahead of it.
  A reuse at such a step now arrives in the wait too, after the abort
  (generate.py `_reuses_after_their_aborts`). Of 32,960 workloads of seeds
  1-59, 100-112 and 300-330 (80 each, with and without drafts, inputs
  during waits, both releases' features) 4 changed, each one vLLM refused
  with that assertion before.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from flightcheck.vllm.campaign import check_verdict
from flightcheck.vllm.differential import compare, decisions, first_difference, profile_for, read_trace, run_reference
from flightcheck.vllm.generate import _reuses_after_their_aborts, campaign_workloads

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


def test_a_reuse_moved_to_an_abort_in_a_wait_arrives_in_that_wait() -> None:
    workload = campaign_workloads(329, 209, reuse_ids=True, spec_tokens=2, mid_step_inputs=True,
                                  features_of="0.34.0", stages=1)[208]
    old, new = workload["requests"][1], workload["requests"][2]
    assert (new["reuse_id"], old["abort_via"]) == ("r1", "wait")
    assert new["arrival_step"] == old["abort_step"] == old["arrival_step"] and new["arrival_via"] == "wait"


@pytest.mark.parametrize("abort_via,arrival,via", [("wait", 4, "wait"), ("wait", 5, None), (None, 4, None)])
def test_only_a_reuse_at_the_step_of_an_abort_in_a_wait_is_moved_into_it(abort_via: str | None, arrival: int,
                                                                          via: str | None) -> None:
    old = {"id": "r1", "arrival_step": 4, "abort_step": 4, **({"abort_via": abort_via} if abort_via else {})}
    new = {"id": "r2", "reuse_id": "r1", "arrival_step": arrival}
    _reuses_after_their_aborts([old, new], connector=False)
    assert (new["arrival_step"], new.get("arrival_via")) == (arrival, via)
