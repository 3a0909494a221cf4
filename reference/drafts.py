"""Where a request's drafts come from under vLLM 0.33 (a mixin of
`Scheduler`, scheduler.py), each step read from a profile constant
(profiles.py):

* `update_draft_token_ids`: the drafts the sync engine hands over at
  submission (`EngineCore.post_step`; only as released,
  `drafts_handed_over_at_submission`), which read the `is_prefill_chunk`
  that `_mark_prefill_chunks` leaves;
* `_padded_decode`: the waiting loop's padding of an admission with one
  token left to 1 + k tokens, k placeholder drafts (`pads_admitted_decodes`).

Async scheduling's placeholder drafts are set where its placeholders are
(`Scheduler._add_placeholders`).
"""

from __future__ import annotations

from collections.abc import Sequence

from .batch import Batch
from .config import SchedulerConfig, cdiv
from .kv_cache_manager import KVCacheManager
from .outputs import CachedRequestData
from .profiles import Profile
from .request import Request


class DraftSources:
    """The draft steps of `Scheduler`, which holds the state below."""

    config: SchedulerConfig
    requests: dict[str, Request]
    kv_cache_manager: KVCacheManager
    _threshold: int

    def _read_draft_rules(self, profile: Profile) -> None:
        """The profile's draft rules, read once (`Scheduler.__init__`): drafts
        come with the output (update.py), or, under 0.33 async, as
        placeholders (`_add_placeholders`); 0.33 sync as released hands them
        over at submission (`update_draft_token_ids`). Both empty a scheduled
        running request's drafts (`_schedule_running`)."""
        k = self.config.num_spec_tokens
        self._drafts_at_submission = profile.drafts_handed_over_at_submission
        self._placeholder_drafts = (-1,) * k if profile.placeholder_drafts else ()
        self._drafts_emptied_when_scheduled = self._drafts_at_submission or profile.placeholder_drafts
        self._drafts_with_output = not self._drafts_emptied_when_scheduled      # update_from_output
        self._settles_blocks_with_drafts = profile.settles_blocks_with_drafts and k > 0   # _apply_sampled
        self._pads_admitted_decodes = profile.pads_admitted_decodes and k > 0             # _schedule_waiting
        self._padding_asserted_whole = profile.padding_asserted_whole                     # _pad_drafts
        self._demands_blocks_past_max_model_len = profile.demands_blocks_past_max_model_len  # _allocate_or_preempt

    def _unclipped_demand_fits(self, request: Request, token_budget: int) -> bool:
        """vLLM 0.8.4 `Scheduler.schedule`, running loop: `num_tokens_with_spec
        - num_computed_tokens` clipped by the threshold and the budget only
        (0.8.5 added the max_model_len clip), so `KVCacheManager.allocate_slots`
        fails when the blocks for every held draft, past max_model_len too,
        exceed the free ones: the request is then preempted (or preempts).
        Always true elsewhere; where the blocks can be had the entry is
        clipped (`_clip`: scheduling past max_model_len is 0.8.4's bug)."""
        if not self._demands_blocks_past_max_model_len:
            return True
        wanted = len(request.all_token_ids) + len(request.spec_token_ids) - request.num_computed_tokens
        if 0 < self._threshold < wanted:
            wanted = self._threshold
        wanted = min(wanted, token_budget)
        manager = self.kv_cache_manager
        needed = (cdiv(request.num_computed_tokens + wanted, self.config.block_size)
                  - len(manager.req_to_blocks.get(request.request_id, ())))
        return needed <= manager.get_num_free_blocks()

    def update_draft_token_ids(self, req_ids: Sequence[str], draft_token_ids: Sequence[Sequence[int]]) -> None:
        """vLLM 0.33 `Scheduler.update_draft_token_ids`, which the sync engine
        calls in `EngineCore.post_step` with the drafts the model proposed for
        the batch it has just submitted (as released only: profiles.py
        `drafts_handed_over_at_submission`): an unknown or finished request is
        skipped, one whose entry was a prefill chunk drops its drafts, any
        other takes them (no grammar to validate them against)."""
        for req_id, drafts in zip(req_ids, draft_token_ids):
            request = self.requests.get(req_id)
            if request is None or request.is_finished():
                continue
            if request.is_prefill_chunk:
                request.spec_token_ids = ()
                continue
            request.spec_token_ids = tuple(drafts)

    @staticmethod
    def _mark_prefill_chunks(batch: Batch) -> None:
        """vLLM 0.33 `Scheduler._update_after_schedule`, after the advance:
        `is_prefill_chunk = num_computed_tokens < num_tokens +
        num_output_placeholders`, which `update_draft_token_ids` reads when
        the drafts of this batch are handed over (`EngineCore.post_step`)."""
        for request in batch.requests:
            request.is_prefill_chunk = request.num_computed_tokens < (
                len(request.all_token_ids) + request.num_output_placeholders)

    def _padded_decode(self, request: Request, num_hit_tokens: int, batch: Batch) -> int:
        """vLLM 0.33 `Scheduler.schedule`, waiting loop (profiles.py
        `pads_admitted_decodes`): `1 + k` when this admission, with one token
        left to compute, is padded with k placeholder drafts; -1 when that
        padding does not fit the token budget (admission stops); else 0. The
        running loop's requests count by the `is_prefill_chunk` their previous
        entry left (`prefill_scheduled |= request.is_prefill_chunk`)."""
        if request.num_tokens - num_hit_tokens != 1:
            return 0
        running = [r for r, e in zip(batch.requests, batch.entries)
                   if type(e) is CachedRequestData and not e.resumed_from_preemption]
        if any(r.is_prefill_chunk for r in running) or not (running or num_hit_tokens > 0):
            return 0
        padded = 1 + self.config.num_spec_tokens
        if num_hit_tokens + padded + 1 > self.config.max_model_len:
            return 0
        return -1 if padded > batch.token_budget else padded
