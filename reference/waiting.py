"""The waiting loop without a KV connector (a mixin of `Scheduler`; vLLM
0.8.5 / 0.33.0 / 0.34.0 `Scheduler.schedule`, "Next, schedule the WAITING
requests"): FCFS admission with prefix-cache hits, in a step that preempted
nothing. With a connector, kv_waiting.py's loop runs instead.

The version differences it reads are the scheduler's profile constants
(profiles.py), copied by `Scheduler.__init__`: 0.33's deferred resumption
and full-sequence gate, 0.33/0.34's LoRA cap (lora.py), 0.33/0.34's stop at a prompt that would need a chunk
with chunked prefill off, 0.34's opt-in reorder by cached prefix.
"""

from __future__ import annotations

from .admission_order import reorder_by_cached_prefix
from .batch import Batch
from .outputs import RequestData
from .request import Request, RequestStatus


class WaitingLoop:
    def _schedule_waiting(self, batch: Batch) -> None:
        """FCFS admission (vLLM `Scheduler.schedule`, waiting loop): the first
        request not skipped blocks everything behind it when it cannot be
        admitted. vLLM 0.33 skips a preempted request whose deliver-mode stale
        output is in flight (`_is_resumption_deferred`, `skip_request`: it
        keeps its place, and those behind it may be admitted; 0.8.x keeps no
        stale count, so nothing is skipped and the head blocks), and admits
        only with room for the whole sequence (`full_sequence_admission`,
        `allocate_slots(full_sequence_must_fit=...)`)."""
        if self.connector is not None:
            return self._schedule_waiting_kv(batch)   # kv_waiting.py
        kv = self.kv_cache_manager
        if self._cache_aware_window and not self.defer_prefills:   # vLLM 0.34, opt-in; not in a held call
            reorder_by_cached_prefix(self.waiting, kv, self._cache_aware_window,
                                     self.config.cache_aware_admission_threshold)
        if self.kv_holding_waiting and not self._schedule_held_sessions(batch):
            return                            # streaming sessions between turns first (sessions.py)
        if not self._takes_waiting_queue():
            return                            # PAUSED_NEW: only those (reset_pause.py)
        index = 0                             # requests before it were skipped
        while index < len(self.waiting) and batch.token_budget > 0:
            if self._seats_taken() >= self.config.max_num_seqs:     # parked sessions keep theirs (sessions.py)
                break
            request = self.waiting[index]
            if (self._blocked_on_grammar(request) or self._is_resumption_deferred(request)   # grammar.py
                    or request.status == RequestStatus.WAITING_FOR_STREAMING_REQ
                    or self._held_by_lora_cap(request)):          # max_loras (lora.py)
                self._note_skipped(request)   # the prefill cadence's deferred_waiting (cadence.py)
                index += 1
                continue
            computed_blocks, num_hit_tokens = kv.get_computed_blocks(request)
            if self._held_at_admission(request, num_hit_tokens):
                break                         # the prefill cadence holds prefills (cadence.py)
            padded = self._padded_decode(request, num_hit_tokens, batch) if self._pads_admitted_decodes else 0
            wanted = padded if padded > 0 else request.num_tokens - num_hit_tokens
            if self._stops_unchunked(wanted, batch.token_budget):
                break
            num_new_tokens = self._clip(wanted,
                                        request.num_computed_tokens, batch.token_budget)
            if num_new_tokens == 0:
                break
            if padded < 0:
                break                         # vLLM: "Prefer to not schedule than schedule un-padded"
            if self._full_sequence_admission and not kv.fits_whole_sequence(
                    request, computed_blocks, self.config.max_model_len):
                break
            new_blocks = self._allocate(request, num_new_tokens, computed_blocks, 0)
            if new_blocks is None:
                break
            del self.waiting[index]
            entry = self._admit(request, num_hit_tokens, num_new_tokens, new_blocks)
            if padded:
                self._pad_drafts(request, entry, num_new_tokens)
            self._add_to_batch(batch, request, entry)

    def _pad_drafts(self, request: Request, entry: RequestData, num_new_tokens: int) -> None:
        """A padded admission's placeholder drafts: those the clip left (only
        the threshold can cut it: a padding past the budget stops admission).
        vLLM 0.33 and 0.34 as released assert it was not cut
        (`Scheduler.schedule`, waiting loop: `assert num_new_tokens == 1 +
        self.num_spec_tokens`; profiles.py `padding_asserted_whole`)."""
        if self._padding_asserted_whole:
            assert num_new_tokens == 1 + self.config.num_spec_tokens, (
                f"{request.request_id}: padded admission cut to {num_new_tokens} tokens, "
                "assert num_new_tokens == 1 + self.num_spec_tokens")
        entry.spec_token_ids = (-1,) * min(self.config.num_spec_tokens, num_new_tokens - 1)
        if not self._drafts_emptied_when_scheduled:
            request.spec_token_ids = entry.spec_token_ids    # held as scheduled drafts are

    def _stops_unchunked(self, num_new_tokens: int, token_budget: int) -> bool:
        """Chunked prefill off (vLLM 0.33, 0.34 `Scheduler.schedule`, waiting
        loop): the new tokens, cut by the threshold in force, exceed the
        budget left, so the request would be admitted with a chunk: stop."""
        if not self._stops_unchunked_prefill:
            return False
        if 0 < self._threshold < num_new_tokens:
            num_new_tokens = self._threshold
        return num_new_tokens > token_budget
