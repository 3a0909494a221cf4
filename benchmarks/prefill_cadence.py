"""The prefill cadence against vLLM's real scheduler, with what it held.

    python benchmarks/prefill_cadence.py [--versions 0.34.0,0.33.0] [--seed 5] [--workloads 60]

For each release and mode (sync, async): the campaign's plain workloads of
the seed with an interval of 2-4 (flightcheck/vllm/cadence_generate.py
`cadence_workloads`) through vLLM's scheduler and the reference; prints the
differential (identical, unexplained), check-trace's verdicts against vLLM's
ground truth, and the reference's schedule() calls: how many held prefill,
how many held while a request waited, and how many of those scheduled
nothing at all (docs/request-states.md, "Prefill cadence"). The reference's
calls are counted only where it is identical to vLLM on every workload.
Needs the vLLM venvs (scripts/build-vllm-venv.sh).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

from flightcheck.reference import cadence
from flightcheck.vllm.cadence_generate import cadence_workloads
from flightcheck.vllm.campaign import run_version


def _counting(held: Counter) -> None:
    """Count, in every reference scheduler, the calls the cadence held."""
    start, end = cadence.PrefillCadence._start_cadence, cadence.PrefillCadence._end_cadence

    def counted_start(self) -> None:
        start(self)
        held["calls"] += 1
        held["held"] += bool(self.defer_prefills)

    def counted_end(self, batch) -> None:
        if self.defer_prefills and self.waiting:
            held["held_with_waiting"] += 1
            held["held_with_waiting_and_nothing_run"] += batch.total_num_scheduled_tokens == 0
        end(self, batch)

    cadence.PrefillCadence._start_cadence, cadence.PrefillCadence._end_cadence = counted_start, counted_end


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--versions", default="0.34.0,0.33.0")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--workloads", type=int, default=60)
    args = parser.parse_args()
    held: Counter = Counter()
    _counting(held)
    rows = []
    for version in args.versions.split(","):
        for mode in ("sync", "async"):
            held.clear()
            report = run_version(version, cadence_workloads(args.seed, args.workloads), args.seed, False,
                                 lambda line: None, mode == "async")
            rows.append({"version": version, "mode": mode, "workloads": report.workloads,
                         "identical": report.identical, "unexplained": report.unexplained,
                         "verdicts": dict(report.verdicts), "reference_calls": dict(held)})
            print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main()
