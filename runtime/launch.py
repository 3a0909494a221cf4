"""Choosing and starting an executor: in-process (PP = 1), K local stage
processes (torch.multiprocessing), or rank 0 of a torchrun job.

Under torchrun, every rank runs the same command; rank 0 is the driver and
ranks 1..K are the stages:

    torchrun --standalone --nproc-per-node 3 -m flightcheck.cli run --pp 2 --num-prompts 8
    # several machines: --nnodes N --node-rank R --rdzv-backend c10d --rdzv-endpoint HOST:PORT
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from .local_executor import LocalExecutor
from .pipeline import PipelineExecutor
from .stage_main import DTYPES, StageSpec, serve_stage
from .transport import make_groups


def set_threads(n: int = 1) -> None:
    """One intra-op thread per process (docs/pipeline-facts.md §"One thread per process": 0.3 ms vs 40 ms on 2 shared cores)."""
    torch.set_num_threads(n)


def torchrun_rank() -> int | None:
    """This process's rank under torchrun, or None when not launched by it."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ:
        return int(os.environ["RANK"])
    return None


def serve_torchrun_stage(act_backend: str = "gloo", timeout_s: float = 300.0) -> None:
    """Ranks 1..K under torchrun: serve one stage until the driver stops."""
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    serve_stage(make_groups(act_backend))


@dataclass(frozen=True)
class LaunchOptions:
    """How the stages start. `processes`: None for stage processes when
    K > 1 or under torchrun, in-process for K = 1; `act_backend`: the
    activations' collective backend; `timeout_s`: how long the process group
    waits for every rank."""
    processes: bool | None = None
    act_backend: str = "gloo"
    timeout_s: float = 300.0


def make_executor(spec: StageSpec, num_spec_tokens: int = 0, options: LaunchOptions = LaunchOptions()):
    """The executor for this launch of the stages `spec` describes (with
    `spec.feedback`, stage 0 takes running requests' tokens from the last
    stage: needed by async scheduling), proposing `num_spec_tokens` drafts a step."""
    if torchrun_rank() == 0:
        if not dist.is_initialized():
            dist.init_process_group("gloo", timeout=timedelta(seconds=options.timeout_s))
        return PipelineExecutor.attach(spec, act_backend=options.act_backend,
                                       num_spec_tokens=num_spec_tokens)
    processes = spec.num_stages > 1 if options.processes is None else options.processes
    if not processes:
        return LocalExecutor(spec.source, spec.num_stages, spec.num_blocks, spec.block_size,
                             dtype=DTYPES[spec.dtype], num_spec_tokens=num_spec_tokens, top_p=spec.top_p,
                             device=spec.device, feedback=spec.feedback)
    return PipelineExecutor.spawn(spec, act_backend=options.act_backend, init_timeout=options.timeout_s,
                                  num_spec_tokens=num_spec_tokens)
