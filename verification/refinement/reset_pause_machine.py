"""The refinement fuzzer with resets and pauses (docs/request-states.md,
"Reset and pause"): machine.py's machine under `Config.reset_and_pause`, the
reference's `ResetPause` (reference/reset_pause.py) against
spec/reset_pause.py, under vLLM 0.33 and 0.34, sync and async
(`RESET_PAUSE_FUZZED_PROFILES`).

The environment's choices beyond machine.py's, between any two steps:

* `reset`: `reset_prefix_cache(reset_running_requests=running)` (the
  spec's `Reset(running)`), `running` two times in three, at most one per
  ten steps, or one per three while a running request has a decode with
  drafts in flight (`_reset_spacing`);
* `pause`: `set_pause_state` to PAUSED_ALL, PAUSED_NEW or UNPAUSED (the
  spec's `SetPause`), a pause at most one per six steps, a resume (or the
  other pause) whenever; every draw changes the state (`PAUSE_DRAWS`).

Drafts: `configs` draws k of 1 to 3 in four configurations in five, as for
machine.py; under the async profiles each decode carries k placeholder
drafts (vLLM's `AsyncScheduler`), under the sync ones the model's drafts
come with the output (the reference's named deviation from 0.33's
hand-over at submission, profiles.py `drafts_handed_over_at_submission`).
So a reset drops decodes with drafts in flight, the request resumes
beside them (drop mode: vLLM 0.34.0 `Scheduler.reset_prefix_cache`,
`_preempt_request(drop_stale_output=True)`), and their output, rejected
drafts and all, must be discarded whole (`update_from_output`'s
`if output_is_stale and request.drop_stale_output: continue`, before the
rejection rollback; vLLM #46066 took the rejections first, the reference
mutant `stale_rejections_settled_pr46066`).

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
# a pause draw, by the state it changes: unpaused, 0 and 2 PAUSED_ALL (0: where
# shrinking goes), 1 and 3 PAUSED_NEW; paused, 0-2 a resume, 3 the other pause.
# Every draw changes the state: `set_pause_state` to the state it is in changes
# nothing (the spec's `SetPause` is disabled then), and a draw of it, which
# Hypothesis makes most (draw 0 while PAUSED_ALL), had been 89 % of the steps
# (vllm-0.34-async, seed 1, 1,000 steps: 889 `SetPause`, 34 `Schedule`).
PAUSE_DRAWS: dict[PauseState, tuple[PauseState, ...]] = {
    PauseState.UNPAUSED: (PauseState.PAUSED_ALL, PauseState.PAUSED_NEW) * 2,
    PauseState.PAUSED_ALL: (PauseState.UNPAUSED,) * 3 + (PauseState.PAUSED_NEW,),
    PauseState.PAUSED_NEW: (PauseState.UNPAUSED,) * 3 + (PauseState.PAUSED_ALL,)}


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

    @precondition(lambda self: self.engine is not None
                  and self.num_resets * self._reset_spacing() <= len(self.history))
    @rule(mode=st.integers(0, 2))
    @_step
    def reset(self, mode: int) -> None:
        """`reset_prefix_cache(reset_running_requests=running)`, `running`
        two times in three (mode 0 or 1; 0, where shrinking goes, is one)."""
        running = mode != 2
        self.num_resets += 1
        if running:
            victims = {self.ledger.slot_of(r) for r in self.scheduler.running}
            self.reset_entries.update({id(e): e for out, _ in self.engine.batch_queue for e in out.entries
                                       if self.ledger.entry_slot(e.req_id, e.incarnation) in victims})
        self.scheduler.reset_prefix_cache(reset_running_requests=running)
        self._check(spec.Reset(running))

    def _reset_spacing(self) -> int:
        """Steps per reset: ten, or three while a running request has a
        decode with drafts in flight (a reset then drops drafts in flight,
        and the request resumes beside its stale decode: vLLM #46066)."""
        running = {r.request_id for r in self.scheduler.running}
        drafted = any(e.req_id in running and e.spec_token_ids
                      for out, _ in self.engine.batch_queue for e in out.entries)
        return 3 if drafted else 10

    @precondition(lambda self: self.engine is not None and (
        self.scheduler.pause_state != PauseState.UNPAUSED or self.num_pauses * 6 <= len(self.history)))
    @rule(draw=st.integers(0, 3))
    @_step
    def pause(self, draw: int) -> None:
        """`set_pause_state`: a pause, or (paused) a resume or the other pause."""
        pause_state = PAUSE_DRAWS[PauseState(self.scheduler.pause_state)][draw]
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
