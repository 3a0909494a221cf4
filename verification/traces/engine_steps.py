"""The engine's choices in a trace that numbers engine steps (`engine_step`
on its events, docs/trace-format.md, "Engine steps"): the properties of a
correct engine, spec/engine.py's E-a and E-b, checked at the event where
they break.

* E-a (`Ea_no_wait_in_flight`): engine steps missing between two events
  while a batch with tokens is in flight mean the engine waited for input
  with that batch in flight: every step of a loop that queues no empty
  batches writes an event while a batch is in flight (it schedules one or
  completes the oldest). A loop that queues empty batches (vLLM 0.33,
  `Profile.empty_batches`) may take steps that only queue or drain empty
  batches: up to 2(D - 1) such steps are allowed (D the queue depth: at most
  D - 1 appended before the queue is full, then at most D - 1 older empty
  batches drained before the oldest batch with tokens), and `unchecked`
  says so.
* E-b (`Eb_complete_only_when_needed`): a step that completes the oldest
  batch without having formed one (no `schedule` event of its own, or one
  that only preempted) must have found the queue full or nothing the spec
  can schedule, judged at the step's start. The inputs a version takes in
  the middle of a step (`Profile.mid_step_inputs`: vLLM 0.33's aborts
  queue, 0.34's `_wait_for_output`) land after the step's `schedule()`: an
  input of such a kind, numbered with the step and written before its
  completion, may have landed on either side of it, and E-b holds if it
  holds for some legal placement. A step that formed a batch with tokens
  and then completes must have filled the queue, its empty batches counted
  from the writer's notes (`empty_batch`, `empty_batches_before`) under a
  loop that queues them; without notes that case is listed as unchecked.

A trace without `engine_step` is checked as before, and `unchecked` says the
engine's choices were not. Under asynchronous scheduling (the checker moves
the queue's empty batches itself) E-b is not checked, and `unchecked` says so.
"""

from __future__ import annotations

from typing import Any, Callable

from flightcheck.spec import Config, State
from flightcheck.spec.engine import E_A, E_B, loop_of, may_complete, token_batches_in_flight

INPUTS = ("arrive", "abort", "reset", "pause", "input")   # reset and pause: utility calls between steps; input: a streaming session's next input
# The KV connector's reports: processed in a step's `update_from_output`,
# after its `schedule()` (so E-b judges the step from the state before them)
KV_REPORTS = ("kv_received", "kv_failed", "kv_sent")
UNNUMBERED = ("config", "end", "stage")

NO_STEPS = ("the engine's choices E-a/E-b (waiting for input with a batch in flight; completing a batch "
            "where the spec would schedule): the trace numbers no engine steps (`engine_step`)")


class EngineSteps:
    """The engine-step part of check.py's TraceChecker (a mixin: it reads the
    checker's state and config and raises violations through `self._violation`)."""

    state: State
    cfg: Config
    unchecked: set[str]
    batch_ids: list[Any]
    _violation: Callable[[str, str], Exception]

    def _start_engine_steps(self) -> None:
        self.numbers_engine_steps: bool | None = None   # None: no numbered event seen yet
        self.engine_step: int | None = None
        self.step_states: list[State] = []              # the state before each input of the step, then now
        self.step_inputs: list[str] = []                # the kinds of the step's inputs so far
        self.step_scheduled: bool | None = None         # None: no schedule event in the step; else tokens?
        self.step_completed = False
        self.step_report_state: State | None = None     # the state before the step's first KV report
        # empty batches in the engine's queue, from the writer's notes
        # (`empty_batch`, `empty_batches_before`: vLLM 0.33's recorder); once
        # a trace notes one it is taken to note them all
        self.queued_empties = 0
        self.notes_empties = False

    def _count_empties(self, event: dict[str, Any]) -> None:
        notes = event.get("empty_batches_before")
        for note in notes if isinstance(notes, list) else ():
            if isinstance(note, dict) and note.get("ev") in ("schedule", "complete"):
                self.notes_empties = True
                self.queued_empties += 1 if note["ev"] == "schedule" else -1
        if event["ev"] == "schedule" and isinstance(event.get("empty_batch"), int):
            self.notes_empties = True
            self.queued_empties += 1                    # a step that only preempted queued an empty batch

    def _engine_step_before(self, event: dict[str, Any]) -> None:
        """Called before each event is applied: E-a, and the step's decision state."""
        kind = event["ev"]
        self._count_empties(event)
        if kind in UNNUMBERED or self.numbers_engine_steps is False:
            return
        number = event.get("engine_step")
        if number is None and self.numbers_engine_steps is None:
            self.numbers_engine_steps = False           # no engine steps: NO_STEPS, if legal
            return
        if number is None or (self.engine_step is not None and number < self.engine_step):
            why = "carries no engine_step" if number is None else "goes back in engine_step"
            self._stop_engine_steps(f"the engine's choices E-a/E-b after an event that {why}")
            return
        self.numbers_engine_steps = True
        if self.engine_step is None or number > self.engine_step:
            self._check_no_wait(number)
            self.engine_step = number
            self.step_states, self.step_inputs = [], []
            self.step_scheduled, self.step_completed = None, False
            self.step_report_state = None
        if kind in INPUTS:
            self.step_states.append(self.state)
            self.step_inputs.append(kind)
        elif kind == "schedule" and self.step_scheduled is None and not self.step_completed:
            self.step_scheduled = bool(event.get("entries"))
        elif kind == "complete":
            self._check_completion(event)
            self.step_completed = True
        elif kind in KV_REPORTS and self.step_report_state is None and not self.step_completed:
            self.step_report_state = self.state

    def _engine_steps_at_end(self) -> None:
        if not self.numbers_engine_steps and not any(u.startswith("the engine's choices") for u in self.unchecked):
            self.unchecked.add(NO_STEPS)

    def _stop_engine_steps(self, what: str) -> None:
        self.numbers_engine_steps = False
        self.unchecked.add(what)

    def _check_no_wait(self, number: int) -> None:
        """E-a, on entering engine step `number`."""
        if self.engine_step is None:
            return
        missing = number - self.engine_step - 1
        allowed = 0
        if loop_of(self.cfg).empty_batches:
            allowed = 2 * (self.cfg.queue_depth - 1)
            if missing > 0:
                self.unchecked.add("E-a between engine steps without events under a loop that queues empty "
                                   f"batches (up to 2(D - 1) = {allowed} such steps are taken as steps that "
                                   "queued or drained empty batches)")
        in_flight = token_batches_in_flight(self.state)
        if missing > allowed and in_flight:
            ids = [b for b, batch in zip(self.batch_ids, self.state.in_flight) if batch]
            steps = (f"engine step {number - 1}" if missing == 1
                     else f"engine steps {self.engine_step + 1}..{number - 1}")
            raise self._violation(E_A, f"{steps} took no action "
                                  f"while {in_flight} batch(es) were in flight (batch {ids[0]} the oldest): "
                                  "the engine waited for input with a batch in flight")

    def _check_completion(self, event: dict[str, Any]) -> None:
        """E-b, before a complete event of the current step."""
        if self.cfg.rules.output_placeholders:
            self.unchecked.add("E-b under asynchronous scheduling (the checker moves the queue's empty "
                               "batches itself)")
            return
        if self.step_completed:
            candidates = [self.state]                   # a second completion in one step: decided now
        elif self.step_scheduled is None:
            candidates = self._decision_candidates()
        elif not self.step_scheduled:
            return                                      # its schedule() only preempted: nothing to schedule
        else:
            self._check_queue_filled()
            return
        if any(may_complete(c, self.cfg) for c in candidates):
            return
        decision = candidates[-1]
        raise self._violation(E_B, f"engine step {self.engine_step} completed batch {event.get('batch')} "
                              f"with {len(decision.in_flight)} of {self.cfg.queue_depth} queue slots taken, "
                              "where the spec's schedule() (on its own counters) forms a batch: the engine "
                              "completed instead of scheduling")

    def _check_queue_filled(self) -> None:
        """E-b for a step that formed a batch with tokens and then completes:
        the batch must have filled the queue, empty batches included (known
        from the writer's notes under a loop that queues them)."""
        taken = len(self.state.in_flight)
        if loop_of(self.cfg).empty_batches:
            if not self.notes_empties:
                self.unchecked.add("E-b after a step that formed a batch, under a loop that queues empty "
                                   "batches the trace does not note (whether they filled the queue)")
                return
            taken += self.queued_empties
        if taken < self.cfg.queue_depth:
            raise self._violation(E_B, f"engine step {self.engine_step} formed a batch and then completed "
                                  f"batch {self.batch_ids[0] if self.batch_ids else None} with {taken} of "
                                  f"{self.cfg.queue_depth} queue slots taken")

    def _decision_candidates(self) -> list[State]:
        """The states the step's `schedule()` may have seen: after each prefix
        of the step's inputs whose rest are of kinds the version takes mid-step."""
        mid_step = set(loop_of(self.cfg).mid_step_inputs)
        now = self.state if self.step_report_state is None else self.step_report_state
        states = self.step_states + [now]
        candidates = [now]
        for i in range(len(self.step_inputs) - 1, -1, -1):
            if self.step_inputs[i] not in mid_step:
                break
            candidates.insert(0, states[i])
        return candidates


__all__ = ["EngineSteps", "NO_STEPS"]
