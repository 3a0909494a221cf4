"""Reset and pause events of a replay workload (vLLM 0.33 and 0.34;
spec/reset_pause.py, docs/request-states.md):

    "events": [{"step": 7, "reset": {"running": true}},
               {"step": 8, "reset": {"running": false, "connector": true}},
               {"step": 9, "pause": "all"}, {"step": 12, "pause": "none"}]

Each event is handed to the scheduler before engine step `step`, after that
step's arrivals and aborts (as `EngineCore.reset_prefix_cache` and
`set_pause_state` run from the input queue between steps): `reset` calls
`reset_prefix_cache(reset_running_requests=running,
reset_connector=connector)` (`connector` false unless given: with it the
KV connector's own cache is reset too, `Scheduler.reset_connector_cache`,
a no-op success without a connector; kv_transfers.py), `pause`
`set_pause_state` with "none" (UNPAUSED), "new" (PAUSED_NEW) or "all"
(PAUSED_ALL). Events of one step are handed over in the listed order. A
workload that pauses should unpause by its last event: a run that ends
paused leaves requests unfinished.

Standard library only (the replay worker reads it inside the vLLM venvs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .workload_limits import MAX_STEPS, LimitError, flag, show, unknown_keys, whole

PAUSE_STATES = ("none", "new", "all")          # PauseState.UNPAUSED, PAUSED_NEW, PAUSED_ALL
MAX_EVENTS = 10_000


@dataclass(frozen=True)
class WorkloadEvent:
    step: int
    reset_running: bool | None = None          # a reset: reset_running_requests
    reset_connector: bool = False              # a reset: reset_connector
    pause: str | None = None                   # a pause: one of PAUSE_STATES

    @property
    def pause_value(self) -> int:
        """`PauseState`'s integer value of a pause event."""
        return PAUSE_STATES.index(self.pause or "none")


def events_from_json(raw: Any) -> tuple[WorkloadEvent, ...]:
    """The workload's `events`, in step order (stable); LimitError naming the key path."""
    if not isinstance(raw, list):
        raise LimitError(f"events: must be a list, got {show(raw)}")
    whole("events", len(raw), 0, MAX_EVENTS, "events in one workload")
    events = [_event(item, f"events[{i}]") for i, item in enumerate(raw)]
    return tuple(sorted(events, key=lambda e: e.step))


def _event(raw: Any, where: str) -> WorkloadEvent:
    if not isinstance(raw, dict):
        raise LimitError(f"{where}: must be an object, got {show(raw)}")
    if set(raw) - {"step", "reset", "pause"}:
        raise LimitError(unknown_keys(where, set(raw) - {"step", "reset", "pause"}))
    step = whole(f"{where}.step", raw.get("step"), 0, MAX_STEPS)
    if ("reset" in raw) == ("pause" in raw):
        raise LimitError(f"{where}: must have one of 'reset' or 'pause'")
    if "pause" in raw:
        if raw["pause"] not in PAUSE_STATES:
            raise LimitError(f"{where}.pause: must be one of {', '.join(PAUSE_STATES)}, got {show(raw['pause'])}")
        return WorkloadEvent(step, pause=raw["pause"])
    reset = raw["reset"]
    if not isinstance(reset, dict) or set(reset) - {"running", "connector"}:
        raise LimitError(f"{where}.reset: must be an object {{\"running\": bool, \"connector\": bool}}, "
                         f"got {show(reset)}")
    return WorkloadEvent(step, reset_running=flag(f"{where}.reset.running", reset.get("running", False)),
                         reset_connector=flag(f"{where}.reset.connector", reset.get("connector", False)))


def call_event(scheduler: Any, event: WorkloadEvent, pause_state: Any = int) -> None:
    """Hand `event` to `scheduler` (vLLM's, or the reference's): `pause_state`
    turns a PauseState value into what its `set_pause_state` takes."""
    if event.pause is not None:
        scheduler.set_pause_state(pause_state(event.pause_value))
    else:
        scheduler.reset_prefix_cache(reset_running_requests=bool(event.reset_running),
                                     reset_connector=event.reset_connector)
