"""Read what a timeline needs from a trace (docs/trace-format.md): the batches' entries
(from `schedule` events) and when each stage ran each batch (`stage`
events). Works for any writer: simulator, runtime, or another engine."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..workload import WorkloadError


@dataclass(frozen=True)
class Entry:
    req: str
    start: int
    n: int
    samples: bool
    prefill: bool            # the entry computes prompt tokens (start < prompt length)

    @property
    def is_prefill_chunk(self) -> bool:
        return self.prefill


@dataclass(frozen=True)
class Span:
    batch: int
    stage: int
    t0: float
    t1: float


@dataclass
class TimelineData:
    num_stages: int
    policy: str
    batches: dict[int, list[Entry]] = field(default_factory=dict)
    spans: list[Span] = field(default_factory=list)
    prompt_lens: dict[str, int] = field(default_factory=dict)
    # When the engine scheduled each batch and when it took its output back
    # (the events' optional "t"): what a batch in flight means to the engine.
    scheduled_at: dict[int, float] = field(default_factory=dict)
    completed_at: dict[int, float] = field(default_factory=dict)
    # Output placeholders after the schedule, by (batch, request), where the
    # writer records them (vLLM 0.33's AsyncScheduler, issue 22).
    placeholders: dict[tuple[int, str], int] = field(default_factory=dict)

    def chunks_of(self, req: str) -> list[tuple[int, Entry]]:
        """(batch, entry) of each prefill chunk of `req`, in batch order."""
        return [(b, e) for b, es in sorted(self.batches.items()) for e in es
                if e.req == req and e.prefill]


def _entry(e: dict, prompt_lens: dict[str, int]) -> Entry:
    start, n, samples = int(e["start"]), int(e["n"]), bool(e.get("samples", True))
    known = prompt_lens.get(e["req"])
    prefill = start < known if known is not None else (n > 1 or not samples)
    return Entry(e["req"], start, n, samples, prefill)


def is_trace_file(path: str | Path) -> bool:
    """A JSON Lines trace starts with an object that has an "ev" key."""
    with open(path, encoding="utf-8") as f:
        first = f.readline().strip()
    try:
        return isinstance(json.loads(first), dict) and "ev" in json.loads(first)
    except json.JSONDecodeError:
        return False


def _check_floats(ev: object) -> None:
    """OverflowError if a time the timeline reads (t, t0, t1) is an integer
    past float range (1 followed by 309 zeros is valid JSON)."""
    if isinstance(ev, dict):
        for key in ("t", "t0", "t1"):
            if isinstance(ev.get(key), int):
                float(ev[key])


def read_timeline(path: str | Path) -> TimelineData:
    p = Path(path)
    if not p.is_file():
        raise WorkloadError(f"trace file not found: {p}")
    data = TimelineData(num_stages=1, policy="")
    with p.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                ev = json.loads(line)
            except json.JSONDecodeError as err:
                raise WorkloadError(f"{p}:{line_no}: not JSON: {err.msg}") from None
            try:
                _check_floats(ev)
            except OverflowError:
                raise WorkloadError(f"{p}:{line_no}: a number beyond float range (check-trace names "
                                    f"the field)") from None
            kind = ev.get("ev")
            if kind == "config":
                data.num_stages = int(ev.get("num_stages", 1))
                data.policy = str(ev.get("policy", ""))
            elif kind == "arrive":
                data.prompt_lens[ev["req"]] = int(ev.get("prompt_len", 0))
            elif kind == "schedule" and ev.get("batch") is not None:
                batch = int(ev["batch"])
                data.batches[batch] = [_entry(e, data.prompt_lens)
                                       for e in ev.get("entries", [])]
                if isinstance(ev.get("t"), (int, float)):
                    data.scheduled_at[batch] = float(ev["t"])
                for e in ev.get("entries", []):
                    if isinstance(e.get("placeholders"), int):
                        data.placeholders[(batch, e["req"])] = e["placeholders"]
            elif (kind == "complete" and ev.get("batch") is not None
                  and isinstance(ev.get("t"), (int, float))):
                data.completed_at[int(ev["batch"])] = float(ev["t"])
            elif kind == "stage":
                try:
                    data.spans.append(Span(int(ev["batch"]), int(ev["stage"]),
                                           float(ev["t0"]), float(ev["t1"])))
                except (KeyError, TypeError, ValueError):
                    raise WorkloadError(f"{p}:{line_no}: a stage event needs batch, stage, "
                                        f"t0 and t1") from None
    if not data.spans:
        raise WorkloadError(f"{p}: no stage events (a timeline needs {{\"ev\":\"stage\", "
                            f"\"batch\", \"stage\", \"t0\", \"t1\"}} lines)")
    return data


def most_chunked_request(data: TimelineData) -> str | None:
    """The request with the most prefill chunks (the interesting one to show)."""
    counts: dict[str, int] = {}
    for entries in data.batches.values():
        for e in entries:
            if e.prefill:
                counts[e.req] = counts.get(e.req, 0) + 1
    if not counts:
        return None
    return max(counts, key=lambda r: (counts[r], data.prompt_lens.get(r, 0)))
