"""The trace checker's part for streaming sessions (docs/request-states.md,
"Streaming sessions"; docs/trace-format.md, "Streaming sessions"): a
`resumable` arrival opens a session, and each `input` event is the client's
next input under the session's live id, the spec's `SendInput`.

The spec's session fixes the inputs its client will send at arrival
(`Request.inputs_to_send`, so that a search explores every moment of
sending them); a trace gives them one at a time, as the environment's
choice. The checker hands each over as it comes: the input the event gives
becomes the one input left to send, and `SendInput` sends it. What the
scheduler does with it (queue it, take it at once, finish the session at
its end) is the spec's decision, checked by the events that follow. The end
of a session sent while the session waits for input finishes it there (vLLM
`finish_requests(FINISHED_ABORTED)`): the `input` event stands for that
finish, and no `finish` or `abort` follows it.
"""

from __future__ import annotations

from typing import Any, Callable

from flightcheck.spec import Config, SendInput, State, Status, step
from flightcheck.spec.deadlock import idles_on_clients
from flightcheck.spec.sessions import ASKS_PROMPT_LOGPROBS, END_OF_SESSION, has_sessions, session_holds_blocks


class SessionEvents:
    """A mixin of replay.py's TraceChecker (it reads the checker's state,
    configuration and request slots, and applies through `_apply`)."""

    state: State
    cfg: Config
    _req: Callable[[dict], int]
    _apply: Callable[..., None]
    _violation: Callable[[str, str], Exception]
    _quoted_name: Callable[[int], str]
    finished_unflushed: bool

    def _open_session(self, r: int, event: dict[str, Any]) -> None:
        """A `resumable` arrival: r is a session whose inputs the trace gives
        (the arrival itself was checked; being resumable changes nothing of it)."""
        if event.get("resumable") and has_sessions(self.cfg) and self.state.requests[r].status.is_active:
            self.state = self.state.with_request(r, resumable=True)

    def _on_input(self, event: dict[str, Any]) -> None:
        r = self._req(event)
        q = self.state.requests[r]
        if q.resumable and q.status.is_finished and q.held:
            # vLLM's `add_request` finds the finished session still in `requests` (the KV
            # connector holds its blocks) and queues the update onto it, where nothing takes it:
            # harmless for the end of the session, a lost input otherwise (a finding:
            # docs/vllm-kv-connector-findings.md, finding 5)
            if event.get("end_of_session", False):
                return
            raise self._violation("illegal_transition", f"input: {self._quoted_name(r)} finished "
                                  f"({q.status.value}) while the KV connector holds its blocks: vLLM queues "
                                  "the input onto the finished request, where it never runs")
        if not (q.resumable and q.status.is_active):
            raise self._violation("illegal_transition", f"input: {self._quoted_name(r)} is not a live streaming "
                                  f"session ({'not resumable' if not q.resumable else q.status.value})")
        if event.get("end_of_session", False):
            sent = END_OF_SESSION
        else:
            sent = (event["num_tokens"], event["max_tokens"])
            if event.get("prompt_logprobs", False):
                sent += (ASKS_PROMPT_LOGPROBS,)          # spec/lora.py `take_input_logprobs`
            if sent == END_OF_SESSION:
                raise self._violation("illegal_transition", "input: no new tokens and max_tokens 0 (the end of a "
                                      "session is written `end_of_session: true`)")
        self.state = self.state.with_request(r, inputs_to_send=(sent,))
        self._apply(SendInput(r), step(self.state, self.cfg, SendInput(r)), "input")
        if self.state.requests[r].status.is_finished:
            # the end of a session that waited for input: vLLM 0.33.0/0.34.0 `Scheduler.add_request`
            # finishes it (`finish_requests` -> `_free_request` adds its id to `finished_req_ids`), so
            # `has_requests()` stays true and the engine calls schedule() once more, even under
            # PAUSED_ALL, as after a finish event (asynchronous.py `_empty_call`)
            self.finished_unflushed = True

    def _left_to_clients(self, active: list[int]) -> bool:
        """A run that ends with `active` unfinished waits on its sessions'
        clients, not on its scheduler (spec/deadlock.py `idles_on_clients`,
        L2's rule): schedule would not move on, and every one is a session
        parked for input (vLLM's `get_num_unfinished_requests` leaves them
        out) or nothing runs and only what the parked sessions hold (their
        seats, their blocks) keeps the rest from admission. A run whose
        schedule would move on stalled, a parked session beside it or not
        (a client that never ends its session: session_workload.py
        `client_ends`)."""
        return bool(active) and idles_on_clients(self.state, self.cfg)

    def _session_table(self, r: int) -> tuple[int, ...]:
        """The table a session's next turn is admitted with before this
        schedule call: the blocks it kept over its stop (`block_ids` of its
        admission list its whole table, those first)."""
        q = self.state.requests[r]
        return q.block_table if session_holds_blocks(q) and q.status is Status.WAITING else ()
