"""`flightcheck plot`: a trace's pipeline timeline (PNG + Perfetto JSON), or
TTFT/TPOT CDFs of result files."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import bad, real
from .outputs import Claim, Output, OutputRefused, claim, reason, write_failed


def add_parser(sub) -> None:
    p = sub.add_parser("plot", help="draw a trace's pipeline timeline, or CDFs of results")
    p.add_argument("files", nargs="+", metavar="TRACE|RESULTS",
                   help="one JSON Lines trace with stage events, or result JSON files "
                        "(simulate/bench --save-result)")
    p.add_argument("--out", help="figure to write, PNG or the format its extension names (.pdf, .svg, ...; "
                   "default: TRACE.timeline.png, or cdf.png)")
    p.add_argument("--perfetto", help="Perfetto JSON to write (traces; default "
                   "TRACE.perfetto.json)")
    p.add_argument("--no-png", action="store_true", help="traces: only the Perfetto JSON")
    p.add_argument("--start", type=real(), help="window start, seconds")
    p.add_argument("--end", type=real(), help="window end, seconds")
    p.add_argument("--request", help="request to highlight (default: most prefill chunks)")
    p.add_argument("--title", help="figure title")
    p.set_defaults(func=run)


# A figure or Perfetto file is written whole or not at all (output_files.write_whole).
NOT_WRITTEN = "it was not written (a file there before is as it was)"

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
        with _claim_outputs(args):
            if _is_trace(args.files[0]):
                if len(args.files) > 1:
                    raise WorkloadError("give one trace, or only result files")
                return _plot_trace(args)
            return _plot_results(args)
    except (WorkloadError, OutputRefused) as err:
        return bad(str(err))
    except OSError as err:
        if err.filename not in args.files:        # not an input's: standard output's, say
            raise
        return bad(f"{err.filename}: {reason(err)}")


def _claim_outputs(args: argparse.Namespace) -> Claim:
    """Every output checked before anything is drawn: a figure's format
    known, no output on an input or on the other output, each writable."""
    from flightcheck.bench.plots.figure_file import figure_format
    from flightcheck.bench.workload import WorkloadError

    outputs = _outputs(args)
    claimed = claim([Output(flag, path) for flag, path in outputs], [("input", f) for f in args.files])
    for flag, path in outputs:
        if flag == "--out":
            try:
                figure_format(path)
            except WorkloadError as err:
                claimed.release()
                raise OutputRefused(f"--out {err}") from None
    return claimed


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
    try:
        write_perfetto(data, outputs["--perfetto"])
    except OSError as err:
        return write_failed("--perfetto", outputs["--perfetto"], err, NOT_WRITTEN)
    print(f"wrote {outputs['--perfetto']}")
    if not args.no_png:
        try:
            w0, w1 = draw_timeline(data, outputs["--out"], start=args.start, end=args.end,
                                   request=args.request, title=args.title)
        except OSError as err:
            return write_failed("--out", outputs["--out"], err, NOT_WRITTEN)
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
    try:
        draw_cdfs(args.files, out, args.title)
    except OSError as err:
        return write_failed("--out", out, err, NOT_WRITTEN)
    print(f"wrote {out}")
    return 0
