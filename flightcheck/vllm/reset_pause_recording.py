"""The recorder's reset and pause events (a mixin of recording.py's
RecordingMixin; docs/trace-format.md, "Reset and pause"): vLLM 0.33 and
0.34's `Scheduler.reset_prefix_cache` and `set_pause_state`, called between
engine steps, written as `reset` (the running requests it preempted, tail
first, as vLLM pops them; whether the KV connector's cache was reset too,
`reset_connector`; its return value) and `pause` events."""

from __future__ import annotations

from typing import Any

PAUSE_NAMES = {0: "none", 1: "new", 2: "all"}    # PauseState's values


class ResetPauseRecording:
    running: list[Any]
    _fc_write: Any

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        preempted = [r.request_id for r in reversed(self.running)] if reset_running_requests else []
        event = {"ev": "reset", "running": bool(reset_running_requests), "connector": bool(reset_connector),
                 "preempted": preempted}
        try:
            ok = super().reset_prefix_cache(reset_running_requests, reset_connector)   # type: ignore[misc]
        except RuntimeError:
            # with the running requests reset, a cache vLLM could not reset raises, after the
            # preemptions (a streaming session between turns holds blocks), before the
            # connector's reset: the reset happened, not ok
            self._fc_write({**event, "ok": False})
            raise
        self._fc_write({**event, "ok": bool(ok)})
        return ok

    def set_pause_state(self, pause_state: Any) -> None:
        super().set_pause_state(pause_state)                                      # type: ignore[misc]
        self._fc_write({"ev": "pause", "state": PAUSE_NAMES[int(pause_state)]})
