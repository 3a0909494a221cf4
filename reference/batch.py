"""The batch one `schedule()` call forms, and the snapshots it hands out.

Every scheduled request gets a fresh entry, built from the request's
pre-batch counts (the scheduler advances them only once the batch is
formed): `NewRequestData` on first
admission, `CachedRequestData` when it runs on or resumes after preemption.
`Batch` fills the `SchedulerOutput`'s fields as entries are added (one pass
over the scheduled requests, not one more per field), and `to_output` wraps
them.
"""

from __future__ import annotations

from collections.abc import Sequence

from .block_pool import KVCacheBlock
from .outputs import CachedRequestData, NewRequestData, RequestData, SchedulerOutput
from .request import Request


class Batch:
    """The batch under construction, local to one schedule() call."""

    __slots__ = ("max_num_tokens", "token_budget", "draft_slots", "drafts_needed", "requests", "entries",
                 "new_reqs", "cached_reqs", "num_scheduled_tokens", "spec_decode_tokens", "preempted", "kv_loads")

    def __init__(self, token_budget: int, draft_slots: int = 0, can_skip_drafts: bool = False) -> None:
        # vLLM 0.33/0.34 `Scheduler.schedule` keeps `input_budget` beside
        # `token_budget` and charges each entry `num_new_tokens + draft_slots`
        # to it (`max_num_new_slots_for_drafting`: 1 for a draft model), clips
        # every entry to `input_budget - draft_slots` and stops its loops once
        # that is <= 0: `token_budget` here is `input_budget - draft_slots`,
        # which is vLLM's token_budget itself without a draft model.
        self.max_num_tokens = token_budget
        self.draft_slots = draft_slots
        self.token_budget = token_budget - draft_slots
        # Whether a request of the batch can use the drafts proposed after it
        # (vLLM 0.34 `Scheduler.schedule`'s `drafts_needed`, from
        # `_drafts_unused`; it stays set when that request is preempted later
        # in the call); `skip_drafts` is its negation. Set from the start
        # when the scheduler cannot skip drafts (`can_skip_drafts`).
        self.drafts_needed = not can_skip_drafts
        self.requests: list[Request] = []                    # placement order
        self.entries: list[RequestData] = []                 # the same order
        self.new_reqs: list[NewRequestData] = []
        self.cached_reqs: list[CachedRequestData] = []
        self.num_scheduled_tokens: dict[str, int] = {}
        self.spec_decode_tokens: dict[str, tuple[int, ...]] = {}
        self.preempted: list[str] = []
        self.kv_loads: list[tuple[str, int]] = []           # parked for an async KV load

    def add(self, request: Request, entry: RequestData) -> None:
        self.requests.append(request)
        self.entries.append(entry)
        if type(entry) is NewRequestData:
            self.new_reqs.append(entry)
        else:
            self.cached_reqs.append(entry)  # type: ignore[arg-type]
        self.num_scheduled_tokens[entry.req_id] = entry.num_new_tokens
        if entry.spec_token_ids:
            self.spec_decode_tokens[entry.req_id] = entry.spec_token_ids
        self.token_budget -= entry.num_new_tokens + self.draft_slots
        if not self.drafts_needed and not drafts_unused(request, entry.num_computed_tokens, entry.num_new_tokens):
            self.drafts_needed = True

    def restore(self, req_id: str) -> None:
        """A preempted entry's tokens back to the budget (`token_budget += restored`,
        `input_budget += restored + draft_slots`)."""
        self.token_budget += self.num_scheduled_tokens.pop(req_id) + self.draft_slots

    @property
    def tokens_left(self) -> int:
        """vLLM's `token_budget` (0.34's `loads_only` reads it)."""
        return self.token_budget + self.draft_slots * (len(self.num_scheduled_tokens) + 1)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return self.max_num_tokens - self.tokens_left

    def to_output(self, batch_id: int | None, finished_req_ids: set[str]) -> SchedulerOutput:
        return SchedulerOutput(batch_id, self.entries, self.new_reqs, self.cached_reqs,
                               self.num_scheduled_tokens, self.total_num_scheduled_tokens,
                               self.spec_decode_tokens, self.preempted, finished_req_ids,
                               self.kv_loads, skip_drafts=not self.drafts_needed)


def drafts_unused(request: Request, num_computed_tokens: int, num_new_tokens: int) -> bool:
    """vLLM 0.34 `Scheduler._drafts_unused`: the drafts proposed for
    `request` after this entry are sure to go unused, because the entry is a
    non-final prefill chunk (it samples nothing), or it samples the request's
    last token under max_tokens even if every draft is rejected (counting
    one more for a sampling entry still in flight under async scheduling)."""
    if num_computed_tokens + num_new_tokens < len(request.all_token_ids):
        return True
    least_outputs = request.num_output_tokens + 1 + (1 if request.num_output_placeholders > 0 else 0)
    return least_outputs >= request.max_tokens


def _block_ids(blocks: Sequence[KVCacheBlock]) -> tuple[int, ...]:
    return tuple([b.block_id for b in blocks]) if blocks else ()


def new_request_data(request: Request, start: int, num_hit_tokens: int, num_new_tokens: int,
                     new_blocks: Sequence[KVCacheBlock]) -> NewRequestData:
    """First admission: the whole table (hit blocks first) and the prompt."""
    return NewRequestData(
        req_id=request.request_id, incarnation=request.incarnation,
        prompt_token_ids=request.prompt_token_ids, sampling_params=request.sampling_params,
        block_ids=_block_ids(new_blocks), num_computed_tokens=start,
        num_new_tokens=num_new_tokens, num_cached_tokens=num_hit_tokens,
        new_token_ids=request.prompt_token_ids[num_hit_tokens:num_hit_tokens + num_new_tokens],
        samples=start + num_new_tokens >= request.num_tokens)
