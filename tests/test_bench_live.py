"""The wall-clock seam `flightcheck bench` uses: any Executor, same loop and
metrics as the simulator."""

from __future__ import annotations

from flightcheck.bench.live import run_live
from flightcheck.bench.workload import RequestSpec, Workload
from flightcheck.reference import SchedulerConfig, ScriptedExecutor


def test_run_live_drives_a_real_executor_in_wall_time(tmp_path):
    workload = Workload("t", tuple(RequestSpec(f"r{i}", 40, 5, send_time=0.01 * i)
                                   for i in range(4)))
    config = SchedulerConfig(max_num_batched_tokens=32, num_blocks=64, max_model_len=128,
                             num_pipeline_stages=2)
    trace = tmp_path / "live.jsonl"
    run = run_live(workload, config, lambda clock, tr: ScriptedExecutor(), trace_path=str(trace))
    s = run.metrics.summary()
    assert s["completed"] == 4 and s["total_output_tokens"] == 20
    assert s["mean_ttft_ms"] >= 0 and run.metrics.duration >= 0.03
    first = trace.read_text().splitlines()[0]
    assert '"ev":"config"' in first and '"t":' in first
