"""`flightcheck run`: generate text for a batch of prompts with the
pipeline-parallel runtime, driven by the reference scheduler.

    flightcheck run --pp 2 --num-prompts 8 --trace run.jsonl --json
    flightcheck run --pp 3 --prompts prompts.jsonl --checkpoint ./tiny-llama
    flightcheck run --pp 2 --num-prompts 8 --profile vllm-0.33-async --trace async.jsonl
    torchrun --standalone --nproc-per-node 3 -m flightcheck.cli run --pp 2 --num-prompts 8

Every rank of a torchrun job runs the same command: rank 0 drives, ranks
1..K serve the stages. torch is imported only when this command runs.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys

from .common import (DEFAULT_REFERENCE_PROFILE, MAX_MODEL_LEN, MAX_PROMPTS, REFERENCE_PROFILES, bad,
                     count_int, cuda_problem, int_in, kv_cache_problem, local_pp_problem, pool_blocks,
                     positive_int, real, seed_int)
from .outputs import Claim, Output, OutputRefused, claim, reason, write_failed
from .stop_signals import StopSignal, stop_signals

DTYPES = ("float32", "float64", "bfloat16", "float16")
MIN_SYNTHETIC_PROMPT = 4          # --num-prompts draws prompts of 4 to 200 tokens


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="generate with the pipeline-parallel PyTorch runtime")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts", metavar="FILE",
                     help="JSON list or JSON Lines: text, token-id lists, or objects")
    src.add_argument("--num-prompts", type=int_in(1, MAX_PROMPTS), metavar="N",
                     help="N seeded synthetic prompts (varied lengths, shared prefixes)")
    p.add_argument("--pp", type=positive_int, default=1, help="pipeline stages (default 1)")
    p.add_argument("--checkpoint", metavar="DIR", help="local HF Llama checkpoint "
                   "(config.json + *.safetensors); default: the seeded model")
    p.add_argument("--model", default="tiny", help="seeded model preset (default tiny)")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--seed", type=seed_int, default=0, help="weights, workload and sampling seed")
    p.add_argument("--max-tokens", type=positive_int, default=16)
    p.add_argument("--temperature", type=real(0.0), default=0.0,
                   help="0 (default), or below 1e-5: greedy, as in vLLM")
    p.add_argument("--top-p", type=real(0.0, 1.0, low_open=True), default=1.0)
    p.add_argument("--max-num-batched-tokens", type=positive_int, default=256)
    p.add_argument("--max-num-seqs", type=positive_int, default=32)
    p.add_argument("--max-model-len", type=int_in(1, MAX_MODEL_LEN), default=1024)
    p.add_argument("--block-size", type=int_in(1, MAX_MODEL_LEN), default=16)
    p.add_argument("--num-blocks", type=pool_blocks, default=512, help="KV pool size per stage")
    p.add_argument("--long-prefill-token-threshold", type=count_int, default=0)
    p.add_argument("--num-spec-tokens", type=count_int, default=0,
                   help="prompt-lookup drafts per step (0: no spec decode)")
    p.add_argument("--profile", choices=REFERENCE_PROFILES, default=DEFAULT_REFERENCE_PROFILE,
                   help="the vLLM version the scheduler follows (default %(default)s); vllm-0.33-async "
                        "schedules asynchronously: K + 1 batches in flight, stage 0 takes each decode's "
                        "previous token from the last stage")
    p.add_argument("--one-batch-per-request", action="store_true",
                   help="the policy before continue-prefill (vLLM <= 0.8.4)")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--trace", metavar="FILE", help="write the JSON Lines trace here")
    p.add_argument("--chrome-trace", metavar="FILE", help="also write Chrome/Perfetto trace JSON")
    p.add_argument("--force", action="store_true",
                   help="allow more than 4 local stage processes per core")
    p.add_argument("--json", action="store_true", help="print machine-readable results")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Mirrors launch.torchrun_rank without importing torch, so that bad
    # arguments are refused before the second it takes to load it.
    under_torchrun = int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ
    claimed = Claim()
    if not under_torchrun or os.environ["RANK"] == "0":   # only the driver checks its outputs
        problem = (None if under_torchrun else local_pp_problem(args.pp, args.force)) \
            or _model_len_problem(args) or cuda_problem(args.device)
        if problem:
            return bad(problem)
        try:
            claimed = _claim_outputs(args)
        except OutputRefused as err:
            return bad(str(err))

    try:
        with claimed, stop_signals():   # SIGTERM, SIGHUP: StopSignal, answered as Ctrl-C is
            return _run(args)
    except KeyboardInterrupt:       # the stages are already stopped and reaped (see _execute)
        return interrupted()
    except StopSignal as stop:
        return stopped(stop)


def _claim_outputs(args: argparse.Namespace) -> Claim:
    """--trace (written as the run goes: a live checker may read it) and
    --chrome-trace (written whole at the end), against --prompts and
    --checkpoint and each other; OutputRefused (exit 2) before any work."""
    return claim([Output("--trace", args.trace, grows=True), Output("--chrome-trace", args.chrome_trace)],
                 [("--prompts", args.prompts), ("--checkpoint", args.checkpoint)])


def interrupted() -> int:
    """Ctrl-C: one line, and the shell's code for a run ended by SIGINT.

    By now every stage process is reaped and the trace is closed. The
    process then ends at once: the interpreter's teardown of torch alone takes
    over 2 s on a loaded machine, and Ctrl-C should end a run within 2 s."""
    sys.stderr.write("\nflightcheck: interrupted\n")
    if "torch" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(INTERRUPTED)
    return INTERRUPTED


def stopped(stop: StopSignal) -> int:
    """SIGTERM or SIGHUP: one line (with what the trace holds, once it was
    opened), and the shell's code for a process that the signal ended (128 +
    its number). By now every stage process is reaped and the trace closed."""
    held = ("" if stop.trace_events is None
            else f"; the trace holds {stop.trace_events} complete events")
    sys.stderr.write(f"\nflightcheck: run stopped by {stop.name}{held}\n")
    if "torch" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(stop.exit_code)
    return stop.exit_code


def _complete_lines(path: str) -> int | None:
    """How many whole lines (events) the file holds; None if it cannot be read."""
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except OSError:
        return None


# 128 + SIGINT, what a shell reports for a process that SIGINT ended.
INTERRUPTED = 130


def _run(args: argparse.Namespace) -> int:
    from flightcheck.runtime import launch

    rank = launch.torchrun_rank()
    if rank is not None and rank > 0:                 # a stage of a torchrun job
        launch.set_threads(1)
        launch.serve_torchrun_stage()
        return 0
    try:
        prepared = _prepare(args)
    except ValueError as err:                         # ConfigError, PromptFileError, ...
        return bad(str(err).splitlines()[0])
    return _execute(args, *prepared)


def _model_len_problem(args: argparse.Namespace) -> str | None:
    """The synthetic prompts need room for at least one prompt token more than
    their shortest length (a prompt must be shorter than --max-model-len)."""
    if args.num_prompts and args.max_model_len <= MIN_SYNTHETIC_PROMPT:
        return (f"--max-model-len {args.max_model_len} is too small for --num-prompts: the synthetic "
                f"prompts have {MIN_SYNTHETIC_PROMPT} tokens or more, so it needs at least "
                f"{MIN_SYNTHETIC_PROMPT + 1}")
    return None


def _prepare(args: argparse.Namespace):
    """Validate everything before any process starts; ValueError on bad input."""
    from flightcheck.reference import SchedulerConfig
    from flightcheck.runtime.tokenizer import load_tokenizer
    from flightcheck.runtime.weights import WeightSource
    from flightcheck.runtime.workload import mixed_workload, read_prompts

    if not 0.0 < args.top_p <= 1.0:
        raise ValueError(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {args.temperature}")
    source = WeightSource(checkpoint=args.checkpoint, preset=args.model, seed=args.seed)
    model_cfg = source.model_config()
    if args.pp > model_cfg.n_layers:
        raise ValueError(f"--pp {args.pp} exceeds the model's {model_cfg.n_layers} layers")
    if args.max_model_len > model_cfg.max_position_embeddings:
        raise ValueError(f"--max-model-len {args.max_model_len} exceeds the model's "
                         f"max_position_embeddings {model_cfg.max_position_embeddings}")
    too_big = kv_cache_problem(args.num_blocks, args.block_size, model_cfg, args.dtype)
    if too_big:
        raise ValueError(too_big)
    sched_cfg = SchedulerConfig(
        max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len, block_size=args.block_size, num_blocks=args.num_blocks,
        num_pipeline_stages=args.pp, long_prefill_token_threshold=args.long_prefill_token_threshold,
        num_spec_tokens=args.num_spec_tokens, enable_prefix_caching=not args.no_prefix_caching,
        continue_prefill=False if args.one_batch_per_request else None, profile=args.profile)
    tokenizer = load_tokenizer(args.checkpoint)
    if args.prompts:
        requests = read_prompts(args.prompts, tokenizer, args.max_tokens, args.temperature)
    else:
        vocab = min(256, model_cfg.vocab_size)
        requests = mixed_workload(args.seed, args.num_prompts, vocab=vocab,
                                  prompt_lens=(4, min(200, args.max_model_len - 1)),
                                  max_tokens=(args.max_tokens, args.max_tokens),
                                  temperature=args.temperature)
    limit = args.max_model_len - 1
    for r in requests:
        if len(r.prompt_token_ids) > limit:
            raise ValueError(f"prompt {r.req_id!r} has {len(r.prompt_token_ids)} tokens; at most "
                             f"{limit} fit (--max-model-len {args.max_model_len} - 1)")
        out_of_vocab = [t for t in r.prompt_token_ids if not 0 <= t < model_cfg.vocab_size]
        if out_of_vocab:
            raise ValueError(f"prompt {r.req_id!r} has token id {out_of_vocab[0]} outside the "
                             f"vocabulary (size {model_cfg.vocab_size})")
    if len({r.req_id for r in requests}) != len(requests):
        raise ValueError("prompt ids are not unique")
    return source, model_cfg, sched_cfg, tokenizer, requests


def _execute(args, source, model_cfg, sched_cfg, tokenizer, requests) -> int:
    from flightcheck.runtime import launch

    launch.set_threads(1)
    eos = model_cfg.eos_token_id
    log = sys.stderr
    print(f"flightcheck run: {len(requests)} requests, PP={args.pp}, "
          f"{'checkpoint ' + args.checkpoint if args.checkpoint else 'seeded ' + args.model} "
          f"model, {args.dtype}", file=log)
    from flightcheck.runtime import ConfigError, PipelineError
    from flightcheck.runtime.pipeline import StageDied
    try:
        spec = launch.StageSpec(source, args.pp, sched_cfg.num_blocks, sched_cfg.block_size, dtype=args.dtype,
                                device=args.device, top_p=args.top_p, feedback=sched_cfg.async_scheduling)
        executor = launch.make_executor(spec, num_spec_tokens=args.num_spec_tokens)
    except StageDied as err:                          # a fault of the run, not of its input
        print(f"flightcheck: error: {str(err).splitlines()[0]}", file=log)
        return 1
    except (ConfigError, PipelineError) as err:      # e.g. weights that do not fit config.json
        return bad(str(err).splitlines()[0])
    memory = _TraceInMemory() if args.chrome_trace and not args.trace else None
    try:
        trace = _open_trace(args, eos, memory)
    except OSError as err:                            # its FIFO's reader went away since the check
        executor.close(graceful=True)
        return bad(f"--trace {args.trace}: cannot write it ({reason(err)})")
    trace_lost: OSError | None = None
    stopped_by: BaseException | None = None
    try:
        result, status = _generate(executor, sched_cfg, requests, eos, trace)
    except (KeyboardInterrupt, StopSignal) as stop:
        stopped_by = stop             # stop the stages at once, not after their batches
    finally:
        try:
            executor.close(graceful=stopped_by is None)
        finally:
            if trace is not None:
                trace_lost = _close_trace(trace)
    lost = _write_outputs(args, memory, trace_lost)   # a stopped run's Chrome trace too, from its prefix
    if stopped_by is not None:
        if isinstance(stopped_by, StopSignal) and args.trace and trace_lost is None:
            stopped_by.trace_events = _complete_lines(args.trace)
        raise stopped_by              # run() says so in one line
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        _print_results(result, tokenizer, args, trace_lost)
    return max(_stage_failure(executor, status), lost)


def _generate(executor, sched_cfg, requests, eos, trace):
    """The run's results and exit status (1: the pipeline failed, named on stderr)."""
    from flightcheck.runtime.generate import RunFailed, generate

    log = sys.stderr
    shown = [-1]

    def progress(done: int, total: int, tokens: int) -> None:
        if log.isatty():
            print(f"\r  {done}/{total} requests finished, {tokens} tokens", end="", file=log)
        elif done != shown[0]:
            shown[0] = done
            print(f"  {done}/{total} requests finished, {tokens} tokens", file=log)
    try:
        result = generate(executor, sched_cfg, requests, eos_token_id=eos, trace=trace,
                          progress=progress)
        status = 0
    except RunFailed as err:
        result, status = err.result, 1
        print(f"\nflightcheck: error: {str(err).splitlines()[0]}", file=log)
    if log.isatty():
        print(file=log)
    return result, status


def _stage_failure(executor, status: int) -> int:
    """The exit status once the stages are stopped: 1 (and one line naming
    it) if a stage ended abnormally though the run had not failed, e.g.
    killed once every result was back; else `status`."""
    line = stage_failure_line(executor)
    if line is None or status != 0:
        return status
    print(line, file=sys.stderr)
    return 1


def stage_failure_line(executor) -> str | None:
    """One line if a stage of `executor` ended abnormally once it was closed."""
    failure = getattr(executor, "stage_failure", None)
    return None if failure is None else f"flightcheck: error: every result was back, but {failure.splitlines()[0]}"


class _TraceInMemory(io.StringIO):
    """The trace of a run with --chrome-trace alone: kept for the Chrome trace
    after the writer closes it."""

    def close(self) -> None:
        pass


def _open_trace(args: argparse.Namespace, eos: int | None, memory: _TraceInMemory | None):
    """The run's trace writer: into --trace a whole line at a time, or into
    `memory` (--chrome-trace alone); None if neither is asked for."""
    from flightcheck.runtime.trace import RuntimeTraceWriter

    if args.trace:
        return RuntimeTraceWriter.to_path(args.trace, eos_token_id=eos)
    return RuntimeTraceWriter(memory, eos_token_id=eos) if memory is not None else None


def _close_trace(trace) -> OSError | None:
    """Close the trace; the write error that cut it short, if one did."""
    from flightcheck.output_files import OutputLost

    try:
        trace.close()
    except OutputLost as err:
        return err
    return None


def _write_outputs(args: argparse.Namespace, memory: _TraceInMemory | None, trace_lost: OSError | None) -> int:
    """Say what a failed --trace lost, and write --chrome-trace from a whole
    trace only; 1 if any output was lost (one line each), else 0."""
    from flightcheck.runtime.trace import read_trace, write_chrome_events

    lost = 0
    if trace_lost is not None:
        lost = write_failed("--trace", args.trace, trace_lost,
                            f"its first {getattr(trace_lost, 'kept', 0)} lines were written, each complete, "
                            f"and the rest is lost; the run went on without it")
    if not args.chrome_trace:
        return lost
    if trace_lost is not None:
        return write_failed("--chrome-trace", args.chrome_trace, trace_lost,
                            "not written: the trace it is made from is incomplete")
    try:
        events = read_trace(args.trace) if memory is None else \
            [json.loads(line) for line in memory.getvalue().splitlines()]
        write_chrome_events(events, args.chrome_trace)
    except OSError as err:
        return write_failed("--chrome-trace", args.chrome_trace, err,
                            "not written (a file there before is as it was); the run itself finished")
    return lost


def _print_results(result, tokenizer, args, trace_lost: OSError | None = None) -> None:
    total = sum(len(r.output_token_ids) for r in result.requests)
    for r in result.requests:
        text = tokenizer.decode(list(r.output_token_ids))
        print(f"{r.req_id}: prompt {r.prompt_len} tokens -> {len(r.output_token_ids)} tokens "
              f"({r.finish_reason}) {text!r}")
    rate = total / result.seconds if result.seconds > 0 else 0.0
    print(f"{len(result.requests)} requests, {total} output tokens, {result.num_batches} batches "
          f"in {result.seconds:.2f} s ({rate:.1f} tokens/s)")
    if result.error:
        print(f"error: {result.error.splitlines()[0]}")
    if args.trace:
        print(f"trace: {args.trace}" + (" (incomplete: a write failed, see stderr)" if trace_lost else ""))
