"""`flightcheck plot`: a trace's pipeline timeline (PNG + Perfetto JSON), or
TTFT/TPOT CDFs of result files."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import bad, check_writable, real


def add_parser(sub) -> None:
    p = sub.add_parser("plot", help="draw a trace's pipeline timeline, or CDFs of results")
    p.add_argument("files", nargs="+", metavar="TRACE|RESULTS",
                   help="one JSON Lines trace with stage events, or result JSON files "
                        "(simulate/bench --save-result)")
    p.add_argument("--out", help="PNG to write (default: TRACE.timeline.png, or cdf.png)")
    p.add_argument("--perfetto", help="Perfetto JSON to write (traces; default "
                   "TRACE.perfetto.json)")
    p.add_argument("--no-png", action="store_true", help="traces: only the Perfetto JSON")
    p.add_argument("--start", type=real(), help="window start, seconds")
    p.add_argument("--end", type=real(), help="window end, seconds")
    p.add_argument("--request", help="request to highlight (default: most prefill chunks)")
    p.add_argument("--title", help="figure title")
    p.set_defaults(func=run)


# What a file that is not a trace or result of ours can raise while it is read
# (a field of the wrong type, a list where an object belongs, nesting too deep).
UNREADABLE = (ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError)


def run(args: argparse.Namespace) -> int:
    from flightcheck.bench.workload import WorkloadError

    if args.start is not None and args.end is not None and not args.start < args.end:
        return bad(f"--start {args.start:g} must be before --end {args.end:g}")
    try:
        for f in args.files:
            if not Path(f).is_file():
                raise WorkloadError(f"file not found: {f}")
            _check_utf8(f)
        problem = _check_outputs(args)
        if problem:
            return bad(problem)
        if _is_trace(args.files[0]):
            if len(args.files) > 1:
                raise WorkloadError("give one trace, or only result files")
            return _plot_trace(args)
        return _plot_results(args)
    except WorkloadError as err:
        return bad(str(err))
    except OSError as err:
        return bad(f"{err.filename or ''}: {err.strerror or err}")


def _check_utf8(path: str) -> None:
    """Traces and results are UTF-8 JSON: name the line of a file that is not text."""
    from flightcheck.bench.workload import WorkloadError

    data = Path(path).read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise WorkloadError(f"{path}:{line}: not UTF-8 text (byte {err.start}); "
                            "expected a JSON Lines trace or a result JSON") from None


def _outputs(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(flag, path) of what this run will write, defaults included."""
    stem = Path(args.files[0]).with_suffix("")
    if _is_trace(args.files[0]):
        outputs = [("--perfetto", args.perfetto or f"{stem}.perfetto.json")]
        if not args.no_png:
            outputs.append(("--out", args.out or f"{stem}.timeline.png"))
        return outputs
    return [("--out", args.out or "cdf.png")]


def _check_outputs(args: argparse.Namespace) -> str | None:
    for flag, path in _outputs(args):
        problem = check_writable(path, flag)
        if problem:
            return problem
    return None


def _is_trace(path: str) -> bool:
    from flightcheck.bench.plots.trace_reader import is_trace_file

    try:
        return is_trace_file(path)
    except UNREADABLE:
        return False


def _plot_trace(args: argparse.Namespace) -> int:
    from flightcheck.bench.plots.perfetto import write_perfetto
    from flightcheck.bench.plots.timeline import draw_timeline
    from flightcheck.bench.plots.trace_reader import read_timeline

    from flightcheck.bench.workload import WorkloadError

    try:
        data = read_timeline(args.files[0])
    except WorkloadError:
        raise                                     # already one line naming the problem
    except UNREADABLE as err:
        return bad(f"{args.files[0]}: not a trace this command reads ({type(err).__name__}: "
                   f"{ascii(str(err))[1:-1][:120]})")
    outputs = dict(_outputs(args))
    write_perfetto(data, outputs["--perfetto"])
    print(f"wrote {outputs['--perfetto']}")
    if not args.no_png:
        w0, w1 = draw_timeline(data, outputs["--out"], start=args.start, end=args.end,
                               request=args.request, title=args.title)
        print(f"wrote {outputs['--out']} (window {w0:.3f}-{w1:.3f} s)")
    return 0


def _plot_results(args: argparse.Namespace) -> int:
    from flightcheck.bench.plots.cdf import draw_cdfs, load_latencies
    from flightcheck.bench.workload import WorkloadError

    for f in args.files:
        try:
            load_latencies(f)
        except WorkloadError:
            raise
        except UNREADABLE as err:
            return bad(f"{f}: not a result file this command reads ({type(err).__name__}: "
                       f"{ascii(str(err))[1:-1][:120]})")
    out = _outputs(args)[0][1]
    draw_cdfs(args.files, out, args.title)
    print(f"wrote {out}")
    return 0
