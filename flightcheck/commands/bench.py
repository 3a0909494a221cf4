"""`flightcheck bench`: the serving benchmark on the PyTorch runtime (CPU
here, GPU where present), with the simulator's workloads, open-loop client
and metrics, arrivals in wall-clock time. torch is imported only here."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from .common import (DEFAULT_REFERENCE_PROFILE, MAX_MODEL_LEN, REFERENCE_PROFILES, bad, cuda_problem, int_in,
                     kv_cache_problem, local_pp_problem, missing_dependency, pool_blocks, positive_int)
from .outputs import OutputRefused, reason
from .simulate import (add_workload_arguments, claim_outputs, print_result, trace_lost, workload_args,
                       workload_problem)


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="serving benchmark on the PyTorch pipeline runtime")
    p.add_argument("--pp", type=positive_int, default=2, help="pipeline stages (default 2)")
    p.add_argument("--model", default="tiny", help="seeded model preset of the runtime")
    p.add_argument("--checkpoint", metavar="DIR", help="local HF Llama checkpoint")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64", "bfloat16", "float16"))
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--max-num-batched-tokens", type=positive_int, default=2048)
    p.add_argument("--max-model-len", type=int_in(1, MAX_MODEL_LEN), default=4096)
    p.add_argument("--max-num-seqs", type=positive_int, default=256)
    p.add_argument("--block-size", type=int_in(1, MAX_MODEL_LEN), default=16)
    p.add_argument("--num-blocks", type=pool_blocks, default=4096, help="KV pool per stage")
    p.add_argument("--enable-prefix-caching", action="store_true")
    p.add_argument("--policy", default="continue-prefill",
                   choices=("continue-prefill", "one-batch-per-request"))
    p.add_argument("--profile", default=DEFAULT_REFERENCE_PROFILE, choices=REFERENCE_PROFILES,
                   help="the vLLM version scheduled and its engine loop (default %(default)s); "
                   "vllm-0.33-async: 0.33's AsyncScheduler, the last stage feeding sampled "
                   "tokens to stage 0")
    p.add_argument("--trace", metavar="FILE", help="write the trace (with stage events)")
    p.add_argument("--force", action="store_true",
                   help="allow more than 4 local stage processes per core")
    add_workload_arguments(p)
    p.set_defaults(func=run)


@dataclass
class BenchPlan:
    """What a bench run needs, checked before any stage starts: the workload
    of each seed, the weights, the scheduler's configuration and how a
    request is built (its prompt ids within the model's vocabulary)."""
    seeds: list[int]
    workloads: list
    source: object                     # runtime.weights.WeightSource
    sched_cfg: object                  # reference.SchedulerConfig
    build: Callable


def run(args: argparse.Namespace) -> int:
    problem = (local_pp_problem(args.pp, args.force) or cuda_problem(args.device)
               or workload_problem(args))
    if problem:
        return bad(problem)
    try:
        claimed = claim_outputs(args, ("--dataset-path", "--checkpoint"))
    except OutputRefused as err:
        return bad(str(err))
    with claimed:
        return _bench(args)


def _bench(args: argparse.Namespace) -> int:
    try:                              # the workload first: refused in a second, before torch loads
        seeds, workloads = _workloads(args)
    except ValueError as err:         # WorkloadError among them
        return bad(str(err).splitlines()[0])
    try:
        from flightcheck.runtime import launch
    except ModuleNotFoundError as err:
        return bad(missing_dependency(err, "bench") or f"flightcheck bench needs the runtime extra: {err}")
    except ImportError as err:
        return bad(f"flightcheck bench needs the runtime extra (torch): {err}")
    try:
        plan = _plan(args, seeds, workloads)
    except ValueError as err:
        return bad(str(err).splitlines()[0])
    launch.set_threads(1)
    runs = []
    for i, workload in enumerate(workloads):
        outcome = _run_one(args, plan, workload, trace_path=args.trace if i == 0 else None)
        if isinstance(outcome, int):
            return outcome
        runs.append(outcome)
    extra = {"simulator": False, "policy": args.policy, "profile": args.profile,
             "runtime_model": args.model,
             "pp": args.pp, "dataset": args.dataset, "request_rate": str(args.request_rate),
             "num_prompts": args.num_prompts, "device": args.device, "cpu_count": os.cpu_count()}
    status = print_result(args, runs, seeds, extra)
    sys.stdout.flush()
    return status


# bench sends in wall-clock time: a schedule longer than a day is refused (a
# --request-rate of 1e-300 would put the first send past the clock's range).
MAX_SEND_SECONDS = 86_400


def _workloads(args: argparse.Namespace) -> tuple[list[int], list]:
    """The seeds and each one's workload; WorkloadError (a ValueError) on bad arguments."""
    from flightcheck.bench.workload import WorkloadError
    from flightcheck.bench.workload_args import build_workload

    wargs = workload_args(args)
    seeds = list(range(args.seed, args.seed + args.seeds))
    workloads = [build_workload(wargs, s).fit_model_len(args.max_model_len) for s in seeds]
    last = max(r.send_time for w in workloads for r in w.requests)
    if not last <= MAX_SEND_SECONDS:
        raise WorkloadError(f"--request-rate {args.request_rate:g}: the last request would be sent {last:.3g} s "
                            f"after the start; bench sends in wall-clock time, within {MAX_SEND_SECONDS} s "
                            f"(a day)")
    return seeds, workloads


def _plan(args: argparse.Namespace, seeds: list[int], workloads: list) -> BenchPlan:
    """The weights and the scheduler's configuration; ValueError on bad arguments."""
    from flightcheck.bench.serving import make_request
    from flightcheck.bench.workload import WorkloadError
    from flightcheck.reference import SchedulerConfig
    from flightcheck.runtime.weights import WeightSource

    source = WeightSource(checkpoint=args.checkpoint, preset=args.model, seed=args.seed)
    model_cfg = source.model_config()
    if args.pp > model_cfg.n_layers:
        raise WorkloadError(f"--pp {args.pp} exceeds the model's {model_cfg.n_layers} layers")
    if args.max_model_len > model_cfg.max_position_embeddings:
        raise WorkloadError(f"--max-model-len {args.max_model_len} exceeds the model's "
                            f"max_position_embeddings {model_cfg.max_position_embeddings}")
    too_big = kv_cache_problem(args.num_blocks, args.block_size, model_cfg, args.dtype)
    if too_big:
        raise WorkloadError(too_big)
    sched_cfg = SchedulerConfig(
        max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len, block_size=args.block_size,
        num_blocks=args.num_blocks, num_pipeline_stages=args.pp,
        enable_prefix_caching=args.enable_prefix_caching,
        continue_prefill=args.policy == "continue-prefill", profile=args.profile)
    # Prompt ids must lie in the model's vocabulary (a seeded model's may be 512).
    build = functools.partial(make_request, vocab_size=min(model_cfg.vocab_size, 32000))
    return BenchPlan(seeds, workloads, source, sched_cfg, build)


def _run_one(args: argparse.Namespace, plan: BenchPlan, workload, trace_path: str | None):
    """One seed's workload on fresh stages: its LiveRun, or the exit code of a failed run."""
    from flightcheck.bench.live import epoch_stage_recorder, run_live
    from flightcheck.output_files import OutputLost
    from flightcheck.runtime import PipelineError, launch

    from .run import interrupted, stopped, stage_failure_line
    from .stop_signals import StopSignal, stop_signals

    holder = {}
    stop: BaseException | None = None

    def make_executor(clock, trace):
        # Async scheduling forms a decode before its token exists: the
        # stages must pass sampled tokens to stage 0 themselves (runtime/README.md).
        spec = launch.StageSpec(plan.source, args.pp, args.num_blocks, args.block_size, dtype=args.dtype,
                                device=args.device, feedback=plan.sched_cfg.async_scheduling)
        executor = launch.make_executor(spec)
        if trace is not None:
            executor.on_stage_times = epoch_stage_recorder(trace, clock)
        holder["executor"] = executor
        return executor

    try:
        with stop_signals():              # SIGTERM, SIGHUP: answered as Ctrl-C is
            live = run_live(workload, plan.sched_cfg, make_executor, trace_path=trace_path,
                            percentiles=args.metric_percentiles, build=plan.build)
    except PipelineError as err:          # a stage died or failed: the runtime names it
        print(f"flightcheck: error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 1
    except OutputLost as err:             # raised as the trace closes, once the run is over
        return trace_lost(err, "the run went on to its end, but no results are reported")
    except OSError as err:                # opening the trace: its FIFO's reader left since the check
        if trace_path is None or err.filename != trace_path:
            raise
        return bad(f"--trace {trace_path}: cannot write it ({reason(err)})")
    except (KeyboardInterrupt, StopSignal) as signalled:
        stop = signalled                  # stop the stages at once, then one line
    finally:
        if "executor" in holder and hasattr(holder["executor"], "close"):
            holder["executor"].close(graceful=stop is None)
    if isinstance(stop, StopSignal):
        return stopped(stop)
    if stop is not None:
        return interrupted()
    failure = stage_failure_line(holder.get("executor"))
    if failure is not None:               # every result came back, but a stage then died
        print(failure, file=sys.stderr)
        return 1
    return live
