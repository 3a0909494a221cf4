"""Progress of a long command, phase by phase, on stderr (stdout keeps the
report, or pure JSON under `--json`).

On a terminal: one live line, the current phase with the seconds it has run
and the seconds since the command began, gone when the command finishes.
Elsewhere (a file, a pipe, CI's log): one line per phase as it begins, with
the seconds since the command began, and one when it ends; so a log shows
what ran, and where a slow run spends its time, without a terminal's
control codes."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from rich.console import Console
from rich.progress import Progress, ProgressColumn, SpinnerColumn, Task, TextColumn
from rich.text import Text


class _Seconds(ProgressColumn):
    """Seconds the current phase has run, and since the command began."""

    def __init__(self, started: float) -> None:
        super().__init__()
        self.started = started

    def render(self, task: Task) -> Text:
        total = time.perf_counter() - self.started
        return Text(f"{task.elapsed or 0.0:.0f} s (total {total:.0f} s)", style="progress.elapsed")


class PhaseProgress:
    """`with PhaseProgress("verify (vllm-0.8.5)") as progress: progress.phase("k-induction")`;
    `stream` (default stderr) is where it goes, live when it is a terminal."""

    def __init__(self, title: str, stream: TextIO | None = None) -> None:
        self.title = title
        self.stream = stream if stream is not None else sys.stderr
        self.live = self.stream.isatty()
        self.started = time.perf_counter()
        self._bar: Progress | None = None
        self._task = None

    def __enter__(self) -> "PhaseProgress":
        self.started = time.perf_counter()
        if self.live:
            console = Console(file=self.stream)
            self._bar = Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), _Seconds(self.started),
                                 console=console, transient=True)
            self._bar.start()
            self._task = self._bar.add_task(self.title, total=None)
        return self

    def phase(self, name: str) -> None:
        """A new phase begins (the previous one, if any, has ended)."""
        if self._bar is not None:
            self._bar.reset(self._task, description=f"{self.title}: {name}")
        else:
            self._line(name)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
        else:
            self._line("done" if exc[0] is None else "stopped")

    def _line(self, what: str) -> None:
        self.stream.write(f"{self.title} [{time.perf_counter() - self.started:7.1f} s] {what}\n")
        self.stream.flush()
