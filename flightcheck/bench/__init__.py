"""Serving benchmarks without torch: workloads, vLLM benchmark_serving's
metrics and report, a simulated pipeline executor on a virtual clock that
the reference scheduler and engine drive unchanged, and pictures.

    from flightcheck.bench import SimConfig, WorkloadArgs, build_workload, simulate
    run = simulate(build_workload(WorkloadArgs(), seed=0), SimConfig(policy="continue-prefill"))
    print(format_report(run.metrics.summary()))

See docs/simulator.md.
"""

from .clock import VirtualClock, WallClock
from .cost_model import CALIBRATED, CostParams, StageCostModel
from .gpus import GPUS, GpuSpec, get_gpu
from .live import LiveRun, run_live
from .metrics import BenchmarkMetrics, RequestRecord, compute_metrics, percentile
from .models import MODELS, ModelSpec, get_model
from .multiseed import aggregate, gain_points
from .report import format_report, parse_report, result_json, side_by_side
from .serving import ServingRun, serve
from .sim_executor import SimulatedExecutor, StageSpan
from .simulation import POLICIES, SimConfig, SimRun, simulate
from .timed_trace import TimedTraceWriter
from .workload import RequestSpec, Workload, WorkloadError
from .workload_args import DATASETS, WorkloadArgs, build_workload

__all__ = [
    "BenchmarkMetrics", "CALIBRATED", "CostParams", "DATASETS", "GPUS", "GpuSpec", "LiveRun",
    "MODELS", "ModelSpec", "POLICIES", "RequestRecord", "RequestSpec", "ServingRun", "SimConfig",
    "SimRun", "SimulatedExecutor", "StageCostModel", "StageSpan", "TimedTraceWriter",
    "VirtualClock", "WallClock", "Workload", "WorkloadArgs", "WorkloadError", "aggregate",
    "build_workload", "compute_metrics", "format_report", "gain_points", "get_gpu", "get_model",
    "parse_report", "percentile", "result_json", "run_live", "serve", "side_by_side", "simulate",
]
