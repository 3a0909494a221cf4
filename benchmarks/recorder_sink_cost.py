"""What streaming the trace costs vLLM's engine: the time per engine step
(the replay's busy-loop steps: a `schedule()` and/or an `update_from_output()`) of
vLLM's scheduler with the recorder (flightcheck/vllm/recording.py), writing

* nothing (neither FLIGHTCHECK_TRACE nor FLIGHTCHECK_TRACE_SINK set): the
  recorder's own bookkeeping, the baseline;
* FLIGHTCHECK_TRACE=FILE: the plain file, written in the engine's thread;
* FLIGHTCHECK_TRACE_SINK=file:PATH: streamed through the bounded buffer;
* FLIGHTCHECK_TRACE_SINK=unix:PATH: streamed to a reader that drains the
  socket (a thread of this script, as `flightcheck monitor` would);

and vLLM's plain scheduler (no recorder) for scale. One replay worker per
setting (the recorder reads its environment when the scheduler is built),
the same workload, the median of `--repeats` replays, the settings
taking turns; CPU time is the worker process's, every thread (the drain
thread's included).

    python benchmarks/recorder_sink_cost.py [--version 0.33.0] [--requests 64] [--outputs 512] [--repeats 5] [--json] [--write-path-only]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from flightcheck.vllm.replay import ReplayWorker
from flightcheck.vllm.sinks import SINK_ENV, StreamedTrace, connector, parse_sink
from flightcheck.vllm.trace import TRACE_ENV, TraceFile


COMMITTED = Path(__file__).resolve().parent.parent / "tests/data/vllm/traces-0.33/id-reuse-wrong-binding-fresh-id.jsonl"


def workload(requests: int, outputs: int) -> dict[str, Any]:
    """Decode-heavy: `requests` prompts of 64 tokens, `outputs` outputs each, two stages."""
    blocks = (64 + outputs + 15) // 16 + 1
    return {"name": f"sink-cost-{requests}", "seed": 0,
            "config": {"num_stages": 2, "max_num_batched_tokens": 512, "max_num_seqs": requests,
                       "block_size": 16, "num_blocks": blocks * requests + 1, "max_model_len": 64 + outputs + 16,
                       "prefix_caching": False},
            "requests": [{"id": str(i), "prompt_len": 64, "max_tokens": outputs} for i in range(requests)]}


def drain_socket(path: str) -> multiprocessing.Process:
    """A reader in its own process (as `flightcheck monitor` is) that accepts
    the recorder's connections and reads each to its end."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)

    def serve() -> None:
        while True:
            connection, _ = listener.accept()
            with connection:
                while connection.recv(1 << 16):
                    pass
    reader = multiprocessing.get_context("fork").Process(target=serve, daemon=True)
    reader.start()
    listener.close()
    return reader


def cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time so far (/proc/PID/stat), all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_worker(version: str, env: dict[str, str]) -> ReplayWorker:
    """A replay worker whose recorder reads `env` (and neither variable otherwise)."""
    saved = {key: os.environ.pop(key, None) for key in (TRACE_ENV, SINK_ENV)}
    os.environ.update(env)
    try:
        return ReplayWorker(version)
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None)
            if value is not None:
                os.environ[key] = value


def measure(workers: dict[str, tuple[ReplayWorker, bool, str | None]], raw: dict[str, Any],
            repeats: int) -> dict[str, dict[str, float]]:
    """Per setting, the median wall and CPU seconds per engine step; the
    settings take turns, so a change of the machine's load hits them all."""
    wall: dict[str, list[float]] = {name: [] for name in workers}
    cpu: dict[str, list[float]] = {name: [] for name in workers}
    for worker, recorder, trace in workers.values():
        worker.replay(raw, trace=trace, recorder=recorder)        # warm up
    for _ in range(repeats):
        for name, (worker, recorder, trace) in workers.items():
            pid = worker._process.pid
            cpu0, wall0 = cpu_seconds(pid), time.perf_counter()
            result = worker.replay(raw, trace=trace, recorder=recorder)
            wall[name].append((time.perf_counter() - wall0) / result["steps"])
            cpu[name].append((cpu_seconds(pid) - cpu0) / result["steps"])
    return {name: {"wall": statistics.median(wall[name]), "cpu": statistics.median(cpu[name])} for name in workers}


def write_path(scratch: Path, events: list[dict[str, Any]], repeats: int) -> dict[str, float]:
    """Without vLLM: microseconds per event in the writing thread, for the
    events of a recorded trace written over and over (TraceFile to a file;
    StreamedTrace to a file and to the drained socket, its drain thread
    running beside the writer)."""
    def timed(make: Any) -> float:
        samples = []
        for _ in range(repeats):
            trace = make()
            start = time.perf_counter()
            for _ in range(20):
                for event in events:
                    trace.write(dict(event))
            samples.append((time.perf_counter() - start) / (20 * len(events)))
            trace.close()
        return 1e6 * statistics.median(samples)
    return {"TraceFile (FLIGHTCHECK_TRACE)": timed(lambda: TraceFile.open(str(scratch / "w.jsonl"))),
            "StreamedTrace, file:": timed(lambda: StreamedTrace(connector(parse_sink(f"file:{scratch / 's.jsonl'}")))),
            "StreamedTrace, unix: (drained)": timed(
                lambda: StreamedTrace(connector(parse_sink(f"unix:{scratch / 'reader.sock'}"))))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--version", default="0.33.0")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--outputs", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write-path-only", action="store_true",
                        help="only the write path, without vLLM (a committed 0.33.0 trace's events)")
    args = parser.parse_args()
    raw = workload(args.requests, args.outputs)
    scratch = Path(tempfile.mkdtemp(prefix="flightcheck-sink-cost-"))
    drain_socket(str(scratch / "reader.sock"))
    if args.write_path_only:
        events = [json.loads(line) for line in COMMITTED.read_text().splitlines()]
        for name, us in write_path(scratch, events, args.repeats).items():
            print(f"  {name:34} {us:6.2f} us/event")
        return
    # (the environment the worker starts with, recorder or not, the replay's
    # FLIGHTCHECK_TRACE: the worker sets it per replay from its `trace`)
    settings = {
        "plain scheduler (no recorder)": ({}, False, None),
        "recorder, no output": ({}, True, None),
        "recorder, FLIGHTCHECK_TRACE file": ({}, True, str(scratch / "plain.jsonl")),
        "recorder, sink file:": ({SINK_ENV: f"file:{scratch / 'streamed.jsonl'}"}, True, None),
        "recorder, sink unix: (drained)": ({SINK_ENV: f"unix:{scratch / 'reader.sock'}"}, True, None),
    }
    workers = {name: (start_worker(args.version, env), recorder, trace)
               for name, (env, recorder, trace) in settings.items()}
    try:
        timings = measure(workers, raw, args.repeats)
    finally:
        for worker, _, _ in workers.values():
            worker.close()
    print(json.dumps(timings), file=sys.stderr, flush=True)     # kept, whatever follows
    recorded = [json.loads(line) for line in (scratch / "plain.jsonl").read_text().splitlines()]
    per_event = write_path(scratch, recorded[:2000], args.repeats)
    base = timings["recorder, no output"]
    rows = [{"setting": name, "wall_us_per_step": round(1e6 * t["wall"], 1),
             "cpu_us_per_step": round(1e6 * t["cpu"], 1),
             "cpu_added_us": round(1e6 * (t["cpu"] - base["cpu"]), 1)} for name, t in timings.items()]
    steps = max(e.get("engine_step", 0) for e in recorded) or max(e.get("step", 0) for e in recorded)
    if args.json:
        print(json.dumps({"per_step": rows, "write_path_us_per_event": per_event,
                          "events_per_step": round(len(recorded) / steps, 3)}, indent=1))
        return
    print(f"vLLM {args.version}, {args.requests} requests x {args.outputs} outputs, median of {args.repeats} "
          f"(per engine step; CPU: the worker process, every thread)")
    for row in rows:
        print(f"  {row['setting']:34} wall {row['wall_us_per_step']:8.1f} us   CPU {row['cpu_us_per_step']:8.1f} us"
              f"   ({row['cpu_added_us']:+.1f} us CPU over the recorder with no output)")
    print(f"the write path alone (no vLLM), per event in the writing thread; "
          f"{len(recorded) / steps:.2f} events per engine step in this trace:")
    for name, us in per_event.items():
        print(f"  {name:34} {us:6.2f} us/event")


if __name__ == "__main__":
    main()
