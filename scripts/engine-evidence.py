#!/usr/bin/env python3
"""The engine's choices (E-a, E-b: spec/engine.py) on vLLM's real scheduler:
replay many seeded workloads with our copy of each version's engine loop,
check every trace (it numbers engine steps: `engine_step`), and compare each
verdict, position included, with what the engine's and vLLM's own records
say (verification/traces/ground_truth.py).

    scripts/engine-evidence.py 0.8.5 --seed 1 --workloads 500 [--async] [--reuse-ids]
        [--spec-tokens K] [--keep DIR]

Prints, per property check-trace named, how many traces it rejected and how
many of those rejections sit exactly where the ground truth puts the bug,
then every disagreement (a false rejection, a miss, a rejection at another
event) with its workload's name; `--keep DIR` copies the traces rejected for
E-a or E-b, and every disagreement, with their workloads. Exit 0 when every
verdict agrees with the ground truth.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import sys
import tempfile
from pathlib import Path

from flightcheck.verification.traces.check import MalformedTrace, check_events, read_trace_file
from flightcheck.verification.traces.ground_truth import expected_verdict
from flightcheck.vllm import ASYNC_RECORDER
from flightcheck.vllm.campaign import with_async_scheduling
from flightcheck.vllm.generate import campaign_workloads
from flightcheck.vllm.replay import ReplayError, ReplayWorker
from flightcheck.vllm.versions import SUPPORTED_VERSIONS

ENGINE_PROPERTIES = ("Ea_no_wait_in_flight", "Eb_complete_only_when_needed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("version", choices=SUPPORTED_VERSIONS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workloads", type=int, default=100)
    parser.add_argument("--async", dest="async_scheduling", action="store_true")
    parser.add_argument("--reuse-ids", action="store_true")
    parser.add_argument("--spec-tokens", type=int, default=0)
    parser.add_argument("--keep", type=Path)
    args = parser.parse_args(argv)
    workloads = campaign_workloads(args.seed, args.workloads, args.reuse_ids, args.spec_tokens)
    if args.async_scheduling:
        workloads = [with_async_scheduling(raw) for raw in workloads]
    rejected: collections.Counter[str] = collections.Counter()
    exact: collections.Counter[str] = collections.Counter()
    tally: collections.Counter[str] = collections.Counter()
    numbered = 0
    disagreements = []
    try:
        worker = ReplayWorker(args.version)
    except ReplayError as err:                     # no venv for the version: one line
        parser.exit(2, f"{parser.prog}: {err}\n")
    with worker, tempfile.TemporaryDirectory() as scratch:
        for raw in workloads:
            trace = Path(scratch) / f"{raw['name']}.jsonl"
            result = worker.replay(raw, trace=str(trace),
                                   scheduler_cls=ASYNC_RECORDER if args.async_scheduling else None)
            try:
                events = read_trace_file(trace)
                verdict = check_events(events)
            except MalformedTrace as err:
                tally["malformed"] += 1
                disagreements.append(f"{raw['name']}: malformed: {err}")
                continue
            numbered += any("engine_step" in e for e in events)
            expected = expected_verdict(result, events)
            agrees = expected.agrees(verdict)
            tally[f"{expected.kind}: {'agrees' if agrees else 'DISAGREES'}"] += 1
            if not verdict.ok:
                rejected[verdict.property] += 1
                exact[verdict.property] += agrees
            keep = verdict.property in ENGINE_PROPERTIES or not agrees
            if args.keep is not None and keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(trace, args.keep / trace.name)
                (args.keep / f"{raw['name']}.workload.json").write_text(json.dumps(raw))
            if not agrees:
                said = "legal" if verdict.ok else f"rejects at {verdict.event_index} ({verdict.property})"
                disagreements.append(f"{raw['name']}: ground truth {expected.kind} at {expected.earliest}.."
                                     f"{expected.latest}, check-trace {said}")
    mode = " async" if args.async_scheduling else ""
    print(f"vLLM {args.version}{mode}, seed {args.seed}: {len(workloads)} traces, {numbered} numbering engine steps")
    for prop, count in rejected.most_common():
        print(f"  rejected {count:4d} as {prop} ({exact[prop]} where the ground truth puts the bug)")
    for key, count in sorted(tally.items()):
        print(f"  {count:5d}  {key}")
    for line in disagreements:
        print(f"  DISAGREES {line}")
    return 0 if not disagreements else 1


if __name__ == "__main__":
    sys.exit(main())
