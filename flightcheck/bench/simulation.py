"""One simulated serving benchmark: the reference Scheduler and Engine, the
SimulatedExecutor with a roofline cost model, the open-loop client, and
vLLM's metrics."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from flightcheck.reference import Engine, SchedulerConfig, make_scheduler
from flightcheck.reference.profiles import DEFAULT_PROFILE, PROFILES

from .charged_scheduler import ChargedScheduler
from .clock import VirtualClock
from .cost_model import CALIBRATED, CostParams, StageCostModel
from .gpus import get_gpu
from .metrics import DEFAULT_PERCENTILES, BenchmarkMetrics, compute_metrics
from .models import get_model
from .serving import serve
from .sim_executor import SimulatedExecutor, StageSpan
from .timed_trace import TimedTraceWriter
from .workload import Workload, WorkloadError

POLICIES = ("continue-prefill", "one-batch-per-request")
GPU_MEMORY_UTILIZATION = 0.9          # vLLM's default
ACTIVATION_RESERVE_BYTES = 1.5e9      # vLLM's profiled peak activations, roughly (docs/pipeline-facts.md §"Llama-3.1-8B on two L4s")


@dataclass(frozen=True)
class SimConfig:
    model: str = "llama-3.1-8b"
    gpu: str = "L4"
    pp: int = 2
    max_num_batched_tokens: int = 2048
    max_model_len: int = 16384
    max_num_seqs: int = 256
    block_size: int = 16
    num_blocks: int | None = None            # None: what fits next to the weights
    enable_prefix_caching: bool = False      # the seed ran --no-enable-prefix-caching
    policy: str = "continue-prefill"
    # The vLLM version the reference scheduler and engine loop model
    # (reference/profiles.py): `vllm-0.33-async` is 0.33's AsyncScheduler with
    # a K + 1 deep batch queue, `vllm-0.33` the same version scheduling
    # synchronously.
    profile: str = DEFAULT_PROFILE
    params: CostParams = CALIBRATED
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise WorkloadError(f"unknown --policy {self.policy!r}; known: {', '.join(POLICIES)}")
        if self.profile not in PROFILES:
            raise WorkloadError(f"unknown --profile {self.profile!r}; known: {', '.join(PROFILES)}")


@dataclass
class SimRun:
    config: SimConfig
    metrics: BenchmarkMetrics
    num_batches: int
    num_blocks: int
    stage_busy_s: list[float]
    wall_s: float                    # the whole simulation, real seconds
    scheduler_wall_s: float          # real seconds inside schedule() + update_from_output()
    spans: list[StageSpan] = field(default_factory=list)
    max_in_flight: int = 0           # most batches with tokens in flight at once
    num_empty_batches: int = 0       # vLLM 0.33's loop queues empty schedule() outputs too
    submissions: list[int | None] = field(default_factory=list)   # if record_spans: batch
                                     # ids in submission order, None for an empty batch

    @property
    def scheduler_share(self) -> float:
        return self.scheduler_wall_s / self.wall_s if self.wall_s > 0 else 0.0


def kv_blocks_that_fit(cost: StageCostModel, block_size: int) -> int:
    """KV blocks per stage after weights and activations, the tightest stage
    deciding (every stage holds the same blocks for its layers)."""
    gpu = cost.gpu
    fits = []
    for s in range(cost.num_stages):
        free = gpu.memory_bytes * GPU_MEMORY_UTILIZATION - cost.weight_bytes(s) - ACTIVATION_RESERVE_BYTES
        fits.append(math.floor(free / (cost.kv_bytes_per_token(s) * block_size)))
    return min(fits)


def build_cost_model(config: SimConfig) -> StageCostModel:
    if config.pp < 1:
        raise WorkloadError(f"--pp must be at least 1, got {config.pp}")
    return StageCostModel(get_model(config.model), get_gpu(config.gpu), config.pp, config.params)


def simulate(workload: Workload, config: SimConfig, trace_path: str | None = None,
             record_spans: bool = False) -> SimRun:
    wall0 = time.perf_counter()
    workload.fit_model_len(config.max_model_len)
    cost = build_cost_model(config)
    num_blocks = config.num_blocks or kv_blocks_that_fit(cost, config.block_size)
    needed = math.ceil(config.max_model_len / config.block_size)
    if num_blocks < needed:
        raise WorkloadError(
            f"{config.model} on {config.pp}x {config.gpu} leaves room for {num_blocks} KV blocks; "
            f"one request of --max-model-len {config.max_model_len} needs {needed}")
    sched_config = SchedulerConfig(
        max_num_batched_tokens=config.max_num_batched_tokens, max_num_seqs=config.max_num_seqs,
        max_model_len=config.max_model_len, block_size=config.block_size, num_blocks=num_blocks,
        num_pipeline_stages=config.pp, enable_prefix_caching=config.enable_prefix_caching,
        continue_prefill=config.policy == "continue-prefill", profile=config.profile)
    clock = VirtualClock()
    trace = TimedTraceWriter.to_path(trace_path, clock.now) if trace_path else None
    try:
        scheduler = ChargedScheduler(make_scheduler(sched_config, trace), clock, config.params)
        # Under async scheduling a batch's first stage waits for the tokens the
        # batch K submissions earlier sampled (the V2 runner's PP broadcast).
        executor = SimulatedExecutor(cost, clock, trace=trace, record_spans=record_spans,
                                     sampled_token_lag=(config.pp if sched_config.async_scheduling
                                                        else 0))
        engine = Engine(scheduler, executor)       # type: ignore[arg-type]  # a forwarding proxy
        run = serve(engine, clock, workload, client_in_s=config.params.client_in_s,
                    client_out_s=config.params.client_out_s)
        if trace is not None:
            trace.end()
    finally:
        if trace is not None:
            trace.close()
    metrics = compute_metrics(run.records, run.duration, config.percentiles)
    return SimRun(config, metrics, executor.num_batches, num_blocks, executor.busy_time,
                  time.perf_counter() - wall0, scheduler.wall_seconds, executor.spans,
                  executor.max_in_flight, executor.num_empty_batches, executor.submissions)
