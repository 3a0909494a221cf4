"""An in-process executor: every stage in the calling process, run one after
the other at `submit` (the snapshot is copied then, like the pipeline's).
PP = 1 in production; with K stages it checks `split_into_stages` without
processes. Futures are done when returned."""

from __future__ import annotations

import time

import torch

from flightcheck.reference import ModelRunnerOutput, SchedulerOutput

from .plan import BatchPlan, BatchResult, plan_from_scheduler_output
from .stages import build_stage
from .weights import WeightSource
from .worker import StageWorker


class DoneFuture:
    def __init__(self, output: ModelRunnerOutput) -> None:
        self._output = output

    def result(self, timeout: float | None = None) -> ModelRunnerOutput:
        return self._output

    def done(self) -> bool:
        return True


def to_model_runner_output(result: BatchResult) -> ModelRunnerOutput:
    req_ids = list(result.req_ids)
    return ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)},
                             [list(t) for t in result.sampled_token_ids],
                             [list(d) for d in result.draft_token_ids])


class LocalExecutor:
    def __init__(self, source: WeightSource, num_stages: int, num_blocks: int, block_size: int,
                 *, dtype: torch.dtype = torch.float32, num_spec_tokens: int = 0,
                 top_p: float = 1.0, device: str = "cpu", on_stage_times=None) -> None:
        cfg = source.model_config()
        self.model_config = cfg
        self.num_spec_tokens = num_spec_tokens
        self.workers = [StageWorker(build_stage(cfg, source, s, num_stages, dtype, device),
                                    num_blocks, block_size, seed=source.seed, top_p=top_p,
                                    device=device) for s in range(num_stages)]
        self.on_stage_times = on_stage_times      # callback(batch_id, [(t0, t1, recv)]) for traces

    def submit(self, scheduler_output: SchedulerOutput) -> DoneFuture:
        return DoneFuture(to_model_runner_output(
            self.run_plan(plan_from_scheduler_output(scheduler_output, self.num_spec_tokens))))

    def run_plan(self, plan: BatchPlan) -> BatchResult:
        x = None
        times = []
        for worker in self.workers:
            t0 = time.time()
            x = worker.execute(plan, x)
            times.append((t0, time.time(), t0))
        assert isinstance(x, BatchResult)
        if self.on_stage_times is not None:
            self.on_stage_times(plan.batch_id, times)
        return x

    def reset(self) -> None:
        for w in self.workers:
            w.reset()

    def close(self, *, graceful: bool = True) -> None:
        """Nothing to stop: the stages run in this process."""

    def __enter__(self) -> "LocalExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
