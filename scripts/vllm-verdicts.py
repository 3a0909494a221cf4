#!/usr/bin/env python3
"""Compare check-trace's verdicts on replayed vLLM traces with vLLM's own
ground truth (flightcheck/vllm/README.md, "Ground truth from vLLM's own state").

    flightcheck vllm replay campaign.jsonl --trace traces/ --json > results.json
    scripts/vllm-verdicts.py results.json traces/

For each workload the ground truth says where a correct checker must reject,
independently of the checker (verification/traces/ground_truth.py).
It prints one line per disagreement and a summary; exit 0 when every verdict
agrees with the ground truth.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path
from typing import Any

from flightcheck.verification.traces.check import MalformedTrace, check_events, read_events
from flightcheck.verification.traces.ground_truth import expected_verdict


def main(results_path: str, traces: str, profile: str | None = None) -> int:
    results = json.loads(Path(results_path).read_text())["workloads"]
    tally: collections.Counter[str] = collections.Counter()
    bad = 0
    for result in results:
        path = Path(traces) / f"{result['name']}.jsonl"
        lines = path.read_text().split("\n")
        try:
            events = read_events(lines)
            verdict = check_events(events, profile) if profile else check_events(events)
        except MalformedTrace as err:
            tally["malformed"] += 1
            bad += 1
            print(f"{result['name']}: malformed: {err}")
            continue
        expected = expected_verdict(result, events)
        kind, latest, got = expected.kind, expected.latest, verdict.event_index
        agree = expected.agrees(verdict)
        tally[f"{kind}: {'agrees' if agree else 'DISAGREES'}"] += 1
        if not agree:
            bad += 1
            print(f"{result['name']}: ground truth {kind} (reject by event {latest}), check-trace "
                  f"{'legal' if verdict.ok else f'rejects at {got} ({verdict.property}: {verdict.message})'}")
    for key, count in sorted(tally.items()):
        print(f"{count:5d}  {key}")
    print(f"{len(results) - bad} of {len(results)} verdicts agree with vLLM's ground truth")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
