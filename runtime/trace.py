"""Runtime traces: the reference scheduler's events (its `TraceWriter`), each
stamped with `t` (seconds since the run started), plus `stage` events with
every stage's start and end time for every batch, in flightcheck's trace format (docs/trace-format.md).

`chrome_trace(events)` turns a trace into Chrome / Perfetto trace JSON (one
track per stage, one slice per batch, the driver's schedule and complete
events as instants), and `pipeline_stats(events)` measures busy time and the
bubble fraction per stage.

Times come from `time.time()` in each process: on one machine they share a
clock; across machines (torchrun on several nodes) they are as good as the
nodes' clock synchronisation.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from typing import Any, TextIO

from flightcheck.output_files import LineFile, write_text
from flightcheck.reference import TraceWriter


class RuntimeTraceWriter(TraceWriter):
    """The reference writer, with `t` on every event and `stage` events."""

    def __init__(self, sink: TextIO, *, t_base: float | None = None, **kwargs: Any) -> None:
        super().__init__(sink, **kwargs)
        self.t_base = time.time() if t_base is None else t_base

    @classmethod
    def to_path(cls, path: str, **kwargs: Any) -> "RuntimeTraceWriter":  # type: ignore[override]
        """Written a whole line at a time, each as its event happens
        (output_files.LineFile): a run that dies leaves every line before
        it complete; `close()` raises OutputLost after a write error."""
        return cls(LineFile.open(path), **kwargs)

    def _write(self, event: dict[str, Any]) -> None:
        if "t" not in event and event.get("ev") not in ("config", "end", "stage"):
            event = {**event, "t": round(time.time() - self.t_base, 6)}
        super()._write(event)

    def stage(self, batch_id: int, stage: int, t0: float, t1: float,
              recv: float | None = None) -> None:
        """t0, t1: absolute `time.time()` values from the stage's process
        (compute start and end); recv: when it posted the receive of the
        batch's activations (stages after the first)."""
        event = {"ev": "stage", "batch": batch_id, "stage": stage,
                 "t0": round(t0 - self.t_base, 6), "t1": round(t1 - self.t_base, 6)}
        if recv is not None and recv < t0:
            event["recv"] = round(recv - self.t_base, 6)
        self._write(event)

    def stages(self, batch_id: int, times: list[tuple[float, float, float]]) -> None:
        for s, (t0, t1, recv) in enumerate(times):
            self.stage(batch_id, s, t0, t1, recv if s > 0 else None)


def read_trace(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def pipeline_stats(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Per stage: busy seconds; over the run's window (first stage start to
    last stage end): bubble fraction = idle stage time / (K * window)."""
    stages = [e for e in events if e["ev"] == "stage"]
    if not stages:
        return {"num_stages": 0, "window_s": 0.0, "busy_s": [], "bubble_fraction": None}
    K = 1 + max(e["stage"] for e in stages)
    busy = [0.0] * K
    for e in stages:
        busy[e["stage"]] += e["t1"] - e["t0"]
    window = max(e["t1"] for e in stages) - min(e["t0"] for e in stages)
    bubble = 1.0 - sum(busy) / (K * window) if window > 0 else 0.0
    return {"num_stages": K, "window_s": window, "busy_s": busy, "bubble_fraction": bubble,
            "num_batches": len({e["batch"] for e in stages})}


def hop_times(events: list[dict[str, Any]]) -> list[float]:
    """Per batch and hop: stage s + 1's start minus stage s's end (transfer
    plus any wait for stage s + 1 to finish its previous batch)."""
    by_batch: dict[Any, dict[int, tuple[float, float]]] = defaultdict(dict)
    for e in events:
        if e["ev"] == "stage":
            by_batch[e["batch"]][e["stage"]] = (e["t0"], e["t1"])
    gaps = []
    for times in by_batch.values():
        for s in range(len(times) - 1):
            if s in times and s + 1 in times:
                gaps.append(times[s + 1][0] - times[s][1])
    return gaps


def transfer_times(events: list[dict[str, Any]]) -> list[float]:
    """Per batch and hop, an estimate of the transfer alone: stage s + 1's
    start minus the later of stage s's end and the moment stage s + 1
    posted its receive (gloo moves the data once both sides are there)."""
    stage = {(e["batch"], e["stage"]): e for e in events if e["ev"] == "stage"}
    out = []
    for (b, s), e in stage.items():
        prev = stage.get((b, s - 1))
        if prev is not None and "recv" in e:
            out.append(e["t0"] - max(e["recv"], prev["t1"]))
    return out


def chrome_trace(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Chrome trace event format (load in ui.perfetto.dev or chrome://tracing)."""
    out: list[dict[str, Any]] = [
        {"ph": "M", "pid": 1, "tid": 0, "name": "process_name", "args": {"name": "flightcheck run"}},
        {"ph": "M", "pid": 1, "tid": 0, "name": "thread_name", "args": {"name": "driver"}}]
    stages = sorted({e["stage"] for e in events if e["ev"] == "stage"})
    for s in stages:
        out.append({"ph": "M", "pid": 1, "tid": s + 1, "name": "thread_name",
                    "args": {"name": f"stage {s}"}})
    sizes = {e["batch"]: sum(x["n"] for x in e["entries"]) for e in events
             if e["ev"] == "schedule" and e.get("batch") is not None}
    for e in events:
        ev = e["ev"]
        if ev == "stage":
            out.append({"ph": "X", "pid": 1, "tid": e["stage"] + 1, "name": f"batch {e['batch']}",
                        "ts": e["t0"] * 1e6, "dur": max(0.0, e["t1"] - e["t0"]) * 1e6,
                        "args": {"batch": e["batch"], "tokens": sizes.get(e["batch"])}})
        elif ev in ("schedule", "complete", "abort", "finish") and "t" in e:
            name = f"{ev} {e.get('batch', e.get('req', ''))}"
            args = {k: v for k, v in e.items() if k in ("entries", "preempted", "tokens", "reason")}
            out.append({"ph": "i", "s": "t", "pid": 1, "tid": 0, "name": name,
                        "ts": e["t"] * 1e6, "args": args})
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def write_chrome_trace(trace_path: str, out_path: str) -> None:
    write_chrome_events(read_trace(trace_path), out_path)


def write_chrome_events(events: list[dict[str, Any]], out_path: str) -> None:
    """The Chrome trace of `events`, written whole or not at all (a
    temporary file renamed into place: output_files.write_whole)."""
    write_text(out_path, json.dumps(chrome_trace(events)))
