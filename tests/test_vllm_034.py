"""vLLM 0.34.0's real scheduler under the replay's copy of its engine
(`BatchQueueEngineV034`): inputs placed during a step's wait for output
land between that step's `schedule()` and its batch's `update_from_output`
in vLLM's own trace, in the same order as on the reference's side of the
replay (tests/test_vllm_engine_wait.py), and check-trace accepts the trace
under `vllm-0.34` and `vllm-0.34-async`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from flightcheck.verification.traces.check import check_trace
from flightcheck.vllm import ASYNC_RECORDER
from flightcheck.vllm.differential import decisions, read_trace, run_reference
from flightcheck.vllm.replay import findings

from .test_vllm_engine_wait import WORKLOAD, _order
from .vllm_support import Workers, workers

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("both_checkers")]

VERSION = "0.34.0"


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_inputs_during_waits_on_the_real_scheduler(running: Workers, tmp_path: Path, async_scheduling: bool):
    raw = {**WORKLOAD, "config": {**WORKLOAD["config"], "async_scheduling": async_scheduling}}
    trace = tmp_path / "trace.jsonl"
    result = running[VERSION].replay(raw, trace=str(trace),
                                     scheduler_cls=ASYNC_RECORDER if async_scheduling else None)
    assert result["ending"] == "done" and not findings(result), result
    assert result["inputs_during_wait"] == 2            # b's arrival and c's abort, each inside a wait
    events = read_trace(trace)
    profile = "vllm-0.34-async" if async_scheduling else "vllm-0.34"
    reference = run_reference(raw, profile).events
    assert _order(events) == _order(reference)
    assert decisions(events) == decisions(reference, block_offset=1)
    verdict = check_trace(trace).to_json()
    assert verdict["ok"] and json.loads(trace.read_text().splitlines()[0])["vllm_version"] == VERSION, verdict
