"""The refinement fuzzer with resets and pauses (docs/request-states.md,
"Reset and pause"): machine.py's machine under `Config.reset_and_pause`, the
reference's `ResetPause` (reference/reset_pause.py) against
spec/reset_pause.py, under vLLM 0.33 and 0.34, sync and async
(`RESET_PAUSE_FUZZED_PROFILES`).

The environment's choices beyond machine.py's, between any two steps:

* `reset`: `reset_prefix_cache(reset_running_requests=running)` (the
  spec's `Reset(running)`), at most one per ten steps;
* `pause`: `set_pause_state` to PAUSED_ALL, PAUSED_NEW or UNPAUSED (the
  spec's `SetPause`), a pause at most one per six steps, a resume whenever.

The abstraction adds the scheduler's `pause_state` (the spec's
`State.pause`) and the spec's ghost `Entry.reset`: the machine marks every
entry in flight of the requests a reset of the running requests takes (the
spec marks them so at its `Reset(True)`), so RP2 and RP3 are checked on the
reference's own entries. The engine's loop (vLLM's `step_with_batch_queue`)
schedules while `get_num_unfinished_requests()` counts a request, which a
pause makes 0 (PAUSED_ALL) or running requests only (PAUSED_NEW), and
completes the oldest batch otherwise: a paused engine still completes every
batch in flight. The engine counts are checked against the spec's:
`get_num_unfinished_requests()` equals `reset_pause.num_unfinished_requests`
and `has_requests()` the spec's `has_requests` (or finished ids not yet
carried to the workers).
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from flightcheck import spec
from flightcheck.reference.reset_pause import PauseState
from flightcheck.spec import reset_pause
from flightcheck.verification.refinement.abstraction import abstract
from flightcheck.verification.refinement.bounded_run import fuzz_machine, machine_per_profile
from flightcheck.verification.refinement.machine import RefinementMachine, _step
from flightcheck.verification.refinement.strategies import Outcome, configs

RESET_PAUSE_FUZZED_PROFILES: tuple[str, ...] = ("vllm-0.34-async", "vllm-0.34", "vllm-0.33-async", "vllm-0.33")
PAUSE: dict[PauseState, spec.Pause] = {PauseState.UNPAUSED: spec.Pause.UNPAUSED,
                                       PauseState.PAUSED_NEW: spec.Pause.PAUSED_NEW,
                                       PauseState.PAUSED_ALL: spec.Pause.PAUSED_ALL}
# a pause draw: 0 PAUSED_ALL (where shrinking goes), 1 PAUSED_NEW, 2-3 UNPAUSED
PAUSE_DRAWS = (PauseState.PAUSED_ALL, PauseState.PAUSED_NEW, PauseState.UNPAUSED, PauseState.UNPAUSED)


class ResetPauseRefinementMachine(RefinementMachine):
    """RefinementMachine with resets and pauses (the module doc)."""

    profile = RESET_PAUSE_FUZZED_PROFILES[0]

    @initialize(data=st.data(), sample_every_chunk=st.booleans())
    def setup(self, data: Any, sample_every_chunk: bool) -> None:
        RefinementMachine.setup(self, cfg=data.draw(configs(self.profile)), sample_every_chunk=sample_every_chunk)
        self.spec_cfg = replace(self.spec_cfg, reset_and_pause=True)
        # the entries a reset marked (the ghost Entry.reset), by id (each kept, so no id is reused)
        self.reset_entries: dict[int, Any] = {}
        self.num_resets = self.num_pauses = 0

    @precondition(lambda self: self.engine is not None and self.num_resets * 10 <= len(self.history))
    @rule(running=st.booleans())
    @_step
    def reset(self, running: bool) -> None:
        """`reset_prefix_cache(reset_running_requests=running)`."""
        self.num_resets += 1
        if running:
            victims = {self.ledger.slot_of(r) for r in self.scheduler.running}
            self.reset_entries.update({id(e): e for out, _ in self.engine.batch_queue for e in out.entries
                                       if self.ledger.entry_slot(e.req_id, e.incarnation) in victims})
        self.scheduler.reset_prefix_cache(reset_running_requests=running)
        self._check(spec.Reset(running))

    @precondition(lambda self: self.engine is not None and (
        self.scheduler.pause_state != PauseState.UNPAUSED or self.num_pauses * 6 <= len(self.history)))
    @rule(draw=st.integers(0, len(PAUSE_DRAWS) - 1))
    @_step
    def pause(self, draw: int) -> None:
        """`set_pause_state`: a pause, or (draws 2 and 3) a resume."""
        pause_state = PAUSE_DRAWS[draw]
        self.num_pauses += pause_state != PauseState.UNPAUSED
        self.scheduler.set_pause_state(pause_state)
        self._check(spec.SetPause(PAUSE[pause_state]))

    @precondition(lambda self: self.engine is not None and self.scheduler.pause_state != PauseState.UNPAUSED
                  and self.engine.can_schedule() and bool(self.scheduler.running or self.scheduler.waiting))
    @rule()
    @_step
    def paused_call(self) -> None:
        """The `schedule()` call vLLM's engine makes while paused with only
        finished ids to carry to the workers (`has_requests()` by
        `has_finished_requests`), a step the spec leaves out (machine.py's
        module doc): made on a copy of the scheduler, it must keep RP1
        (PAUSED_ALL: no entry, no preemption; PAUSED_NEW: only requests
        that were running)."""
        probe = copy.deepcopy(self.scheduler)
        running = {r.request_id for r in probe.running}
        output = probe.schedule()
        scheduled = set(output.num_scheduled_tokens)
        if probe.pause_state == PauseState.PAUSED_ALL and (scheduled or output.preempted_req_ids):
            self._fail(f"under PAUSED_ALL schedule() scheduled {sorted(scheduled)} and preempted "
                       f"{sorted(output.preempted_req_ids)}, in {spec.describe(self.state)}")
        if not scheduled <= running:
            self._fail(f"under PAUSED_NEW schedule() scheduled {sorted(scheduled - running)}, which were not "
                       f"running, in {spec.describe(self.state)}")

    def _step_queueing_empty_batches(self, returned: list[Outcome]) -> None:
        """vLLM's `step_with_batch_queue`, as machine.py's, scheduling while
        `get_num_unfinished_requests()` counts a request (as a pause counts
        them; the spec's `has_requests`, finished ids aside)."""
        unfinished = self.scheduler.get_num_unfinished_requests() > 0
        if unfinished and self.engine.can_schedule():
            ran = self._schedule()
            if self.engine.can_schedule() and (ran or self.scheduler.get_num_unfinished_requests() > 0):
                return
        if self.engine.can_complete():
            self._complete(returned)

    # -- the abstraction's and the engine counts' reset-and-pause part ------------

    def _abstract(self) -> spec.State:
        """abstraction.py's state, with the pause and the reset marks."""
        state = abstract(self.scheduler, self.engine, self.ledger)
        in_flight = tuple(tuple(replace(e, reset=id(x) in self.reset_entries) for e, x in zip(batch, out.entries))
                          for batch, (out, _) in zip(state.in_flight, self.engine.batch_queue))
        return replace(state, pause=PAUSE[PauseState(self.scheduler.pause_state)], in_flight=in_flight)

    def _check_engine_counts(self, after: spec.State) -> None:
        """machine.py's, with the counts as a pause makes them."""
        count = self.scheduler.get_num_unfinished_requests()
        if count != reset_pause.num_unfinished_requests(after):
            self._fail(f"get_num_unfinished_requests() is {count}, the spec counts "
                       f"{reset_pause.num_unfinished_requests(after)} in {spec.describe(after)}")
        super()._check_engine_counts(after)

    def _expected_has_requests(self, after: spec.State) -> bool:
        return reset_pause.has_requests(after) or bool(self.finished_unreported)


# The machine with every configuration under a profile (refused outside RESET_PAUSE_FUZZED_PROFILES).
reset_pause_machine = machine_per_profile(ResetPauseRefinementMachine, "reset-and-pause", RESET_PAUSE_FUZZED_PROFILES)


def reset_pause_fuzz(steps: int, seed: int, profile: str, steps_per_program: int = 60,
                     shrink: bool = True, mutant: str | None = None) -> str | None:
    """A refinement run with resets and pauses under `profile`, `steps` rule
    steps from `seed`, the reference's `mutant` in force if given; the
    failure (the program, shrunk unless `shrink` is off, and its message),
    or None."""
    return fuzz_machine(reset_pause_machine(profile), steps, seed, steps_per_program, shrink, mutant)
