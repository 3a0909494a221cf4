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
* 0.34.0 sync, seed 303 index 145 (`--versions 0.34.0 --all-features
  --stages 1 --reuse-ids --workloads 250`, inputs during waits): r3's
  grammar fails; `Scheduler.schedule`'s waiting loop keeps the error by id
  (`grammar_compile_error_reqs`); r3 is aborted in the step's wait and a new
  request arrives under its id (no grammar); at the end of the update
  `finish_requests(grammar_compile_error_reqs, FINISHED_ERROR)` finishes the
  new r3 with the old one's error. check-trace rejected that finish
  (finish_decision: the spec's r3 waits), a real bug the ground truth did
  not name: a false rejection in the campaign. The recorder now reads
  vLLM's pending grammar errors before each update and names a live request
  under such an id whose own grammar did not fail
  (ground_truth.py `_fc_check_grammar_errors`, `grammar_errors_bound_by_id`).
  The reference binds the error by id too (identical to vLLM: open).
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from flightcheck.vllm.campaign import check_verdict, verdict
from flightcheck.vllm.ground_truth import GroundTruthMixin, Observations
from flightcheck.vllm.differential import compare, decisions, first_difference, profile_for, read_trace, run_reference
from flightcheck.vllm.generate import _reuses_after_their_aborts, campaign_workloads

from .vllm_support import DATA

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

HUNT = DATA / "hunt300"
MARK_CLEARED = "084_sync_mark_cleared_then_self_preempted_seed314_42"
GRAMMAR_BY_ID = "034_sync_grammar_error_bound_by_reused_id_seed303_145"


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


class _PendingErrors(GroundTruthMixin):
    """vLLM's scheduler as far as the grammar-error check reads it."""

    def __init__(self, requests: dict[str, Any], errors: dict[str, Any]) -> None:
        self.flightcheck_step = 3
        self.flightcheck_observations = Observations()
        self.requests = requests
        self.grammar_compile_error_reqs = errors


def _request(grammar: object, finished: bool = False) -> SimpleNamespace:
    structured = None if grammar is None else SimpleNamespace(grammar=grammar)
    return SimpleNamespace(structured_output_request=structured, is_finished=lambda: finished)


@pytest.mark.parametrize("request_under_id,named", [
    (_request(None), True),                               # a new request without a grammar: the wrong one
    (_request(ValueError("bad schema")), False),          # the request whose grammar failed
    (_request(None, finished=True), False),               # finished already: finish_requests skips it
])
def test_a_pending_grammar_error_under_a_reused_id_is_named(request_under_id: SimpleNamespace, named: bool) -> None:
    pending = _PendingErrors({"r3": request_under_id}, {"r3": "Invalid structured outputs"})
    pending._fc_check_grammar_errors()
    assert pending.flightcheck_observations.grammar_errors_bound_by_id == ([{"step": 3, "req": "r3"}] if named else [])
    assert ("grammar_errors_bound_by_id" in pending.flightcheck_observations.to_json()) is named


def test_the_finish_of_a_reused_id_by_an_older_grammar_error_is_a_real_bug() -> None:
    check = check_verdict(HUNT / f"{GRAMMAR_BY_ID}.jsonl")
    assert (check["ok"], check["property"], check["line"]) == (False, "finish_decision", 15)
    result = {"vllm_version": "0.34.0", "ending": "done", "batches_in_flight": 0,
              "ground_truth": {"grammar_errors_bound_by_id": [{"step": 3, "req": "r3"}]}}
    assert verdict(result, check)[0] == "rejected, real bug"
    assert verdict({**result, "ground_truth": {}}, check)[0] == "rejected, FALSE"
