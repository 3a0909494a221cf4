"""check-trace under the priority policy on vLLM 0.34's own traces where
the incremental checker reuses a finished request's slot: the new arrival
ranks by its own arrival, not the slot's old one (a false schedule_decision
of the incremental checker alone, found by `flightcheck vllm campaign
--all-features --versions 0.34.0 --seed 1`, index 53, sync and async; the
full checker and the streaming one accepted both)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flightcheck.verification.traces.check import check_events
from flightcheck.verification.traces.reading import read_trace_file

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

DATA = Path(__file__).parent / "data" / "vllm" / "priority"


@pytest.mark.parametrize("name", ["034_reused_slot_keeps_no_rank.jsonl", "034_async_reused_slot_keeps_no_rank.jsonl"])
@pytest.mark.parametrize("full", [False, True])
def test_a_reused_slot_arrives_anew_in_the_priority_order(name: str, full: bool) -> None:
    events = read_trace_file(DATA / name)
    result = check_events(events, None, full=full)
    assert result.ok, (result.property, result.message)
    assert len({e["req"] for e in events if e["ev"] == "arrive"}) > 3     # more requests than slots at once
