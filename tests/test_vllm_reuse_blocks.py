"""A reused id's drift seen only in the block ids of a later allocation
(campaign `--versions 0.34.0,0.33.0 --all-features --spec-tokens 2
--reuse-ids --workloads 80 --seed 301`, index 2, async on both releases;
kept in tests/data/vllm/reuse-ids/ as `03x-async-drafts-blocks-freed-elsewhere-seed301_2`).

The aborted r3's prefill chunk (batch 3), bound by id to the new r3, takes 4
off its `num_in_flight_tokens` (-4 at step 10: the ground truth's negative
counter, check-trace's IF1). At batch 16's output the new r3 stops
(`length`), and vLLM's `Scheduler.update_from_output` caches its settled
blocks, `cache_blocks(request, num_computed_tokens - num_in_flight_tokens)`:
with the count 4 short that reaches past the settled 21 tokens to all 22
known ones (`num_tokens` caps it), so the block of positions 20-21 (vLLM's
31) is hashed. `BlockPool.free_blocks` appends a hashed block to the free
queue's tail and prepends an unhashed one, so when r4 next needs a block
vLLM hands it a fresh 40 where the reference, counting right, hands it 31:
event 43, a schedule that names r4 alone. The differential named the
id-reuse deviation only where the difference concerned the drifted request,
so it called this one unexplained; it now names it where two schedules
differ in block ids alone and a differing block was a drifted request's
(flightcheck/vllm/decision_rules.py `_drifted_blocks_moved`). The reference
as released (outputs bound by id) drifts the same way and equals vLLM's
decisions throughout.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from flightcheck.vllm.campaign import check_verdict
from flightcheck.vllm.decision_rules import _drifted_blocks_moved
from flightcheck.vllm.differential import compare, decisions, first_difference, profile_for, read_trace, run_reference

from .vllm_support import DATA

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

REUSE = DATA / "reuse-ids"
RELEASES = ["0.33.0", "0.34.0"]


def _recorded(release: str) -> tuple[dict[str, Any], list[dict[str, Any]], Any]:
    stem = REUSE / f"{release[:4].replace('.', '')}-async-drafts-blocks-freed-elsewhere-seed301_2"
    trace = stem.with_suffix(".jsonl")
    return json.loads(stem.with_suffix(".workload.json").read_text()), read_trace(trace), trace


def _result(release: str, drifted: tuple[str, ...]) -> dict[str, Any]:
    """The replay's result as the comparison reads it: the ground truth's drifted counters."""
    return {"vllm_version": release, "async_scheduling": True, "ending": "done", "batches_in_flight": 0,
            "ground_truth": {
                "negative_counters": [{"step": 10, "req": req, "counter": "num_in_flight_tokens", "value": -4}
                                      for req in drifted],
                "in_flight_counter_mismatches": [{"step": 10, "req": req, "num_in_flight_tokens": -4,
                                                  "in_flight": 0} for req in drifted]}}


@pytest.mark.parametrize("release", RELEASES)
def test_blocks_a_drifted_request_freed_elsewhere_are_the_reused_id_deviation(release: str) -> None:
    raw, events, trace = _recorded(release)
    profile = profile_for(release, True)
    reference, conforming = run_reference(raw, profile), run_reference(raw, profile, vllm_outputs=True)
    ours = decisions(reference.events, block_offset=1)
    index = first_difference(decisions(events), ours)
    assert index == 43 and ours[index][1][0][0] == "r4" and ours[index][1][0][5] == (31,)
    comparison = compare(raw["name"], _result(release, ("r3",)), events, reference, conforming)
    assert comparison.explained and comparison.deviation == "reused_id_output_dropped", comparison.describe()
    # the reference as released drifts as vLLM does: the same blocks throughout
    assert first_difference(decisions(events), decisions(conforming.events, block_offset=1)) is None
    # check-trace rejects the drift itself, a real bug
    check = check_verdict(trace)
    assert (check["ok"], check["property"]) == (False, "IF1_in_flight_counter")


@pytest.mark.parametrize("drifted", [(), ("r0",)], ids=["no-drift", "drift-of-another"])
def test_the_block_difference_alone_is_not_named(drifted: tuple[str, ...]) -> None:
    """Without a drifted request, or with one that never held the block, the
    same difference stays unexplained."""
    raw, events, _ = _recorded("0.34.0")
    profile = profile_for("0.34.0", True)
    comparison = compare(raw["name"], _result("0.34.0", drifted), events, run_reference(raw, profile),
                         run_reference(raw, profile, vllm_outputs=True))
    assert not comparison.explained and comparison.deviation is None, comparison.describe()


def test_only_a_difference_in_block_ids_is_a_move() -> None:
    before = [("schedule", (("r3", 19, 3, True, 0, (31,), 4, 2),), ())]
    theirs = ("schedule", (("r4", 7, 3, True, 0, (40,), 4, 2),), ())
    assert _drifted_blocks_moved(before, theirs, ("schedule", (("r4", 7, 3, True, 0, (31,), 4, 2),), ()), {"r3"})
    # another count, another preemption, or a block no drifted request held: not a move
    assert not _drifted_blocks_moved(before, theirs, ("schedule", (("r4", 7, 2, True, 0, (31,), 4, 2),), ()), {"r3"})
    assert not _drifted_blocks_moved(before, theirs, ("schedule", (("r4", 7, 3, True, 0, (31,), 4, 2),), ("r1",)),
                                     {"r3"})
    assert not _drifted_blocks_moved(before, theirs, ("schedule", (("r4", 7, 3, True, 0, (32,), 4, 2),), ()), {"r3"})
    assert not _drifted_blocks_moved(before, theirs, ("schedule", (("r4", 7, 3, True, 0, (31,), 4, 2),), ()), set())
