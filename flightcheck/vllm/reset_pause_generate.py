"""The reset-and-pause feature of `--all-features` (features.py): the seed's
plain workload with reset and pause events at engine steps
(reset_pause_workload.py) while its requests run, so that batches are in
flight at most of them:

* 1 to 4 events in the first 20 steps: a reset of the running requests
  (their output in flight dropped) twice as often as a reset without them
  (which fails while a block is held), and pauses of either kind;
* a pause is lifted 1 to 6 steps later, one time in two by PAUSED_NEW first;
  every workload ends unpaused (a run that ended paused would leave its
  requests unfinished).

Beside a KV connector too: a reset of the running requests fails, and
vLLM raises, while a load, a send or a fenced free holds blocks
(spec/reset_pause.py; docs/vllm-kv-connector-findings.md). There one reset
in two (`CONNECTOR_RESET_SHARE`) also resets the connector's cache
(`"connector": true`: `reset_connector`), drawn from a stream of its own
seeded by the workload's seed, so that every other draw of a seed, and
every workload without a connector, stays as it was. Standard library
only.
"""

from __future__ import annotations

import random
from typing import Any, Protocol, Sequence, TypeVar

from .features import Feature
from .versions import kv_connector_versions

T = TypeVar("T")


class Picker(Protocol):                        # generate.Picker
    def integer(self, low: int, high: int) -> int: ...

    def choice(self, options: Sequence[T]) -> T: ...


def with_reset_and_pause(pick: Picker, workload: dict[str, Any]) -> None:
    """Add `events` to `workload` (in place)."""
    events: list[dict[str, Any]] = []
    for _ in range(pick.integer(1, 4)):
        step = pick.integer(1, 20)
        kind = pick.choice(["reset", "reset", "reset", "pause", "pause"])
        if kind == "reset":
            events.append({"step": step, "reset": {"running": pick.choice([True, True, False])}})
            continue
        state = pick.choice(["all", "new"])
        events.append({"step": step, "pause": state})
        lifted = step + pick.integer(1, 6)
        if state == "all" and pick.choice([False, True]):
            events.append({"step": lifted, "pause": "new"})
            lifted += pick.integer(1, 3)
        events.append({"step": lifted, "pause": "none"})
    events.sort(key=lambda e: e["step"])       # stable: a step's pause before its lift
    if "kv_connector" in workload["config"]:
        _with_connector_resets(workload, events)
    workload["events"] = _ending_unpaused(events)


CONNECTOR_RESET_SHARE = 0.5                    # of the resets beside a KV connector


def _with_connector_resets(workload: dict[str, Any], events: list[dict[str, Any]]) -> None:
    """A share of the resets also reset the connector's cache, drawn from the
    workload seed's own stream (the Picker's draws stay where they were)."""
    stream = random.Random(f"reset-connector-{workload.get('seed', 0)}")
    for event in events:
        if "reset" in event and stream.random() < CONNECTOR_RESET_SHARE:
            event["reset"]["connector"] = True


def _ending_unpaused(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events with a final unpause after the last pause, if any is left on."""
    state = "none"
    for event in events:
        state = event.get("pause", state)
    if state != "none":
        events.append({"step": events[-1]["step"] + 1, "pause": "none"})
    return events


# vLLM 0.33 and 0.34 have both (the releases with the connector API are those).
# Beside a KV connector since the spec and the reference take only
# `kv_holding_waiting` under PAUSED_NEW (no load starts) and put a reset
# request's table behind the step fence (`_free_request_blocks`). Beside the priority policy since a
# reset puts its requests back at their place in the heap's order (spec and
# reference; campaign --all-features seed 5 indexes 42 and 64). Beside
# grammars since check-trace follows a paused engine's empty batches and a
# reset's second tables, and beside drafts since the recorder reads no drafts
# off a reset request's dropped output (docs/request-states.md, "Features
# together"). Beside streaming sessions since the spec and the reference admit
# a session's next turn under PAUSED_NEW (`kv_holding_waiting`) and keep a
# reset that fails beside a session holding blocks.
FEATURE = Feature("reset-pause", kv_connector_versions(), 0.5, with_reset_and_pause)
