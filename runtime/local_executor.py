"""An in-process executor: every stage in the calling process, run one after
the other at `submit` (the snapshot is copied then, like the pipeline's).
PP = 1 in production; with K stages it checks `split_into_stages` without
processes. Futures are done when returned.

`feedback=True`: stage 0 takes a running request's tokens (and drafts) from
the last stage through an in-process channel (feedback.py), not from the
snapshot; every stage before the last gets the messages (rejected drafts).
An empty batch (vLLM 0.33 queues them) runs on no stage; the ids it carries
go with the next batch."""

from __future__ import annotations

import time

import torch

from flightcheck.reference import ModelRunnerOutput, SchedulerOutput

from .feedback import LocalFeedback, SampledTokens, TokenInbox
from .plan import AllTokenIds, BatchPlan, BatchResult, PendingIds
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


def empty_output() -> ModelRunnerOutput:
    """What an empty batch returns: nothing (vLLM 0.33's `EMPTY_MODEL_RUNNER_OUTPUT`)."""
    return ModelRunnerOutput([], {}, [], [])


def to_model_runner_output(result: BatchResult) -> ModelRunnerOutput:
    req_ids = list(result.req_ids)
    return ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)},
                             [list(t) for t in result.sampled_token_ids],
                             [list(d) for d in result.draft_token_ids])


class LocalExecutor:
    def __init__(self, source: WeightSource, num_stages: int, num_blocks: int, block_size: int,
                 *, dtype: torch.dtype = torch.float32, num_spec_tokens: int = 0,
                 top_p: float = 1.0, device: str = "cpu", on_stage_times=None,
                 feedback: bool = False) -> None:
        cfg = source.model_config()
        self.model_config = cfg
        self.num_spec_tokens = num_spec_tokens
        self.workers = [StageWorker(build_stage(cfg, source, s, num_stages, dtype, device),
                                    num_blocks, block_size, seed=source.seed, top_p=top_p,
                                    device=device) for s in range(num_stages)]
        self.on_stage_times = on_stage_times      # callback(batch_id, [(t0, t1, recv)]) for traces
        self.feedback = feedback
        # Set by generate(): a resumed request's whole sequence (feedback mode).
        self.all_token_ids: AllTokenIds | None = None
        self._pending_ids = PendingIds()
        if feedback:
            # One channel to every stage but the last: stage 0 embeds the
            # tokens and drafts, every stage before the last takes rejected
            # drafts off its count (worker.py).
            channels = [LocalFeedback() for _ in self.workers[:-1]]
            for index, (worker, channel) in enumerate(zip(self.workers, channels)):
                worker.use_feedback(TokenInbox(channel, keeps_tokens=index == 0), None)

            def send_to_all(message: SampledTokens) -> None:
                for channel in channels:
                    channel.send(message)

            self.workers[-1].use_feedback(None, send_to_all)

    @property
    def inbox(self) -> TokenInbox | None:
        """Stage 0's view of the feedback (tests read its counters)."""
        return self.workers[0].inbox

    def submit(self, scheduler_output: SchedulerOutput) -> DoneFuture:
        if scheduler_output.total_num_scheduled_tokens == 0:
            self._pending_ids.hold(scheduler_output)
            return DoneFuture(empty_output())
        plan = self._pending_ids.plan(scheduler_output, self.num_spec_tokens,
                                      feedback=self.feedback, all_token_ids=self.all_token_ids)
        return DoneFuture(to_model_runner_output(self.run_plan(plan)))

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
        self._pending_ids.clear()
        for w in self.workers:
            w.reset()

    def close(self, *, graceful: bool = True) -> None:
        """Nothing to stop: the stages run in this process."""

    def __enter__(self) -> "LocalExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
