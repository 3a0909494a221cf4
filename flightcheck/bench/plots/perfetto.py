"""A trace's pipeline timeline as Chrome/Perfetto trace-event JSON (open in
ui.perfetto.dev): one track per stage, one slice per batch, its entries in
the slice's arguments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flightcheck.output_files import write_text

from .trace_reader import TimelineData


def _describe(entries) -> str:
    parts = []
    for e in entries:
        kind = f"prefill [{e.start}:{e.start + e.n})" if e.is_prefill_chunk else "decode"
        parts.append(f"{e.req} {kind}")
    return ", ".join(parts)


def perfetto_events(data: TimelineData) -> dict[str, Any]:
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": f"pipeline ({data.policy})"}}]
    for s in range(data.num_stages):
        events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": s,
                       "args": {"name": f"stage {s}"}})
    for span in sorted(data.spans, key=lambda x: (x.stage, x.t0)):
        entries = data.batches.get(span.batch, [])
        chunks = [e for e in entries if e.is_prefill_chunk]
        name = f"batch {span.batch}" + (f" ({', '.join(e.req for e in chunks)} prefill)"
                                        if chunks else " (decode)")
        events.append({"ph": "X", "name": name, "cat": "stage", "pid": 1, "tid": span.stage,
                       "ts": span.t0 * 1e6, "dur": (span.t1 - span.t0) * 1e6,
                       "args": {"tokens": sum(e.n for e in entries),
                                "requests": len(entries), "entries": _describe(entries)}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_perfetto(data: TimelineData, path: str | Path) -> None:
    """Whole or not at all (output_files.write_whole)."""
    write_text(str(path), json.dumps(perfetto_events(data)))
