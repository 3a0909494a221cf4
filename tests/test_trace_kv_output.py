"""check-trace on one output's several `kv_failed` events (docs/trace-format.md,
"kv_failed"; the model: docs/kv-connector.md, "One output, several
failures"): vLLM 0.34's trace of `campaign --all-features --seed 2`, index
191, where one output reports r0's invalid block (a prefix block r3 holds
through its hit) and r3's own, in either order, with and without `of`, and
with a counter vLLM did not leave."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flightcheck.verification.traces.check import check_events

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

TRACE = Path(__file__).parent / "data" / "kv" / "vllm" / "034_joint_failures_loader_and_sharer.jsonl"
R0, R3 = 6, 7          # the indexes of r0's and r3's kv_failed (lines 7 and 8)


def events(swap: bool = False, of: bool = False, **r0_fields) -> list[dict]:
    evs = [json.loads(line) for line in TRACE.read_text().splitlines()]
    assert [evs[i]["ev"] for i in (R0, R3)] == ["kv_failed"] * 2 and evs[R0]["req"] == "r0"
    evs[R0].update(r0_fields)
    if of:
        evs[R0]["of"] = evs[R3]["of"] = 2
    if swap:
        evs[R0], evs[R3] = evs[R3], evs[R0]
    return evs


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("of", [False, True])
def test_an_outputs_failures_are_judged_together(swap, of):
    result = check_events(events(swap, of))
    assert result.ok, result.message


def test_a_counter_vllm_did_not_leave_is_rejected_at_its_event():
    result = check_events(events(computed=6))
    assert (result.ok, result.event_index, result.property) == (False, R0, "KV3_rollback_restores_counters")


def test_with_of_the_counters_are_checked_once_the_output_is_read():
    result = check_events(events(of=True, computed=6))
    assert (result.ok, result.event_index, result.property) == (False, R3, "KV3_rollback_restores_counters")
    assert "r0" in result.message


def test_a_second_failure_of_one_load_is_read_after_the_first():
    evs = events()
    evs[R3] = dict(evs[R0])          # r0's load, rolled back by the first, names no load in flight
    result = check_events(evs)
    assert (result.ok, result.event_index, result.property) == (False, R3, "C2_reports_own_blocks")
