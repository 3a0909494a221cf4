"""Streaming sessions (a mixin of `Scheduler`): vLLM's resumable requests,
as vLLM 0.33.0 and 0.34.0 `Scheduler.add_request`, `_handle_stopped_request`,
`_update_request_as_session` and the waiting loop run them
(docs/request-states.md, "Streaming sessions").

A session is one request whose input arrives in turns. `add_request` of a
request under a live session's id is its next input (`StreamingUpdate`:
the new prompt tokens and max_tokens; `None`, the end of the session):
queued while the session runs, taken at once while it waits for it. A stop
of a resumable request does not finish it: the turn's in-flight work is
given up (drop-mode stale output; here also a new incarnation, so that an
entry of the old turn is superseded), and the session takes its next input
or parks in WAITING_FOR_STREAMING_REQ, keeping its blocks (in
`kv_holding_waiting` while it has computed tokens) and its seat
(`num_waiting_for_input`).

Under the priority policy a session keeps its first input's priority and
takes each input's arrival time when it takes the input; a stop pushes it
onto its queue at its (priority, arrival time) place, and an input taken
while it is parked changes its arrival time where it sits (vLLM's
`_update_request_as_session` inside a `PriorityRequestQueue`, not
re-sorted).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass
from typing import Any

from .request import Request, RequestStatus

PARKED = RequestStatus.WAITING_FOR_STREAMING_REQ


@dataclass(frozen=True)
class StreamingUpdate:
    """A session's next input (vLLM's `StreamingUpdate`, less what the
    reference has no use for: multimodal features, sampling parameters but
    max_tokens and the prompt-logprobs flag)."""

    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    arrival_time: float = 0.0      # when the client sent it (the priority policy's key)
    # whether its sampling parameters ask for prompt logprobs, where taking
    # it sets the session's prefix-cache limit (0.34); None: it does not (0.33)
    prompt_logprobs: bool | None = None
    # its add's place in the order of arrival (`Request.arrival_order`; vLLM:
    # the update's wall-clock `arrival_time`, which the session takes with it)
    arrival_order: int = -1


class StreamingSessions:
    requests: dict[str, Request]
    waiting: deque[Request]
    running: list[Request]
    kv_holding_waiting: deque[Request]
    kv_held: dict[str, Request]
    _incarnations: itertools.count
    num_waiting_for_streaming_input: int
    _remove_waiting: Any
    finish_requests: Any
    config: Any
    kv_cache_manager: Any
    _full_sequence_admission: bool
    _is_resumption_deferred: Any
    _stops_unchunked: Any
    _clip: Any
    _allocate: Any
    _admit: Any
    _add_to_batch: Any
    _padded_decode: Any
    _pads_admitted_decodes: bool
    _pad_drafts: Any
    _priority: bool
    _note_skipped: Any
    _note_enqueued: Any
    _held_at_admission: Any

    def session_under(self, req_id: str) -> Request | None:
        """The session vLLM's `add_request` finds under `req_id` (`existing`,
        resumable): a live one, or a finished one whose blocks the KV
        connector still holds (an aborted or failed load's, a send's: vLLM
        keeps it in `requests` until the transfer is reported; here `kv_held`)."""
        found = self.requests.get(req_id) or self.kv_held.get(req_id)
        return found if found is not None and found.resumable else None

    def add_session_input(self, request: Request) -> None:
        """vLLM `add_request` of a request whose id names a session: its next
        input (the end of the session if `request` is not resumable)."""
        session = self.session_under(request.request_id)
        assert session is not None
        # 0.34's `_update_request_as_session` recomputes `prefix_cache_hit_limit` from
        # the update's sampling parameters; 0.33's keeps the first input's skip
        sets_limit = self.config.version_profile.session_input_sets_cache_limit
        # the input's arrival is numbered on the scheduler's clock of adds and turns (`_incarnations`)
        update = (StreamingUpdate(tuple(request.prompt_token_ids), request.max_tokens, request.arrival_time,
                                  request.prompt_logprobs if sets_limit else None, next(self._incarnations))
                  if request.resumable else None)
        if session.status != PARKED:
            # taken at its next stop; a finished session held for the connector has none: vLLM
            # queues onto it all the same (an input is lost: docs/vllm-kv-connector-findings.md, finding 5)
            session.streaming_queue.append(update)
        elif update is not None:
            self.num_waiting_for_streaming_input -= 1
            # in place: its new arrival time is not re-sorted into a priority queue (as vLLM's heap)
            self._take_input(session, update)
        else:
            self.finish_requests(session.request_id, RequestStatus.FINISHED_ABORTED)

    def _seats_taken(self) -> int:
        """What the waiting loop counts against max_num_seqs: the running
        requests and the parked sessions (`num_waiting_for_streaming_input`)."""
        return len(self.running) + self.num_waiting_for_streaming_input

    def _schedule_held_sessions(self, batch: Any) -> bool:
        """vLLM's waiting loop drains `kv_holding_waiting` first: sessions
        between turns that hold blocks, in queue order (FCFS; the heap's
        under the priority policy), a parked one skipped (it keeps its
        place), each admitted with its computed tokens (no prefix-cache
        lookup). False: admission stops here (the head cannot be admitted)."""
        index = 0
        while index < len(self.kv_holding_waiting) and batch.token_budget > 0:
            if self._seats_taken() >= self.config.max_num_seqs:
                return False
            request = self.kv_holding_waiting[index]
            if request.status == PARKED or self._is_resumption_deferred(request) or self._held_by_lora_cap(request):
                self._note_skipped(request)   # (max_loras: lora.py; the same loop in vLLM; cadence.py)
                index += 1
                continue
            computed = request.num_computed_tokens
            if self._held_at_admission(request, computed):
                return False                  # the prefill cadence holds a multi-token turn (cadence.py)
            # a next turn of one new token is a decode, padded with k drafts as
            # any admission (vLLM 0.34 `Scheduler.schedule`: a resuming session
            # goes through the same waiting-loop branch; drafts.py)
            padded = self._padded_decode(request, computed, batch) if self._pads_admitted_decodes else 0
            wanted = padded if padded > 0 else request.num_tokens - computed
            if self._stops_unchunked(wanted, batch.token_budget):
                return False
            num_new_tokens = self._clip(wanted, computed, batch.token_budget)
            if num_new_tokens == 0 or padded < 0 or (self._full_sequence_admission and not self.kv_cache_manager.
                                                     fits_whole_sequence(request, (), self.config.max_model_len)):
                return False
            new_blocks = self._allocate(request, num_new_tokens, (), 0)
            if new_blocks is None:
                return False
            del self.kv_holding_waiting[index]
            # vLLM sends the next turn as new-request data: its whole table
            table = list(self.kv_cache_manager.req_to_blocks.get(request.request_id, new_blocks))
            entry = self._admit(request, computed, num_new_tokens, table)
            if padded:                        # its placeholder drafts, as the waiting loop gives them
                self._pad_drafts(request, entry, num_new_tokens)
            self._add_to_batch(batch, request, entry)
        return True

    def _handle_stopped(self, request: Request, was_running: bool) -> bool:
        """vLLM `_handle_stopped_request` and the re-enqueueing after it:
        True if the stopped request finishes (not resumable, or its queued
        input is the end of the session)."""
        if not request.resumable:
            return True
        request.num_computed_tokens -= request.num_output_placeholders
        request.spec_token_ids = ()
        request.drop_stale_output = True
        request.num_stale_output_tokens = request.num_in_flight_tokens
        request.num_output_placeholders = 0
        request.incarnation = next(self._incarnations)   # the old turn's entries are superseded
        request.orphaned_incarnation = None
        if request.streaming_queue and request.streaming_queue[0] is None:
            request.streaming_queue.popleft()
            return True
        if was_running:
            self.running.remove(request)
        else:
            self._remove_waiting(request)                # stopped by a stale output while preempted
        if request.streaming_queue:
            self._take_input(request, request.streaming_queue.popleft())
        else:
            request.status = PARKED
            self.num_waiting_for_streaming_input += 1
        queue = self.kv_holding_waiting if request.num_computed_tokens > 0 else self.waiting
        queue.append(request)
        self._note_enqueued(request)                     # parked: deferred (cadence.py)
        if self._priority:                               # a heap push: at its (priority, arrival) place
            ordered = sorted(queue, key=lambda r: (r.priority, r.arrival_time, r.request_id))
            queue.clear()
            queue.extend(ordered)
        return False

    @staticmethod
    def _take_input(session: Request, update: StreamingUpdate) -> None:
        """vLLM `_update_request_as_session`: every output token but the last
        sampled one (its KV was never computed) joins the prompt, the new
        tokens are appended, the turn starts with no output."""
        keep_end = session.num_tokens - 1
        assert keep_end >= session.num_computed_tokens, "keep_end >= num_computed_tokens"
        del session.all_token_ids[keep_end:]
        session.all_token_ids.extend(update.prompt_token_ids)
        session.prompt_token_ids = list(session.all_token_ids)
        session.num_prompt_tokens = len(session.all_token_ids)
        session.max_tokens = update.max_tokens
        if update.prompt_logprobs is not None:           # 0.34: the input's prefix-cache limit
            session.prompt_logprobs = update.prompt_logprobs
        session.arrival_time = update.arrival_time       # its priority stays the first input's
        session.arrival_order = update.arrival_order     # FCFS: 0.34's `_next_waiting_queue` reads it (kv_waiting.py)
        # rehashed lazily from the tokens: the blocks before keep_end's get the
        # hashes vLLM keeps (`del block_hashes[keep_end // hash_block_size:]`)
        session.block_hashes.clear()
        session.status = RequestStatus.WAITING
