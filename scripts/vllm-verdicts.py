#!/usr/bin/env python3
"""Compare check-trace's verdicts on replayed vLLM traces with vLLM's own
ground truth (flightcheck/vllm/README.md, "Ground truth from vLLM's own state").

    flightcheck vllm replay campaign.jsonl --trace traces/ --json > results.json
    scripts/vllm-verdicts.py results.json traces/

For each workload the ground truth says where a correct checker must reject,
independently of the checker:
* a stale token or a token sampled for a partial chunk: at the `complete`
  event of the batch that applies it;
* a request missing from 0.8.4's in-flight set while its batch is in flight
  (a stale completion cleared it): at the first `schedule` that schedules it
  again, the schedule the missing id allows; an extra id (0.8.4's counter
  drift) holds the engine back and shows at `end` only if the run sticks;
(with several, at the first of them);
* a run that ends stuck (0.8.4's counter drift) or blocked with batches in
  flight: at the `end` event;
* an exception inside vLLM with none of the above before it: at or before
  the trace's last event;
* none of these: the trace is legal.
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


def expected_verdict(result: dict[str, Any], events: list[dict[str, Any]]) -> tuple[str, int | None, int | None]:
    """(kind, earliest index, latest index) the checker must reject within;
    ("legal", None, None) for a correct run."""
    truth = result["ground_truth"]
    completes = {e.get("batch"): i for i, e in enumerate(events) if e["ev"] == "complete"}
    exact: list[int] = []
    for record in truth["stale_tokens"] + truth["partial_chunk_tokens"]:
        if record.get("batch") in completes:
            exact.append(completes[record["batch"]])
    for record in truth["in_flight_set_mismatches"]:
        # Only a request missing from the set while its batch is in flight (a
        # stale completion cleared it) lets the scheduler misbehave: at the
        # first schedule that schedules it again. An extra id (the counter
        # drift) only holds the engine back, which shows at `end` if it sticks.
        missing = set(record.get("missing", []))
        step = record.get("step", 0)
        again = [i for i, e in enumerate(events) if e["ev"] == "schedule" and e.get("step", -1) >= step
                 and missing & {x["req"] for x in e["entries"]}]
        if again:
            exact.append(again[0])
    last = len(events) - 1
    if exact:
        return "bug", min(exact), min(exact)    # at the event of the first bug, not before it
    if result["ending"] == "exception":
        return "exception", None, last          # the trace stops where vLLM raised
    if result["ending"] in ("stuck", "blocked_in_flight") and events[-1]["ev"] == "end":
        return result["ending"], last, last
    return "legal", None, None


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
        kind, earliest, latest = expected_verdict(result, events)
        got = verdict.event_index
        if kind == "legal":
            agree = verdict.ok
        else:
            agree = (not verdict.ok and got is not None and (earliest is None or got >= earliest)
                     and got <= latest)    # type: ignore[operator]
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
