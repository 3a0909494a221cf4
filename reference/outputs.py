"""What crosses the scheduler/executor boundary (vLLM's `sched/output.py`,
`outputs.py` and the engine-core outputs).

A batch's snapshot: every scheduled request gets a fresh `NewRequestData`
(first admission) or `CachedRequestData` (running, or resumed after
preemption) built in `schedule()`, never reused by a later batch and never
changed after `schedule()` returns. Whoever reads a batch later (a worker
that reads lazily, `update_from_output`) sees exactly what was scheduled.
They are mutable slotted dataclasses only because building frozen ones costs
more per request per step; treat them as values.

Every entry records:
* `incarnation`: the request incarnation it was scheduled for;
* `num_computed_tokens`: the start position, the prefix-cache hit included;
* `num_new_tokens`: tokens scheduled, drafts included;
* `spec_token_ids`: the draft tokens scheduled with it;
* `new_token_ids`: the known tokens of [start, start + n - drafts), which
  stage 0 of a pipeline needs (it has no channel from the last stage);
* new block ids: blocks appended to the request's table in this batch (for
  an admission or resumption its whole table, cached blocks first);
* `samples`: start + n - drafts reaches the request's known tokens, so the
  model returns a token for it (final chunk or decode).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .request import SamplingParams


@dataclass(slots=True, eq=False)
class NewRequestData:
    req_id: str
    incarnation: int
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: tuple[int, ...]
    num_computed_tokens: int
    num_new_tokens: int
    num_cached_tokens: int
    new_token_ids: list[int]
    samples: bool
    spec_token_ids: tuple[int, ...] = ()      # never drafts on admission
    external: int = 0                         # tokens of the start a sync KV load brings in
    fence_blocks: tuple[int, ...] = ()        # its table when scheduled, under the KV step fence
    rolled_back: bool = False                 # first entry since a KV load's rollback: the worker forgets

    @property
    def new_block_ids(self) -> tuple[int, ...]:
        return self.block_ids

    @property
    def resumed_from_preemption(self) -> bool:
        return False

    @property
    def num_drafts(self) -> int:
        return len(self.spec_token_ids)


@dataclass(slots=True, eq=False)
class CachedRequestData:
    req_id: str
    incarnation: int
    resumed_from_preemption: bool
    new_token_ids: list[int]
    new_block_ids: tuple[int, ...]
    num_computed_tokens: int
    num_new_tokens: int
    num_cached_tokens: int
    spec_token_ids: tuple[int, ...]
    samples: bool
    external: int = 0                         # tokens of the start a sync KV load brings in
    fence_blocks: tuple[int, ...] = ()        # its table when scheduled, under the KV step fence
    rolled_back: bool = False                 # first entry since a KV load's rollback: the worker forgets

    @property
    def num_drafts(self) -> int:
        return len(self.spec_token_ids)


RequestData = NewRequestData | CachedRequestData


@dataclass(slots=True, eq=False)
class SchedulerOutput:
    batch_id: int | None                      # 1, 2, ... for batches with tokens; None if empty
    entries: list[RequestData]                # in placement order: running, then admissions
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: list[CachedRequestData]
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict[str, tuple[int, ...]]
    preempted_req_ids: list[str]
    finished_req_ids: set[str]                # finished since the last batch: workers drop state
    kv_loads: list[tuple[str, int]]           # (request, start): parked for an async KV load here
    # Async scheduling: a structured request's earlier output is in flight (grammar.py).
    pending_structured_output_tokens: bool = False
    # The model runner proposes no drafts after this batch (vLLM 0.34
    # `SchedulerOutput.skip_drafts`; batch.py `drafts_unused`).
    skip_drafts: bool = False

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0


@dataclass(slots=True, eq=False)
class ModelRunnerOutput:
    """What a batch returns: per scheduled request, the sampled tokens (`[]`
    for a non-final prefill chunk; accepted drafts then the bonus token with
    spec decode) and, optionally, the drafts proposed for its next step."""

    req_ids: list[str]
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]]
    spec_token_ids: list[list[int]] | None = None

    @classmethod
    def from_tokens(cls, tokens: dict[str, list[int]],
                    drafts: dict[str, list[int]] | None = None) -> "ModelRunnerOutput":
        req_ids = list(tokens)
        spec = None if drafts is None else [list(drafts.get(r, ())) for r in req_ids]
        return cls(req_ids, {r: i for i, r in enumerate(req_ids)},
                   [list(tokens[r]) for r in req_ids], spec)

    def tokens_of(self, req_id: str) -> list[int]:
        """The tokens returned for `req_id` (`[]` if it has no row)."""
        row = self.req_id_to_index.get(req_id)
        return self.sampled_token_ids[row] if row is not None else []

    def drafts_of(self, req_id: str) -> Sequence[int]:
        """The drafts proposed for `req_id`'s next step (`()` if none)."""
        row = self.req_id_to_index.get(req_id)
        return self.spec_token_ids[row] if self.spec_token_ids is not None and row is not None else ()


@dataclass(slots=True)
class EngineCoreOutput:
    """One request's result of one completed batch. One is made per sampled
    token: a slotted dataclass builds in about 2/3 of a NamedTuple's time
    (whose generated `__new__` packs a tuple first)."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None          # "stop", "length" or None
    stop_reason: int | None = None            # the stop token id, if one stopped it

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
