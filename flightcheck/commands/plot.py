"""`flightcheck plot`: a trace's pipeline timeline (PNG + Perfetto JSON), or
TTFT/TPOT CDFs of result files."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import bad


def add_parser(sub) -> None:
    p = sub.add_parser("plot", help="draw a trace's pipeline timeline, or CDFs of results")
    p.add_argument("files", nargs="+", metavar="TRACE|RESULTS",
                   help="one JSON Lines trace with stage events, or result JSON files "
                        "(simulate/bench --save-result)")
    p.add_argument("--out", help="PNG to write (default: TRACE.timeline.png, or cdf.png)")
    p.add_argument("--perfetto", help="Perfetto JSON to write (traces; default "
                   "TRACE.perfetto.json)")
    p.add_argument("--no-png", action="store_true", help="traces: only the Perfetto JSON")
    p.add_argument("--start", type=float, help="window start, seconds")
    p.add_argument("--end", type=float, help="window end, seconds")
    p.add_argument("--request", help="request to highlight (default: most prefill chunks)")
    p.add_argument("--title", help="figure title")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from flightcheck.bench.plots.trace_reader import is_trace_file, read_timeline
    from flightcheck.bench.workload import WorkloadError

    try:
        for f in args.files:
            if not Path(f).is_file():
                raise WorkloadError(f"file not found: {f}")
        if is_trace_file(args.files[0]):
            if len(args.files) > 1:
                raise WorkloadError("give one trace, or only result files")
            from flightcheck.bench.plots.perfetto import write_perfetto
            from flightcheck.bench.plots.timeline import draw_timeline

            data = read_timeline(args.files[0])
            stem = Path(args.files[0]).with_suffix("")
            perfetto = args.perfetto or f"{stem}.perfetto.json"
            write_perfetto(data, perfetto)
            print(f"wrote {perfetto}")
            if not args.no_png:
                out = args.out or f"{stem}.timeline.png"
                w0, w1 = draw_timeline(data, out, start=args.start, end=args.end,
                                       request=args.request, title=args.title)
                print(f"wrote {out} (window {w0:.3f}-{w1:.3f} s)")
        else:
            from flightcheck.bench.plots.cdf import draw_cdfs

            out = args.out or "cdf.png"
            draw_cdfs(args.files, out, args.title)
            print(f"wrote {out}")
    except WorkloadError as err:
        return bad(str(err))
    return 0
