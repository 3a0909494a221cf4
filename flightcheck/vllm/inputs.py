"""The workload's inputs, in the order a replay's engine hands them to the
scheduler between steps (vLLM's `EngineCore._process_input_queue`): each
request's arrival, its abort, a streaming session's later inputs (an
`add_request` under the session's live id, session_workload.py), and resets
and pauses (reset_pause_workload.py), each at its engine step. Used alike
by the replay of vLLM (engine.py) and by the reference's run.

Abstracted away: the front end (detokenizing, output processing) and time:
an input is due at an engine step, not at a moment.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import Any, Callable

from .workload import RequestSpec, Workload


class InputQueue:
    """The workload's adds and aborts, handed over as the engine's input
    queue hands them (`_process_input_queue`, between steps): at one step,
    arrivals come before aborts, and an arrival that reuses an id after them
    (an abort, then a new request under the same id)."""

    ARRIVE, ABORT, REARRIVE, SESSION_INPUT, EVENT = 0, 1, 2, 3, 4   # EVENT: a reset or a pause, after the step's requests

    def __init__(self, workload: Workload, before: int | None = None) -> None:
        """`before`: only the inputs due before that step (a replay that asks
        whether an idle an input ended would have lasted without it)."""
        inputs = sorted([(spec.arrival_step, self.REARRIVE if spec.reuses_id else self.ARRIVE, spec.req_id, spec)
                         for spec in workload.requests]
                        + [(spec.abort_step, self.ABORT, spec.req_id, spec) for spec in workload.requests
                           if spec.abort_step is not None]
                        + session_inputs(workload, self.SESSION_INPUT)
                        + [(event.step, self.EVENT, "", event) for event in workload.events],
                        key=lambda x: (x[0], x[1]))
        self.pending = deque(x for x in inputs if before is None or x[0] < before)

    def next_step(self) -> int:
        """The step of the next input (there is one)."""
        return self.pending[0][0]

    def due(self, step: int) -> bool:
        """Whether an input is due by `step`."""
        return bool(self.pending) and self.pending[0][0] <= step

    def deliver(self, step: int, add_request: Callable[[RequestSpec], None], abort_request: Callable[[str], None],
                bind: Callable[[RequestSpec], None] | None,
                during_wait: list[Callable[[], None]] | None = None,
                call_event: Callable[[Any], None] | None = None) -> list[str]:
        """Hand over every input due by `step`; returns the aborts that go
        `abort_via` the aborts queue instead (0.33), in order. Inputs that
        arrive during the step's wait for output (0.34, `via "wait"`) are
        appended to `during_wait` as calls that hand them over, in order."""
        during_step: list[str] = []
        while self.pending and self.pending[0][0] <= step:
            _, kind, req_id, spec = self.pending.popleft()
            if kind == self.EVENT:                 # reset_pause_workload.py: handed over at once
                if call_event is None:
                    raise ValueError("this engine takes no reset or pause events")
                call_event(spec)
                continue
            # a session's input keeps the model bound to the session's own request
            handover = _handover(kind == self.ABORT, spec, add_request, abort_request,
                                 None if kind == self.SESSION_INPUT else bind)
            if kind == self.ABORT and spec.abort_via_aborts_queue:
                during_step.append(req_id)
            elif during_wait is not None and (spec.abort_during_wait if kind == self.ABORT
                                              else spec.arrival_during_wait):
                during_wait.append(handover)
            else:
                handover()
        return during_step


def session_inputs(workload: Workload, kind: int) -> list[tuple[int, int, str, RequestSpec]]:
    """Each session input as an input of the queue: an `add_request` under
    the session's id (session_workload.py), resumable but for the end."""
    found = []
    for spec in workload.requests:
        for inp in spec.session:
            update = replace(spec, prompt_token_ids=inp.prompt_token_ids or spec.prompt_token_ids[:1],
                             max_tokens=inp.max_tokens, session=(), resumable=not inp.ends_session,
                             prompt_logprobs=inp.prompt_logprobs,     # the update's own sampling params
                             arrival_step=inp.step, arrival_during_wait=False)
            found.append((inp.step, kind, spec.req_id, update))
    return found


def _handover(is_abort: bool, spec: RequestSpec, add_request: Callable[[RequestSpec], None],
              abort_request: Callable[[str], None], bind: Callable[[RequestSpec], None] | None) -> Callable[[], None]:
    """A call that hands one input to the scheduler (an arrival binds the
    model to its request first)."""
    def handover() -> None:
        if is_abort:
            abort_request(spec.req_id)
            return
        if bind is not None:
            bind(spec)
        add_request(spec)
    return handover
