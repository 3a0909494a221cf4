"""`flightcheck simulate`: a serving benchmark on the simulator (the reference
scheduler and engine, a simulated pipeline on a virtual clock)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from .common import (DEFAULT_REFERENCE_PROFILE, MAX_MODEL_LEN, MAX_PROMPTS, MAX_SEED, REFERENCE_PROFILES, bad,
                     int_in, max_pool_blocks, pool_blocks, positive_int, real, seed_int)
from .outputs import Claim, Output, claim, reason, write_failed

MAX_SIMULATED_STAGES = 1024
MAX_SEEDS = 10_000

positive_float = real(0.0, low_open=True)                     # finite and > 0
rate = real(0.0, low_open=True, allow_inf=True)              # > 0, or inf: all at once


def percentile_list(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}") from None
    if any(not 0 < p < 100 for p in values):
        raise argparse.ArgumentTypeError(f"percentiles must be in (0, 100), got {text}")
    return values


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """Dataset and arrival options, shared with `flightcheck bench`."""
    parser.add_argument("--dataset", default="burstgpt", choices=("burstgpt", "sharegpt", "random"))
    parser.add_argument("--dataset-path", help="BurstGPT CSV or ShareGPT JSON; without it "
                        "--dataset burstgpt uses the synthetic BurstGPT-like generator")
    parser.add_argument("--num-prompts", type=int_in(1, MAX_PROMPTS), default=150)
    parser.add_argument("--request-rate", type=rate, default=2.0,
                        help="requests per second, or inf (default 2)")
    parser.add_argument("--burstiness", type=positive_float, default=1.0,
                        help="gamma shape of the gaps: 1 = Poisson (default)")
    parser.add_argument("--random-input-len", type=positive_int, default=1024)
    parser.add_argument("--random-output-len", type=positive_int, default=128)
    parser.add_argument("--random-range-ratio", type=real(0.0, 1.0, high_open=True), default=0.0)
    parser.add_argument("--sharegpt-output-len", type=positive_int)
    parser.add_argument("--seed", type=seed_int, default=0, help="first workload seed (default 0)")
    parser.add_argument("--seeds", type=int_in(1, MAX_SEEDS), default=1,
                        help="run seeds SEED..SEED+N-1 and report each metric's median and spread")
    parser.add_argument("--metric-percentiles", type=percentile_list, default=(99.0,),
                        help="comma-separated, default 99")
    parser.add_argument("--json", action="store_true", help="print vLLM-style result JSON")
    parser.add_argument("--save-result", metavar="FILE", help="also write the result JSON here")


def add_parser(sub) -> None:
    p = sub.add_parser("simulate", help="simulate a serving benchmark on a pipelined model")
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--gpu", default="L4")
    p.add_argument("--pp", type=int_in(1, MAX_SIMULATED_STAGES), default=2,
                   help="pipeline stages (default 2)")
    p.add_argument("--max-num-batched-tokens", type=positive_int, default=2048)
    p.add_argument("--max-model-len", type=int_in(1, MAX_MODEL_LEN), default=16384)
    p.add_argument("--max-num-seqs", type=positive_int, default=256)
    p.add_argument("--block-size", type=int_in(1, MAX_MODEL_LEN), default=16)
    p.add_argument("--num-blocks", type=pool_blocks, help="KV blocks (default: what fits)")
    p.add_argument("--enable-prefix-caching", action="store_true",
                   help="off by default, as in the seed PR's run")
    p.add_argument("--policy", default="continue-prefill",
                   choices=("continue-prefill", "one-batch-per-request"))
    p.add_argument("--profile", default=DEFAULT_REFERENCE_PROFILE, choices=REFERENCE_PROFILES,
                   help="the vLLM version scheduled and its engine loop (default %(default)s); "
                   "vllm-0.33-async: 0.33's AsyncScheduler, batch queue K + 1, decodes K steps apart")
    p.add_argument("--eta-compute", type=positive_float,
                   help="override the calibrated compute efficiency (what-if)")
    p.add_argument("--eta-memory", type=positive_float,
                   help="override the calibrated memory-bandwidth efficiency (what-if)")
    p.add_argument("--trace", metavar="FILE", help="write the run's trace (first seed) with "
                   "stage events; `flightcheck plot FILE` draws it")
    add_workload_arguments(p)
    p.set_defaults(func=run)


def workload_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments `simulate` and `bench` share, found
    before any work starts (None if nothing)."""
    if args.seed + args.seeds - 1 > MAX_SEED:
        return f"--seed {args.seed} with --seeds {args.seeds} goes past the largest seed, {MAX_SEED}"
    return None


def claim_outputs(args: argparse.Namespace, inputs: tuple[str, ...]) -> Claim:
    """`--trace` (written as the run goes) and `--save-result` (written whole
    at the end), checked against the input flags `inputs` and each other;
    OutputRefused (exit 2) before any work."""
    return claim([Output("--trace", args.trace, grows=True), Output("--save-result", args.save_result)],
                 [(flag, getattr(args, flag[2:].replace("-", "_"))) for flag in inputs])


def trace_lost(err: OSError, work: str) -> int:
    """The growing trace failed mid-run (output_files.OutputLost): one line, exit 1."""
    kept = getattr(err, "kept", 0)
    return write_failed("--trace", err.filename, err, f"its first {kept} lines were written, each "
                        f"complete, and the rest is lost; {work}")


def _refuse_a_default_pool_past_the_limit(config: Any) -> None:
    """Without --num-blocks the pool is what fits the GPUs; a small model on
    many large GPUs with a small --block-size fits more blocks than the
    scheduler may build (common.max_pool_blocks): refused, not built for minutes."""
    from flightcheck.bench.simulation import build_cost_model, kv_blocks_that_fit
    from flightcheck.bench.workload import WorkloadError

    if config.num_blocks is not None:
        return
    fits = kv_blocks_that_fit(build_cost_model(config), config.block_size)
    if fits > max_pool_blocks():
        raise WorkloadError(f"--num-blocks: {config.model} on {config.pp}x {config.gpu} fits {fits} KV blocks of "
                            f"{config.block_size} tokens, more than the {max_pool_blocks()} the scheduler builds "
                            f"(docs/limits.md); give --num-blocks or a larger --block-size")


def workload_args(args: argparse.Namespace):
    from flightcheck.bench.workload_args import WorkloadArgs
    return WorkloadArgs(
        dataset=args.dataset, dataset_path=args.dataset_path, num_prompts=args.num_prompts,
        request_rate=args.request_rate, burstiness=args.burstiness,
        random_input_len=args.random_input_len, random_output_len=args.random_output_len,
        random_range_ratio=args.random_range_ratio, sharegpt_output_len=args.sharegpt_output_len,
        max_model_len=getattr(args, "max_model_len", 16384))


def print_result(args: argparse.Namespace, runs: list[Any], seeds: list[int],
                 doc_extra: dict[str, Any]) -> int:
    """Report block (or JSON) of one run, or of the median over seeds; 1 if
    --save-result could not be written (said in one line), else 0."""
    from flightcheck.bench.metrics import percentile_key
    from flightcheck.bench.multiseed import aggregate, multiseed_json
    from flightcheck.bench.report import format_report, result_json

    metrics = [r.metrics for r in runs]
    if len(runs) == 1:
        doc = result_json(metrics[0], seed=seeds[0], **doc_extra)
        summary = metrics[0].summary()
    else:
        summaries = [m.summary() for m in metrics]
        summary, spread = aggregate(summaries)
        doc = multiseed_json(summary, spread, seeds, summaries, **doc_extra,
                             ttfts=[t for m in metrics for t in m.ttfts],
                             tpots=[t for m in metrics for t in m.tpots])
    status = save_result(args.save_result, doc)
    if args.json:
        print(json.dumps(doc, indent=1))
        return status
    title = " Serving Benchmark Result " if len(runs) == 1 else f" Median of {len(runs)} seeds "
    print(format_report(summary, args.metric_percentiles, title=title))
    if len(runs) > 1:
        print("spread over seeds (min / p25 / p75 / max):")
        keys = ["mean_ttft_ms", "median_ttft_ms",
                *(f"{percentile_key(p)}_ttft_ms" for p in args.metric_percentiles),
                "mean_tpot_ms", "median_tpot_ms", "mean_itl_ms", "median_itl_ms", "duration"]
        for key in keys:
            s = spread[key]
            print(f"  {key:<16} {s['min']:9.2f} {s['p25']:9.2f} {s['p75']:9.2f} {s['max']:9.2f}")
    return status


def save_result(path: str | None, doc: dict[str, Any]) -> int:
    """--save-result, written whole or not at all; 1 (one line) if it failed."""
    from flightcheck.output_files import write_text

    if not path:
        return 0
    try:
        write_text(path, json.dumps(doc))
    except OSError as err:
        return write_failed("--save-result", path, err, "the result was not saved (a file there before "
                            "is as it was); the run itself finished")
    return 0


def run(args: argparse.Namespace) -> int:
    from flightcheck.output_files import OutputLost

    from .outputs import OutputRefused

    problem = workload_problem(args)
    if problem:
        return bad(problem)
    try:
        claimed = claim_outputs(args, ("--dataset-path",))
    except OutputRefused as err:
        return bad(str(err))
    with claimed:
        try:
            return _simulate(args)
        except OutputLost as err:
            return trace_lost(err, "the simulation ran to its end, but no results are reported")


def _simulate(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from flightcheck.bench.simulation import SimConfig, simulate
    from flightcheck.bench.workload import WorkloadError
    from flightcheck.bench.workload_args import build_workload
    from flightcheck.output_files import OutputLost

    try:
        config = SimConfig(
            model=args.model, gpu=args.gpu, pp=args.pp,
            max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
            max_num_seqs=args.max_num_seqs, block_size=args.block_size, num_blocks=args.num_blocks,
            enable_prefix_caching=args.enable_prefix_caching, policy=args.policy,
            profile=args.profile, percentiles=args.metric_percentiles)
        if args.eta_compute or args.eta_memory:
            config = replace(config, params=config.params.with_efficiency(
                min(1.0, args.eta_compute or config.params.compute_efficiency),
                min(1.0, args.eta_memory or config.params.memory_efficiency)))
        _refuse_a_default_pool_past_the_limit(config)
        wargs = workload_args(args)
        seeds = list(range(args.seed, args.seed + args.seeds))
        runs = []
        for i, seed in enumerate(seeds):
            runs.append(simulate(build_workload(wargs, seed), config,
                                 trace_path=args.trace if i == 0 else None))
    except (WorkloadError, ValueError) as err:
        return bad(str(err))
    except OutputLost:
        raise
    except OSError as err:                       # reading --dataset-path, opening --trace
        return bad(f"{err.filename or args.dataset_path}: {reason(err)}")
    extra = {"simulator": True, "policy": args.policy, "profile": args.profile, "model": args.model, "gpu": args.gpu,
             "pp": args.pp, "dataset": args.dataset, "request_rate": args.request_rate,
             "num_prompts": args.num_prompts,
             "compute_efficiency": config.params.compute_efficiency,
             "memory_efficiency": config.params.memory_efficiency}
    if math.isinf(args.request_rate):
        extra["request_rate"] = "inf"
    status = print_result(args, runs, seeds, extra)
    if not args.json:
        sys.stdout.flush()
        wall = sum(r.wall_s for r in runs)
        share = sum(r.scheduler_wall_s for r in runs) / wall if wall else 0.0
        print(f"simulated {sum(r.num_batches for r in runs)} batches in {wall:.2f} s "
              f"({share:.0%} inside the reference scheduler); KV blocks {runs[0].num_blocks}; "
              f"profile {args.profile}, at most {max(r.max_in_flight for r in runs)} batches "
              f"in flight", file=sys.stderr)
    return status
