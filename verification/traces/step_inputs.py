"""L2 is judged of the states a `schedule()` call sees, not of the states
between two inputs that no call separates.

vLLM's engine takes the inputs queued before a step together and then calls
`schedule()` (0.34.0 `EngineCoreProc.run_busy_loop`: `_process_input_queue`
handles every queued request, `add_request`, `abort_requests`, utility calls
such as `reset_prefix_cache`, then `_process_engine_step` steps); an arrival and the abort of that request read in
one batch of inputs leave no state between them for the scheduler to stall
in. L2 as safety (spec/deadlock.py: "with nothing in flight and a request
unfinished, schedule forms a batch or preempts") read after every event
would reject such a run wherever the arrival alone could never be
scheduled (hunt seed 422 index 42, 0.34.0 sync and async, three drafts with
a draft input slot beside `max_num_batched_tokens` 4: r0 arrives and is
aborted in engine step 0, before any call; vLLM never stalls, the ground
truth names nothing). Run alone, that arrival does stall vLLM: check-trace
rejects it there, at the arrival. The same holds of a KV connector's report
followed by an input of its step (seed 418 index 151, 0.34.0 and 0.33.0
async, the fifth pass: r0's `kv_sent` ends the send r3's stall waited on,
and r3 is aborted before the next call), and of a completion (with the
finishes it writes) followed by one: the engine takes the next step's
inputs after `update_from_output` and before the next call.

So the L2 check of an input's (or a KV report's) state waits for the next
event when that event is an input with the same `step` (the writer counts its
scheduler's `schedule()` and `update_from_output()` calls in `step`:
docs/trace-format.md) and no empty batch noted before it: the next input's
state is judged instead, whatever it is. An input the spec takes as a no-op
(the abort of a finished request) applies nothing: the owed check is made
of the state after it, at that event. A trace without `step` is judged as
before, after every event.

The whole-trace checker (check.py) reads the next event from the list; the
streaming one (stream.py) holds an input until the next line is read.
"""

from __future__ import annotations

from typing import Any, Callable

from flightcheck.spec import Config, State, invariants_for

from .engine_steps import INPUTS, KV_REPORTS

L2 = "L2_no_deadlock"
# the events whose L2 check an input of their step may take over: inputs,
# and what `update_from_output` hands over after the step's `schedule()` (the
# connector's reports, the completion and the finishes it writes); the next
# step's inputs come before its call
DEFERRABLE = INPUTS + KV_REPORTS + ("complete", "finish")


def another_input_follows(event: dict[str, Any], following: dict[str, Any] | None) -> bool:
    """`following`, the next event that is no `finish` (a finish reports
    what its completion or abort did), is an input of the same scheduler
    step as `event`, no `schedule()` call between them (module docstring)."""
    if following is None or event["ev"] not in DEFERRABLE or following["ev"] not in INPUTS:
        return False
    step = event.get("step")
    return step is not None and following.get("step") == step and not following.get("empty_batches_before")


class StepInputs:
    """The trace checker's part (a mixin): `input_follows_in_step` is set by
    the driver before each event; `l2_owed` says L2 was not judged of the
    state the last event left (an input another input of its step follows)."""

    state: State
    cfg: Config
    _violation: Callable[[str, str], Exception]
    input_follows_in_step = False
    l2_owed = False
    l2_owed_before = False           # `l2_owed` before the event being judged

    def _l2_judged_later(self) -> bool:
        """Whether L2 is left to the next input's state; called where L2 is
        judged after an event (once an event)."""
        self.l2_owed_before, self.l2_owed = self.l2_owed, self.input_follows_in_step
        return self.l2_owed

    def _settle_owed_l2(self) -> None:
        """After an event: an L2 check still owed (the event applied nothing
        and no input of its step follows) is made of the state now."""
        if not self.l2_owed or self.input_follows_in_step:
            return
        self.l2_owed = False
        l2 = next((inv for inv in invariants_for(self.cfg, auxiliary=False) if inv.name == L2), None)
        if l2 is not None and not l2.holds(self.state, self.cfg):
            raise self._violation(L2, l2.statement)


def next_not_finish(events: list[dict[str, Any]], start: int) -> dict[str, Any] | None:
    """The first event from `start` on that is no `finish` (None: none)."""
    return next((e for e in events[start:] if e["ev"] != "finish"), None)
