"""Reset and pause events for check.py's TraceChecker (a mixin;
spec/reset_pause.py, docs/trace-format.md "Reset and pause").

* `reset`: the spec's `Reset(running, connector)` (`connector`: the KV
  connector's cache reset too; false where the key is missing, as in
  traces written before it); the trace's `preempted` (the
  running requests it preempted, tail first) must be the spec's `running`
  reversed, and its `ok` (vLLM's return value) whether the spec's pool
  dropped every label.
* `pause`: the spec's `SetPause(state)`; setting the state already in force
  changes nothing (vLLM's call is then a no-op).

A trace whose config does not say `reset_and_pause` is switched to it at
its first such event, where its profile has both (vLLM 0.33 on): the
configuration changes nothing before (the pause is UNPAUSED, no entry was
reset).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from flightcheck.spec import Config, Pause, Reset, SetPause, State, step

PAUSES = {"none": Pause.UNPAUSED, "new": Pause.PAUSED_NEW, "all": Pause.PAUSED_ALL}


class ResetPauseEvents:
    state: State
    cfg: Config
    slot: dict[str, int]
    _violation: Callable[[str, str], Exception]
    _name: Callable[[int], str]
    _apply: Callable[..., None]

    def _with_reset_and_pause(self, what: str) -> None:
        if self.cfg.reset_and_pause:
            return
        rules = self.cfg.rules
        if not (rules.reset_drops_running_output and rules.pause_states):
            raise self._violation("illegal_transition", f"{what}: profile {self.cfg.profile} has no reset and "
                                  "pause")
        self.cfg = replace(self.cfg, reset_and_pause=True)

    def _on_reset(self, event: dict[str, Any]) -> None:
        self._with_reset_and_pause("reset")
        running = bool(event["running"])
        expected = [self._name(r) for r in reversed(self.state.running)] if running else []
        if "preempted" in event and list(event["preempted"]) != expected:
            raise self._violation("reset_decision", f"the reset preempted {event['preempted']}, the spec "
                                  f"preempts {expected} (the running requests, tail first)")
        action = Reset(running, bool(event.get("connector", False)))
        self._apply(action, step(self.state, self.cfg, action), "reset")
        cleared = all(label is None for label in self.state.pool.labels) and not any(self.state.pool.ref_counts)
        if "ok" in event and bool(event["ok"]) != cleared:
            raise self._violation("reset_decision", f"vLLM's reset_prefix_cache returned {event['ok']}, "
                                  f"the spec's pool {'was' if cleared else 'was not'} reset")

    def _on_pause(self, event: dict[str, Any]) -> None:
        self._with_reset_and_pause("pause")
        pause = PAUSES[event["state"]]
        if pause is self.state.pause:
            return
        self._apply(SetPause(pause), step(self.state, self.cfg, SetPause(pause)), "pause")
