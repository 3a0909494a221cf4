"""One request's decodes through the pipeline (issue 22): PNG and Perfetto.

The top panel shows the request's decodes as the ENGINE sees them: a bar
from the `schedule()` that put the decode in a batch to the engine taking
that batch's output back (`complete`), in as many lanes as are needed so
that bars never overlap; under synchronous scheduling one lane suffices (the
next decode waits for the previous token), under vLLM 0.33's asynchronous
scheduling two decodes of the request are in flight at once, the later one
counted by an output placeholder. The bottom panel is the pipeline: one box
per batch per stage, the request's decodes in red and numbered, every other
batch grey, idle stages hatched.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flightcheck.output_files import write_text

from ..workload import WorkloadError
from .figure_file import save_figure
from .timeline import HIGHLIGHT, _pyplot
from .trace_reader import TimelineData

OTHER = "#c7c7c7"


@dataclass(frozen=True)
class Decode:
    index: int               # 1 = the request's first decode (after its prefill)
    batch: int
    scheduled: float         # engine time of the schedule() that formed the batch
    completed: float         # engine time the batch's output was taken back
    placeholders: int | None  # the request's output placeholders after that schedule()
    lane: int                # a row of the top panel in which no two bars overlap


def decodes_of(data: TimelineData, request: str) -> list[Decode]:
    """The request's decode entries in batch order, with their engine times."""
    prompt_len = data.prompt_lens.get(request)
    if prompt_len is None:
        raise WorkloadError(f"request {request!r} is not in the trace")
    rows = [(b, e) for b, entries in sorted(data.batches.items()) for e in entries
            if e.req == request and not e.prefill]
    lane_free: list[float] = []
    out = []
    for index, (batch, _) in enumerate(rows, 1):
        if batch not in data.scheduled_at or batch not in data.completed_at:
            raise WorkloadError(f"batch {batch} has no schedule or complete time (\"t\")")
        t0, t1 = data.scheduled_at[batch], data.completed_at[batch]
        lane = next((i for i, free in enumerate(lane_free) if free <= t0), len(lane_free))
        if lane == len(lane_free):
            lane_free.append(t1)
        lane_free[lane] = t1
        out.append(Decode(index, batch, t0, t1, data.placeholders.get((batch, request)), lane))
    return out


def max_in_flight(decodes: list[Decode]) -> int:
    """Most decodes of the request scheduled and not yet taken back at once."""
    points = sorted([(d.scheduled, 1) for d in decodes] + [(d.completed, -1) for d in decodes],
                    key=lambda p: (p[0], p[1]))
    level = best = 0
    for _, step in points:
        level += step
        best = max(best, level)
    return best


def window(decodes: list[Decode], first: int, count: int) -> tuple[list[Decode], float, float]:
    shown = [d for d in decodes if first <= d.index < first + count]
    if not shown:
        raise WorkloadError(f"the request has {len(decodes)} decodes; none from #{first}")
    start = min(d.scheduled for d in shown)
    end = max(d.completed for d in shown)
    pad = 0.04 * (end - start)
    return shown, start - pad, end + pad


def draw_decodes(data: TimelineData, request: str, path: str | Path, *, first: int = 4,
                 count: int = 6, title: str = "") -> tuple[float, float]:
    """Write the PNG of decodes #first..#first+count-1; returns the window."""
    plt = _pyplot()

    decodes = decodes_of(data, request)
    shown, w0, w1 = window(decodes, first, count)
    lanes = max(max(d.lane for d in shown) + 1, 2)
    k = data.num_stages
    fig, (top, bottom) = plt.subplots(
        2, 1, sharex=True, figsize=(13, 1.0 + 0.55 * lanes + 0.9 * k),
        gridspec_kw={"height_ratios": [lanes * 0.55, 0.9 * k]})
    _draw_lanes(top, shown, lanes, (w0, w1))
    top.set_title(title or f"{request}: its decodes from schedule() to the engine taking the "
                  f"output back (top), and through the stages (bottom)", fontsize=10)
    _draw_stages(bottom, data, {d.batch: d for d in decodes}, (w0, w1))
    _stage_legend(bottom, request)
    fig.tight_layout()
    try:
        save_figure(fig, path, dpi=110)
    finally:
        plt.close(fig)
    return w0, w1


def _draw_lanes(top, shown: list[Decode], lanes: int, window: tuple[float, float]) -> None:
    """Top panel: each shown decode from schedule() to its output taken back, one lane each."""
    from matplotlib.patches import Rectangle

    w0, w1 = window
    for d in shown:
        top.add_patch(Rectangle((d.scheduled, d.lane - 0.35), d.completed - d.scheduled, 0.7,
                                facecolor=HIGHLIGHT, alpha=0.85, edgecolor="black", linewidth=0.5))
        label = f"decode {d.index}" + (f"  ({d.placeholders} placeholder"
                                       f"{'s' if d.placeholders != 1 else ''})"
                                       if d.placeholders is not None else "")
        top.text(d.scheduled + 0.004 * (w1 - w0), d.lane, label, va="center", ha="left",
                 fontsize=7, color="white")
    top.set_ylim(-0.6, lanes - 0.4)
    top.set_yticks(range(lanes), [f"lane {i}" for i in range(lanes)])
    top.invert_yaxis()


def _draw_stages(bottom, data: TimelineData, ours: dict[int, Decode], window: tuple[float, float]) -> None:
    """Bottom panel: every stage's batches in the window (the request's
    decodes highlighted), and its idle time hatched."""
    from matplotlib.patches import Rectangle

    w0, w1 = window
    k = data.num_stages
    row_h = 0.8

    def idle(y: float, t0: float, t1: float) -> None:
        bottom.add_patch(Rectangle((t0, y - row_h / 2), t1 - t0, row_h, facecolor="none",
                                   edgecolor="#bbbbbb", hatch="///", linewidth=0))

    for stage in range(k):
        y = k - 1 - stage
        spans = sorted((s for s in data.spans if s.stage == stage and s.t1 > w0 and s.t0 < w1),
                       key=lambda s: s.t0)
        previous_end = w0
        for span in spans:
            if span.t0 - previous_end > 1e-4:
                idle(y, previous_end, span.t0)
            previous_end = max(previous_end, span.t1)
            mine = ours.get(span.batch)
            bottom.add_patch(Rectangle((span.t0, y - row_h / 2), span.t1 - span.t0, row_h,
                                       facecolor=HIGHLIGHT if mine else OTHER,
                                       edgecolor="black", linewidth=0.5))
            if mine is not None:
                bottom.text((span.t0 + span.t1) / 2, y, f"d{mine.index}", ha="center",
                            va="center", fontsize=7, color="white")
        if w1 - previous_end > 1e-4:
            idle(y, previous_end, w1)
    bottom.set_xlim(w0, w1)
    bottom.set_ylim(-0.6, k - 0.4)
    bottom.set_yticks(range(k), [f"stage {k - 1 - y}" for y in range(k)])
    bottom.set_xlabel("time (s)")


def _stage_legend(bottom, request: str) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=HIGHLIGHT, label=f"a batch with {request}'s decode"),
               Patch(facecolor=OTHER, label="other batches"),
               Patch(facecolor="none", edgecolor="#999999", hatch="///", label="idle stage")]
    bottom.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=3,
                  frameon=False)


def decode_perfetto_events(data: TimelineData, request: str) -> dict[str, Any]:
    """Stage tracks (one slice per batch) and, in a second process, the
    request's decodes in flight as the engine sees them, one track per lane."""
    decodes = decodes_of(data, request)
    ours = {d.batch: d for d in decodes}
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "pipeline stages"}},
        {"ph": "M", "name": "process_name", "pid": 2,
         "args": {"name": f"engine: {request}'s decodes in flight"}}]
    for s in range(data.num_stages):
        events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": s,
                       "args": {"name": f"stage {s}"}})
    for lane in range(max((d.lane for d in decodes), default=0) + 1):
        events.append({"ph": "M", "name": "thread_name", "pid": 2, "tid": lane,
                       "args": {"name": f"lane {lane}"}})
    for span in sorted(data.spans, key=lambda x: (x.stage, x.t0)):
        mine = ours.get(span.batch)
        name = f"batch {span.batch}" + (f" ({request} decode {mine.index})" if mine else "")
        events.append({"ph": "X", "name": name, "cat": "stage", "pid": 1, "tid": span.stage,
                       "ts": span.t0 * 1e6, "dur": (span.t1 - span.t0) * 1e6,
                       "args": {"tokens": sum(e.n for e in data.batches.get(span.batch, []))}})
    for d in decodes:
        events.append({"ph": "X", "name": f"{request} decode {d.index} (batch {d.batch})",
                       "cat": "engine", "pid": 2, "tid": d.lane, "ts": d.scheduled * 1e6,
                       "dur": (d.completed - d.scheduled) * 1e6,
                       "args": {"placeholders": d.placeholders}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_decode_perfetto(data: TimelineData, request: str, path: str | Path) -> None:
    write_text(str(path), json.dumps(decode_perfetto_events(data, request)))
