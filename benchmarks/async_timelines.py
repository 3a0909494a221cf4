"""Timelines of ONE request's decodes under synchronous and asynchronous
scheduling (issue 22), simulated: Llama-3.1-8B on 4x L4 (PP = 4), budget
2048, eight requests sent 30 ms apart (200-token prompts, 40 output tokens each),
the calibrated cost model. Draws request s3's decodes 6-11.

    python benchmarks/async_timelines.py [--out docs/figures]     # ~5 s

Writes decodes-pp4-{sync,async}.png and .perfetto.json, and prints for each
profile how many of s3's decodes were in flight at once and the median gap
between its consecutive decodes (the ITL the engine sees).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from flightcheck.bench.plots.decodes import (decodes_of, draw_decodes, max_in_flight,
                                             write_decode_perfetto)
from flightcheck.bench.plots.trace_reader import read_timeline
from flightcheck.bench.simulation import SimConfig, simulate
from flightcheck.bench.workload import RequestSpec, Workload

REQUEST = "s3"
PP = 4
PROFILES = {"sync": "vllm-0.33", "async": "vllm-0.33-async"}


def workload() -> Workload:
    return Workload("eight-30ms-apart", tuple(RequestSpec(f"s{i}", 200, 40, send_time=0.03 * i)
                                           for i in range(8)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="docs/figures")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for short, profile in PROFILES.items():
            trace = f"{tmp}/{short}.jsonl"
            simulate(workload(), SimConfig(pp=PP, profile=profile), trace_path=trace)
            data = read_timeline(trace)
            decodes = decodes_of(data, REQUEST)
            gaps = [b.completed - a.completed for a, b in zip(decodes, decodes[1:])]
            draw_decodes(data, REQUEST, out / f"decodes-pp{PP}-{short}.png", first=6, count=6,
                         title=f"{profile} (PP = {PP}, queue {PP + (short == 'async')}): "
                               f"{REQUEST}'s decodes 6-11 in flight (top) and in the stages")
            write_decode_perfetto(data, REQUEST, out / f"decodes-pp{PP}-{short}.perfetto.json")
            print(f"{profile}: {len(decodes)} decodes of {REQUEST}, at most "
                  f"{max_in_flight(decodes)} in flight at once, median gap between tokens "
                  f"{1e3 * statistics.median(gaps):.1f} ms; batches of {REQUEST}'s decodes "
                  f"{[d.batch for d in decodes[5:11]]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
