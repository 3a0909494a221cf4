"""False verdicts of check-trace on vLLM 0.34.0's own traces that are found
and understood but not fixed yet, each kept as a strict xfail: the test
passes once the checker accepts the trace, and then fails until its xfail
mark is taken off (so a fix cannot go unnoticed).

`async-noted-empty-call-replayed-after-completion` (campaign `--versions
0.34.0 --all-features --spec-tokens 1 --workloads 30 --seed 64 --no-mutants`,
async, index 15; its workload beside it; the ground truth: a correct run):
the recorder notes an empty `schedule()` call before the completion of
batch 14 (`empty_batches_before` on that `complete`), where vLLM's call
formed nothing (r1's last chunk still in flight). The async checker
replays noted calls only at the next `schedule` event
(verification/traces/asynchronous.py `_catch_up_empty_calls`), after that
completion; there r1 needs two blocks and one is free, so the spec's own
call would preempt r1 (the priority policy's victim is r1 itself), and the
schedule-step property PR3, which reads `schedule(before)`, finds r1
running and left out of the replayed empty call. Stopping the catch-up
where the spec's call would not be empty breaks the spec's own async runs
(tests/test_check_trace_async.py): the fix is to replay a noted call where
the trace notes it, before its event."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flightcheck.verification.traces.check import check_events

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

TRACES = Path(__file__).parent / "data" / "vllm" / "traces-0.34"


@pytest.mark.xfail(strict=True, reason="a noted empty call is replayed after the completion it precedes")
def test_a_noted_empty_call_before_a_completion_is_legal() -> None:
    path = TRACES / "async-noted-empty-call-replayed-after-completion.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert events[0]["vllm_version"] == "0.34.0"
    result = check_events(events)
    assert result.ok, (result.property, result.message)
