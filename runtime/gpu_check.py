"""GPU check (a few minutes at most): the pipeline on CUDA devices.

    python -m flightcheck.runtime.gpu_check [--pp 2] [--model small]

With at least K GPUs, stage s runs on GPU s and activations go over NCCL;
with fewer, stages share the GPUs and activations go over gloo through host
memory (NCCL cannot connect two ranks on one device). Scheduling metadata
and results always travel over gloo. Checks that the K-stage greedy outputs
equal the in-process PP = 1 outputs on the same GPU (float64) and reports
throughput and the bubble fraction in float32. Exit 0 when they agree, 1
when not, 2 without a CUDA device.
"""

from __future__ import annotations

import argparse
import io
import json
import time

import torch

from flightcheck.reference import SchedulerConfig

from .generate import generate
from .launch import set_threads
from .local_executor import LocalExecutor
from .pipeline import PipelineExecutor
from .stage_main import DTYPES, StageSpec
from .trace import RuntimeTraceWriter, pipeline_stats
from .weights import WeightSource
from .workload import mixed_workload

POOL = dict(max_num_batched_tokens=256, max_num_seqs=32, max_model_len=1024, block_size=16,
            num_blocks=512)


def run_once(executor, k: int, workload) -> tuple[dict, float, dict]:
    cfg = SchedulerConfig(num_pipeline_stages=k, **POOL)
    sink = io.StringIO()
    executor.reset()
    result = generate(executor, cfg, workload, trace=RuntimeTraceWriter(sink))
    events = [json.loads(line) for line in sink.getvalue().splitlines()]
    return result.outputs(), result.seconds, pipeline_stats(events)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--model", default="small")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device")
        return 2
    set_threads(1)
    n_gpus = torch.cuda.device_count()
    backend = "nccl" if n_gpus >= args.pp else "gloo"
    print(f"{n_gpus} GPU(s): {torch.cuda.get_device_name(0)}; PP={args.pp}, activations over {backend}")
    source = WeightSource(preset=args.model, seed=0)
    workload = mixed_workload(0, 32, prompt_lens=(32, 512), max_tokens=(32, 64))
    ok = True
    for dtype in ("float64", "float32"):
        t = time.time()
        local = LocalExecutor(source, 1, POOL["num_blocks"], POOL["block_size"],
                              dtype=DTYPES[dtype], device="cuda")
        want, s1, _ = run_once(local, 1, workload)
        spec = StageSpec(source, args.pp, POOL["num_blocks"], POOL["block_size"], dtype, "cuda")
        with PipelineExecutor.spawn(spec, act_backend=backend) as pipe:
            got, sk, stats = run_once(pipe, args.pp, workload)
        tokens = sum(len(v) for v in got.values())
        same = got == want
        ok &= same or dtype != "float64"
        print(f"{dtype}: PP=1 {s1:.2f} s ({tokens / s1:.0f} tok/s), PP={args.pp} {sk:.2f} s "
              f"({tokens / sk:.0f} tok/s), bubble {stats['bubble_fraction']:.3f}, "
              f"outputs {'identical' if same else 'DIFFER'} ({time.time() - t:.1f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
