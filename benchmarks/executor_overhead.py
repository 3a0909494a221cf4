"""The executor seam's own cost per task (verification/executors), local
process pool against Ray, and what it buys on a real campaign.

Overhead: N empty tasks (`probes.echo`), after a warm-up batch that starts
the workers, timed two ways on each executor:

* throughput: all N submitted at once; wall time / N;
* round trip: one at a time, each waited for; wall time / N.

With --fuzz, `flightcheck fuzz --seeds` (as the command runs it) on 1 and on
2 workers of each executor: the same seeds, the wall time of each.

    python benchmarks/executor_overhead.py [--tasks 400] [--workers 2] [--fuzz] [--fuzz-seeds 0-3]
        [--fuzz-steps 2000] [--json]

Ray runs on an instance started here (`ray.init(num_cpus=WORKERS)`); Ray is
the optional cluster extra. Prints the machine, its load (`uptime`) and the
date with the figures, as docs/cluster.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone

from flightcheck.verification import executors
from flightcheck.verification.executors import Task, probes


def per_task_seconds(executor: executors.Executor, tasks: int) -> dict[str, float]:
    """Throughput and round-trip cost per task, in milliseconds."""
    executor.map([Task((i,), probes.echo, (i,)) for i in range(20)])          # warm-up: workers started
    started = time.perf_counter()
    assert executor.map([Task((i,), probes.echo, (i,)) for i in range(tasks)]) == list(range(tasks))
    throughput = (time.perf_counter() - started) / tasks
    rounds = max(1, tasks // 4)
    started = time.perf_counter()
    for i in range(rounds):
        executor.map([Task((i,), probes.echo, (i,))])
    round_trip = (time.perf_counter() - started) / rounds
    return {"throughput_ms": round(1000 * throughput, 2), "round_trip_ms": round(1000 * round_trip, 2)}


def start_ray(cpus: int) -> float:
    """A Ray instance of `cpus` CPUs started here; the seconds it took."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    started = time.perf_counter()
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False,
             logging_level=logging.ERROR, object_store_memory=100 * 1024 * 1024)
    return time.perf_counter() - started


def overhead(tasks: int, workers: int) -> dict[str, dict[str, float]]:
    with executors.open_executor(workers, kind="local") as local:
        out = {"local": per_task_seconds(local, tasks)}
    ray_start = start_ray(workers)
    with executors.open_executor(workers, kind="ray") as on_ray:
        out["ray"] = per_task_seconds(on_ray, tasks) | {"instance_start_s": round(ray_start, 1)}
    return out


def fuzz_wall_times(seeds: str, steps: int) -> list[dict[str, object]]:
    """`flightcheck fuzz --seeds` on 1 and 2 workers of each executor (Ray: an
    instance of that many CPUs, joined by address); seconds of the command
    and of its tasks (the command's own "seconds": start-up excluded)."""
    import ray

    rows = []
    for workers in (1, 2):
        argv = [sys.executable, "-m", "flightcheck.cli", "fuzz", "--seeds", seeds, "--steps", str(steps), "--json"]
        start_ray(workers)
        address = ray.get_runtime_context().gcs_address
        for name, extra in (("local", ["--jobs", str(workers)]),
                            ("ray", ["--executor", "ray", "--ray-address", address])):
            started = time.perf_counter()
            done = subprocess.run(argv + extra, capture_output=True, text=True, check=True,
                                  env={**os.environ, "RAY_AUTH_MODE": "token"})
            report = json.loads(done.stdout)
            rows.append({"executor": name, "workers": workers, "tasks": report["tasks"],
                         "command_s": round(time.perf_counter() - started, 1), "tasks_s": report["seconds"]})
        ray.shutdown()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=400)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--fuzz", action="store_true", help="also time fuzz --seeds on 1 and 2 workers")
    parser.add_argument("--fuzz-seeds", default="0-3")
    parser.add_argument("--fuzz-steps", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    report: dict[str, object] = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
        "load_before": load, "tasks": args.tasks, "workers": args.workers,
        "overhead": overhead(args.tasks, args.workers)}
    if args.fuzz:
        report["fuzz"] = fuzz_wall_times(args.fuzz_seeds, args.fuzz_steps)
    report["load_after"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"{report['date']}; {report['machine']}; load before: {load}")
    for name, figures in report["overhead"].items():
        print(f"{name:5s}: {figures['throughput_ms']:.2f} ms/task in a batch of {args.tasks}, "
              f"{figures['round_trip_ms']:.2f} ms/task one at a time"
              + (f"; instance started in {figures['instance_start_s']} s" if "instance_start_s" in figures else ""))
    for row in report.get("fuzz", []):
        print(f"fuzz --seeds {args.fuzz_seeds} --steps {args.fuzz_steps} on {row['workers']} {row['executor']} "
              f"worker(s): {row['command_s']} s (tasks {row['tasks_s']} s)")
    print(f"load after: {report['load_after']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
