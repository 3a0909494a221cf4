"""Structured output (a mixin of `Scheduler`; vLLM 0.33.0 / 0.34.0
`Scheduler._handle_blocked_waiting_request`, `update_from_output`,
`AsyncScheduler._update_after_schedule`).

A structured request arrives in `WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR`
(`Request.grammar = "compiling"`); whoever compiles grammars (the engine's
backend: here the caller) sets it to "ready" or "failed". The waiting loop
skips it while it compiles; once ready it becomes WAITING and is admitted as
any other; a failed grammar is recorded and the request finished with
FINISHED_ERROR at the end of the next `update_from_output`. The tokens each
output appends advance the request's FSM (`Request.fsm`, a count: the
reference takes the model's tokens as the grammar allows them), unless the
grammar refuses them (`grammar_accepts`, the backend's FSM where the caller
has one). Under async
scheduling, a batch with a structured request whose earlier output is still
in flight says so (`SchedulerOutput.pending_structured_output_tokens`): the
engine processes the oldest output before it samples this batch.

Abstracted away: the grammar itself, bitmasks, and draft validation (the
bridge's drafts are all grammar-legal).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .batch import Batch
from .outputs import EngineCoreOutput, RequestData, SchedulerOutput
from .request import Request, RequestStatus

COMPILING, READY, FAILED = "compiling", "ready", "failed"
_WAITING_FOR_GRAMMAR = RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR


class Grammars:
    # The grammar backend's FSM, set by whoever compiles grammars (as
    # `Request.grammar`): whether the request's grammar accepts these tokens
    # now (vLLM `StructuredOutputManager.accept_tokens`). None: the
    # abstraction, a grammar accepts the tokens sampled for its own request
    # and refuses an older request's (`_fsm_accepts`).
    grammar_accepts: Callable[[Request, Sequence[int]], bool] | None = None

    def add_structured_request(self, request: Request) -> None:
        """A request asking for structured output: it waits for its grammar."""
        request.grammar = COMPILING
        request.status = _WAITING_FOR_GRAMMAR
        self.add_request(request)

    def _blocked_on_grammar(self, request: Request) -> bool:
        """`_handle_blocked_waiting_request`: skip a request whose grammar
        still compiles, or failed (recorded for the next output); a ready
        one becomes WAITING and the loop goes on with it."""
        if request.status != _WAITING_FOR_GRAMMAR:
            return False
        if request.grammar == READY:
            request.status = RequestStatus.WAITING
            return False
        if request.grammar == FAILED:
            self.grammar_compile_error_reqs.add(request.request_id)
        return True

    def _advance_grammar(self, request: Request, entry: RequestData, output: EngineCoreOutput) -> None:
        """`StructuredOutputManager.accept_tokens` on the tokens appended
        (after the stop checks, as vLLM 0.33/0.34's `update_from_output`). A
        refusal finishes the request with FINISHED_ERROR, not resumable. Only
        vLLM as released (`outputs_by_id_alone`) meets one: an older
        request's output looked up by its reused id reaches a structured
        request, whose grammar may refuse tokens sampled for another."""
        if request.grammar != READY or not output.new_token_ids:
            return
        if not self._fsm_accepts(request, entry, output.new_token_ids):
            request.status, request.resumable, output.finish_reason = RequestStatus.FINISHED_ERROR, False, "error"
            return
        request.fsm += len(output.new_token_ids)

    def _fsm_accepts(self, request: Request, entry: RequestData, token_ids: Sequence[int]) -> bool:
        """The backend's FSM decides (`grammar_accepts`); without one, a
        grammar accepts what was sampled for its own request and refuses an
        older request's output. With the bridge's backend
        (flightcheck/vllm/grammar_replay.py) a grammar accepts whatever the
        fabricated model may sample for its request's workload entry: a
        streaming session's input sent after the session finished is a new
        request under the session's id and of the session's entry, so its
        grammar accepts the finished session's tokens too (vLLM then
        finishes it by its stop checks, not with an error)."""
        if self.grammar_accepts is not None:
            return self.grammar_accepts(request, token_ids)
        return entry.incarnation >= request.first_incarnation

    def _finish_grammar_errors(self) -> list[EngineCoreOutput]:
        """The end of `update_from_output`: the failed grammars met since the
        last output finish with FINISHED_ERROR (in id order: vLLM iterates a set)."""
        if not self.grammar_compile_error_reqs:
            return []
        error_ids = sorted(req_id for req_id in self.grammar_compile_error_reqs if req_id in self.requests)
        self.grammar_compile_error_reqs = set()
        self.finish_requests(error_ids, RequestStatus.FINISHED_ERROR)
        return [EngineCoreOutput(req_id, [], "error") for req_id in error_ids]

    def _mark_pending_structured_output(self, output: SchedulerOutput, batch: Batch) -> None:
        """`AsyncScheduler._update_after_schedule`: a scheduled structured
        request that is no prefill chunk and has placeholders (its own and
        those of earlier outputs in flight) defers the batch's sampling."""
        output.pending_structured_output_tokens = any(
            request.grammar is not None and not request.is_prefill_chunk
            and request.num_output_placeholders > 1 + len(entry.spec_token_ids)
            for request, entry in zip(batch.requests, batch.entries))
