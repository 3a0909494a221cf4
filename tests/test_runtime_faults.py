"""Faults: a stage process killed mid-run, and bad input."""

from __future__ import annotations

import os
import signal
import time

import pytest

torch = pytest.importorskip("torch")

from flightcheck.reference import SchedulerConfig
from flightcheck.runtime import (PipelineExecutor, RunFailed, RuntimeTraceWriter, StageSpec,
                                 WeightSource, generate)
from flightcheck.runtime.workload import mixed_workload
from flightcheck.verification.traces.check import check_trace

torch.set_num_threads(1)


def test_killing_a_stage_mid_run_raises_reaps_and_aborts_every_unfinished_request(tmp_path):
    spec = StageSpec(WeightSource(seed=2), 2, 64, 4, "float32")
    cfg = SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=8, max_model_len=128,
                          block_size=4, num_blocks=64, num_pipeline_stages=2)
    workload = mixed_workload(4, 12, max_tokens=(30, 40))
    executor = PipelineExecutor.spawn(spec)
    victim = executor.processes[0]
    killed_at: list[float] = []

    def progress(done: int, total: int, tokens: int) -> None:
        if tokens >= 20 and not killed_at:
            os.kill(victim.pid, signal.SIGKILL)
            killed_at.append(time.monotonic())

    path = tmp_path / "killed.jsonl"
    try:
        with open(path, "w") as sink:
            with pytest.raises(RunFailed) as info:
                generate(executor, cfg, workload, trace=RuntimeTraceWriter(sink), progress=progress)
        detected = time.monotonic() - killed_at[0]
    finally:
        executor.close()
    assert detected < 10.0, detected
    assert "stage" in str(info.value) or "contact" in str(info.value)
    assert all(p.exitcode is not None for p in executor.processes)   # every process reaped
    result = info.value.result
    assert result.error is not None
    unfinished = [r for r in result.requests if r.finish_reason == "abort"]
    assert unfinished and all(r.finish_reason in ("length", "abort") for r in result.requests)
    assert sum(len(r.output_token_ids) for r in result.requests) >= 20
    check = check_trace(path)                         # the aborts are legal; no `end` written
    assert check.ok, check
