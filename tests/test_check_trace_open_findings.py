"""False verdicts of check-trace on vLLM 0.34.0's own traces that are found
and understood but not fixed yet, each kept as a strict xfail: the test
passes once the checker accepts the trace, and then fails until its xfail
mark is taken off (so a fix cannot go unnoticed).

None is open now. The last one (`async-noted-empty-call-replayed-after-completion`:
an empty schedule() call noted on a completion was replayed after it) is fixed
in verification/traces/asynchronous.py (`_note_empty_batches` replays the
noted calls before the event that notes them); its tests are in
tests/test_check_trace_async.py."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

TRACES = Path(__file__).parent / "data" / "vllm" / "traces-0.34"
