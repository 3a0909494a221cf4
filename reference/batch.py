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

    __slots__ = ("max_num_tokens", "token_budget", "requests", "entries", "new_reqs", "cached_reqs",
                 "num_scheduled_tokens", "spec_decode_tokens", "preempted", "kv_loads")

    def __init__(self, token_budget: int) -> None:
        self.max_num_tokens = token_budget
        self.token_budget = token_budget
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
        self.token_budget -= entry.num_new_tokens

    @property
    def total_num_scheduled_tokens(self) -> int:
        return self.max_num_tokens - self.token_budget

    def to_output(self, batch_id: int | None, finished_req_ids: set[str]) -> SchedulerOutput:
        return SchedulerOutput(batch_id, self.entries, self.new_reqs, self.cached_reqs,
                               self.num_scheduled_tokens, self.total_num_scheduled_tokens,
                               self.spec_decode_tokens, self.preempted, finished_req_ids,
                               self.kv_loads)


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
