"""The reference's trace writer with times: every event gets `t` (seconds on
the run's clock, virtual or wall), and `stage` events record when each stage
ran each batch (docs/trace-format.md: `{"ev":"stage","batch","stage",
"t0","t1"}`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TextIO

from flightcheck.output_files import LineFile
from flightcheck.reference import TraceWriter


class TimedTraceWriter(TraceWriter):
    def __init__(self, sink: TextIO, now: Callable[[], float], **kwargs: Any) -> None:
        super().__init__(sink, **kwargs)
        self._now = now

    @classmethod
    def to_path(cls, path: str, now: Callable[[], float], **kwargs: Any) -> "TimedTraceWriter":  # type: ignore[override]
        """Written a whole line at a time, each as its event happens
        (output_files.LineFile): a run that dies leaves every line before it
        complete; `close()` raises OutputLost after a write error."""
        return cls(LineFile.open(path), now, **kwargs)

    def _write(self, event: dict[str, Any]) -> None:
        if "t" not in event and event.get("ev") != "end":
            event["t"] = round(self._now(), 7)
        super()._write(event)

    def stage(self, batch_id: int | None, stage: int, t0: float, t1: float,
              recv: float | None = None) -> None:
        """`recv` (optional): when the stage posted the receive of the
        batch's activations, so t0 - recv is the wait for the transfer."""
        event = {"ev": "stage", "batch": batch_id, "stage": stage,
                 "t0": round(t0, 7), "t1": round(t1, 7)}
        if recv is not None:
            event["recv"] = round(recv, 7)
        self._write(event)
