#!/usr/bin/env python3
"""What an extra id in vLLM 0.8.4's `scheduled_req_ids` did, engine step by
engine step: replays a campaign's workloads through vLLM 0.8.4's scheduler
and our copy of its engine loop (flightcheck/vllm/engine.py) and, before
each step, compares the set with the requests that really have an entry in
a batch in flight (the recorder's own record, ground_truth.py).

Run with the vLLM 0.8.4 venv's interpreter (it imports vLLM in-process,
as the replay worker does), the repository root on the path:

    PYTHONPATH=. ~/.cache/flightcheck/vllm-0.8.4/bin/python scripts/inflight-drift-probe.py \\
        --seed 305 --workloads 120 --spec-tokens 2 --reuse-ids

0.8.4 reads the set in two places: `Scheduler.schedule`'s running loop
skips a request in it, and `EngineCore.step_with_batch_queue` schedules only
while `get_num_unscheduled_requests() > 0` (the gate). Prints each run in
which an extra id sat on a running request (the skip would read it) or
changed the gate with room in the batch queue, with the run's findings
(replay.py `findings`), then one JSON line of counts; exit 1 when a run's
gate was changed by an extra id and the run has no finding at all.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from flightcheck.vllm import engine, replay_worker
from flightcheck.vllm.generate import campaign_workloads
from flightcheck.vllm.replay import findings

STEPS: list[dict[str, Any]] = []


def _probed_step(step: Any) -> Any:
    """`BatchQueueEngine.step_with_batch_queue`, noting first what the extra ids were and did."""

    def probed(self: Any) -> bool:
        scheduler = self.scheduler
        marked = set(getattr(scheduler, "scheduled_req_ids", ()))
        in_flight = {entry.req_id for batch in scheduler._fc_in_flight.values() for entry in batch.entries
                     if scheduler.requests.get(entry.req_id) is entry.request}
        extra = marked - in_flight
        if extra:
            unfinished = scheduler.get_num_unfinished_requests()
            gate_changed = (unfinished - len(marked) > 0) != (unfinished - len(marked & in_flight) > 0)
            STEPS.append({"engine_step": self.current_step, "extra": sorted(extra),
                          "on_running": sorted(extra & {r.request_id for r in scheduler.running}),
                          "gate_changed": gate_changed and len(self.batch_queue) < self.depth})
        return step(self)

    return probed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--workloads", type=int, default=100)
    parser.add_argument("--spec-tokens", type=int, default=0)
    parser.add_argument("--reuse-ids", action="store_true")
    args = parser.parse_args(argv)
    engine.BatchQueueEngine.step_with_batch_queue = _probed_step(engine.BatchQueueEngine.step_with_batch_queue)
    factory = replay_worker.SchedulerFactory()
    counts = {"runs": 0, "with_extra": 0, "on_running": 0, "gate_changed": 0, "gate_changed_without_finding": 0}
    for raw in campaign_workloads(args.seed, args.workloads, args.reuse_ids, args.spec_tokens):
        STEPS.clear()
        result = replay_worker.replay_one(factory, {"workload": raw, "trace": None, "recorder": True})
        counts["runs"] += 1
        if not STEPS:
            continue
        counts["with_extra"] += 1
        on_running = [s for s in STEPS if s["on_running"]]
        changed = [s for s in STEPS if s["gate_changed"]]
        counts["on_running"] += bool(on_running)
        counts["gate_changed"] += bool(changed)
        counts["gate_changed_without_finding"] += bool(changed) and not findings(result)
        if on_running or changed:
            print(json.dumps({"workload": raw["name"], "ending": result["ending"], "steps": (on_running or changed)[:3],
                              "gated_completions": result["gated_completions"][:3],
                              "findings": findings(result)[:2]}))
    print(json.dumps({"seed": args.seed, **counts}))
    return 1 if counts["gate_changed_without_finding"] else 0


if __name__ == "__main__":
    sys.exit(main())
