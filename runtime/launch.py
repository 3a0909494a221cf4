"""Choosing and starting an executor: in-process (PP = 1), K local stage
processes (torch.multiprocessing), or rank 0 of a torchrun job.

Under torchrun, every rank runs the same command; rank 0 is the driver and
ranks 1..K are the stages:

    torchrun --standalone --nproc-per-node 3 -m flightcheck.cli run --pp 2 --num-prompts 8
    # several machines: --nnodes N --node-rank R --rdzv-backend c10d --rdzv-endpoint HOST:PORT
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from .local_executor import LocalExecutor
from .pipeline import PipelineExecutor
from .stage_main import DTYPES, StageSpec, serve_stage
from .transport import make_groups
from .weights import WeightSource


def set_threads(n: int = 1) -> None:
    """One intra-op thread per process (notes: 0.3 ms vs 40 ms on 2 shared cores)."""
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


def make_executor(source: WeightSource, num_stages: int, num_blocks: int, block_size: int, *,
                  dtype: str = "float32", device: str = "cpu", num_spec_tokens: int = 0,
                  top_p: float = 1.0, processes: bool | None = None,
                  act_backend: str = "gloo", timeout_s: float = 300.0, feedback: bool = False):
    """The executor for this launch. `processes=None`: stage processes when
    K > 1 or under torchrun; in-process for K = 1. `feedback`: stage 0 takes
    running requests' tokens from the last stage (needed by async scheduling)."""
    spec = StageSpec(source, num_stages, num_blocks, block_size, dtype, device, top_p, feedback)
    if torchrun_rank() == 0:
        if not dist.is_initialized():
            dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
        return PipelineExecutor.attach(spec, act_backend=act_backend,
                                       num_spec_tokens=num_spec_tokens)
    if processes is None:
        processes = num_stages > 1
    if not processes:
        dev = "cuda" if device == "cuda" else device
        return LocalExecutor(source, num_stages, num_blocks, block_size, dtype=DTYPES[dtype],
                             num_spec_tokens=num_spec_tokens, top_p=top_p, device=dev,
                             feedback=feedback)
    return PipelineExecutor.spawn(spec, act_backend=act_backend, init_timeout=timeout_s,
                                  num_spec_tokens=num_spec_tokens)
