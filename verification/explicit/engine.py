"""Explicit-state search of the engine loop around the spec (spec/engine.py):
breadth-first over (spec state, engine phase), every environment choice
expanded (arrivals, aborts, the sampled outcome of each completion, and the
inputs a version takes in the middle of a step), the engine's own choices
made by the profile's loop. E-a is checked on every wait, E-b at every step
that completes the oldest batch (on the state at the step's start). A
counterexample is a shortest one.

The engine's phases: `between` steps (inputs may arrive; the engine steps
or, by its loop's rule, waits), `waiting` (blocked on input: only an input
moves it), and `mid`-step (its `schedule()` part done, the completion of the
oldest batch to come; inputs of the profile's `mid_step_inputs` kinds may
land first, as 0.33's aborts queue and 0.34's `_wait_for_output` take them).

This is a check of its own, with its own models (below): the default
`flightcheck verify`, its models and state counts are untouched.

    python -m flightcheck.verification.explicit.engine

searches every engine model and prints each one's verdict: 0.8.5's and
0.8.4's loops as released break E-a (a wait with an aborted request's batch
in flight); 0.8.4's stale `scheduled_req_ids` (the spec mutant
`inflight_set_not_cleared_on_preemption`) breaks E-b; the corrected loops
and 0.33's keep both. With reset and pause between steps (spec/reset_pause.py),
0.34's loop keeps both, and a loop that waited on `has_requests()` alone
breaks E-a under PAUSED_ALL with a batch in flight.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Iterator

from flightcheck.spec import Abort, Arrive, CompleteOldest, Pause, Reset, SetPause, State, describe, initial_state, schedule
from flightcheck.spec.actions import abort, arrive, complete_oldest
from flightcheck.spec.reset_pause import reset, set_pause
from flightcheck.spec.engine import (E_A, E_B, EngineLoop, corrected, has_requests, loop_calls_schedule,
                                     loop_completes_after, loop_of, loop_waits, may_complete, may_wait)
from flightcheck.verification.explicit.search import sample_choices
from flightcheck.verification.models import ONE_BATCH, SINGLE_SEQ, TIGHT_K2, Model, mutant_model
from flightcheck.verification.mutants import applied
from flightcheck.verification.reset_pause_models import RESET_PAUSE_K2

Phase = str          # "between" | "waiting" | "mid"
Node = tuple[State, Phase]


@dataclass(frozen=True)
class EngineModel:
    """A spec model, the engine loop it runs, and what its search must find."""

    name: str
    model: Model
    loop: EngineLoop
    expect: str | None            # the property its shortest counterexample breaks; None: none
    shortest: int | None = None   # that counterexample's length, in steps


@dataclass
class EngineViolation:
    property: str
    path: list[tuple[str, Node]]   # from the initial node, the last step broke it
    message: str


@dataclass
class EngineResult:
    engine_model: EngineModel
    num_states: int = 0
    num_edges: int = 0
    seconds: float = 0.0
    violation: EngineViolation | None = None

    @property
    def as_expected(self) -> bool:
        found = None if self.violation is None else self.violation.property
        length = None if self.violation is None else len(self.violation.path)
        want = self.engine_model
        return found == want.expect and (want.shortest is None or length == want.shortest)


def _inputs(model: Model, state: State, kinds: tuple[str, ...]) -> Iterator[tuple[str, State]]:
    cfg = model.cfg
    for r, q in enumerate(state.requests):
        if "arrive" in kinds and q.status.value == "NEW":
            nxt = arrive(state, cfg, r, model.prompts[r])
            if nxt is not None:
                yield str(Arrive(r, model.prompts[r])), nxt
        if "abort" in kinds and model.allow_abort and q.status.is_active:
            nxt = abort(state, cfg, r)
            if nxt is not None:
                yield str(Abort(r)), nxt
    if "pause" in kinds and cfg.reset_and_pause:          # reset and pause (spec/reset_pause.py)
        for pause in Pause:
            if (nxt := set_pause(state, cfg, pause)) is not None:
                yield str(SetPause(pause)), nxt
        connector = (False, True) if cfg.kv_connector is not None else (False,)   # `reset_connector` beside one
        for running in (True, False):
            for reset_connector in connector:
                if (nxt := reset(state, cfg, running, reset_connector)) is not None and nxt != state:
                    yield str(Reset(running, reset_connector)), nxt


def _engine_step(model: Model, loop: EngineLoop, state: State) -> tuple[str, State, bool] | None:
    """The schedule part of one engine step: its label, the state after it,
    and whether the step goes on to complete the oldest batch (None: the
    step does nothing)."""
    cfg = model.cfg
    after, tokens, label = state, False, "step"
    if loop_calls_schedule(state, cfg, loop):
        scheduled = schedule(state, cfg)
        if scheduled is not None:
            after, tokens = scheduled.state, bool(scheduled.entries)
            label = "step: schedule" if tokens else ("step: preempt" if scheduled.preempted else "step: empty batch")
    completes = loop_completes_after(tokens, after, cfg, loop)
    if after is state and not completes:
        return None
    return label + (", then complete oldest" if completes else ""), after, completes


def successors(em: EngineModel, node: Node) -> Iterator[tuple[str, Node, str | None]]:
    """Every edge from `node`: (label, next node, the property it breaks or None)."""
    model, loop = em.model, em.loop
    state, phase = node
    if phase == "mid":
        for label, nxt in _inputs(model, state, loop.mid_step_inputs):
            yield f"{label} (mid-step)", (nxt, "mid"), None
        for samples in sample_choices(model, state):
            nxt = complete_oldest(state, model.cfg, samples)
            if nxt is not None:
                yield str(CompleteOldest(samples)), (nxt, "between"), None
        return
    for label, nxt in _inputs(model, state, ("arrive", "abort", "pause")):
        yield label, (nxt, "between"), None
    if phase == "waiting":
        return
    if loop_waits(state, loop):
        yield "wait for input", (state, "waiting"), (None if may_wait(state) else E_A)
        return
    if not (has_requests(state) or state.in_flight):
        return
    stepped = _engine_step(model, loop, state)
    if stepped is None:
        return
    label, after, completes = stepped
    broken = None
    if completes and after is state and not may_complete(state, model.cfg):
        broken = E_B                      # completes without having formed a batch, where it could
    yield label, (after, "mid" if completes else "between"), broken


def search(em: EngineModel, max_states: int = 200_000) -> EngineResult:
    """Breadth-first from the initial node; stops at the first violation."""
    started = time.monotonic()
    result = EngineResult(em)
    root: Node = (initial_state(em.model.num_requests, em.model.cfg.num_blocks), "between")
    parent: dict[Node, tuple[Node, str] | None] = {root: None}
    queue = deque([root])
    with applied(em.model.mutant):
        while queue and len(parent) < max_states:
            node = queue.popleft()
            for label, nxt, broken in successors(em, node):
                result.num_edges += 1
                if broken is not None:
                    result.violation = EngineViolation(broken, _path(parent, node) + [(label, nxt)],
                                                       f"{label} breaks {broken}")
                    result.num_states, result.seconds = len(parent), time.monotonic() - started
                    return result
                if nxt not in parent:
                    parent[nxt] = (node, label)
                    queue.append(nxt)
    result.num_states, result.seconds = len(parent), time.monotonic() - started
    return result


def _path(parent: dict[Node, tuple[Node, str] | None], node: Node) -> list[tuple[str, Node]]:
    steps: list[tuple[str, Node]] = []
    while parent[node] is not None:
        before, label = parent[node]          # type: ignore[misc]
        steps.append((label, node))
        node = before
    return steps[::-1]


def _loop(model: Model) -> EngineLoop:
    return loop_of(model.cfg)


# the model the spec's mutant hunt kills 0.8.4's stale in-flight set on (S11, 8 steps)
_STALE_084 = mutant_model("inflight_set_not_cleared_on_preemption", "vllm-0.8.4")

# The engine models: each version's loop as released (its profile's), the
# same loop corrected (0.33's busy-loop rule), and 0.8.4's stale in-flight set.
ENGINE_MODELS: tuple[EngineModel, ...] = (
    EngineModel("0.8.5-loop", SINGLE_SEQ, _loop(SINGLE_SEQ), E_A, 4),
    EngineModel("0.8.5-loop-corrected", SINGLE_SEQ, corrected(_loop(SINGLE_SEQ)), None),
    EngineModel("0.8.4-loop", ONE_BATCH.under_profile("vllm-0.8.4"),
                _loop(ONE_BATCH.under_profile("vllm-0.8.4")), E_A, 4),
    EngineModel("0.8.4-loop-corrected+stale-in-flight-set", replace(_STALE_084, allow_abort=False),
                corrected(_loop(_STALE_084)), E_B),
    EngineModel("0.8.4-loop-corrected", replace(_STALE_084.with_mutant(None), allow_abort=True),
                corrected(_loop(_STALE_084)), None),
    EngineModel("0.33-loop", TIGHT_K2.under_profile("vllm-0.33"), _loop(TIGHT_K2.under_profile("vllm-0.33")), None),
    # 0.34's mid-step arrivals and aborts (`EngineCoreProc._wait_for_output`) trip neither property
    EngineModel("0.34-loop", TIGHT_K2.under_profile("vllm-0.34"), _loop(TIGHT_K2.under_profile("vllm-0.34")), None),
    # Reset and pause between steps: 0.34's loop completes every batch in
    # flight while `has_requests()` says 0 under PAUSED_ALL (`has_work`
    # counts the batch queue); a loop that waited on `has_requests()` alone
    # would leave them in flight (no abort or stop in the model: only the pause
    # makes `has_requests()` false with a batch in flight)
    EngineModel("0.34-loop+reset-pause", RESET_PAUSE_K2, _loop(RESET_PAUSE_K2), None),
    EngineModel("0.34-loop-waiting-on-has-requests+reset-pause", RESET_PAUSE_K2,
                replace(_loop(RESET_PAUSE_K2), waits_with_batch_in_flight=True), E_A, 4),
)


def describe_violation(result: EngineResult) -> str:
    v = result.violation
    if v is None:
        return "no violation"
    lines = [f"{v.property} after {len(v.path)} steps:"]
    for i, (label, (state, phase)) in enumerate(v.path, start=1):
        lines.append(f"  {i:2d}. {label:40s} -> [{phase}] {describe(state)}")
    return "\n".join(lines)


def main() -> int:
    bad = 0
    for em in ENGINE_MODELS:
        result = search(em)
        found = "none" if result.violation is None else f"{result.violation.property} at length {len(result.violation.path)}"
        flag = "ok" if result.as_expected else "UNEXPECTED"
        print(f"{em.name:45s} {result.num_states:7d} states {result.seconds:5.1f} s  violation: {found}  [{flag}]")
        if result.violation is not None:
            print(describe_violation(result))
        bad += not result.as_expected
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
