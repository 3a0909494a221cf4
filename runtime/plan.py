"""What every stage receives for one batch: the scheduler's snapshot, copied
out of the `SchedulerOutput` when the batch is submitted, in plain values
that pickle small. Nothing is read from the scheduler's objects afterwards.

As in vLLM, stage 0 learns the tokens to embed from the snapshot
(`NewRequestData.prompt_token_ids`, `CachedRequestData.new_token_ids` plus
the scheduled drafts): the sampled tokens travel from the last stage to the
driver, and from the scheduler to stage 0 in the next batch that needs them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flightcheck.reference import NewRequestData, SchedulerOutput


@dataclass(frozen=True)
class EntryPlan:
    req_id: str
    start: int                          # num_computed_tokens (prefix hit included)
    num_new: int                        # tokens scheduled, drafts included
    token_ids: tuple[int, ...]          # the num_new tokens: known ones, then drafts
    num_drafts: int
    new_block_ids: tuple[int, ...]
    replaces_table: bool                # admission or resumption: the whole table
    prompt_token_ids: tuple[int, ...] | None   # admissions only
    temperature: float = 0.0
    seed: int | None = None


@dataclass(frozen=True)
class BatchPlan:
    batch_id: int
    entries: tuple[EntryPlan, ...]
    finished_req_ids: tuple[str, ...]   # stages drop their state for these first
    num_spec_tokens: int = 0            # drafts the last stage proposes per request
    kind: str = "batch"                 # "batch"; "reset" drops all request state; "stop"

    @property
    def num_tokens(self) -> int:
        return sum(e.num_new for e in self.entries)


@dataclass(frozen=True)
class BatchResult:
    """What the last stage returns for one batch."""

    batch_id: int
    req_ids: tuple[str, ...]
    sampled_token_ids: tuple[tuple[int, ...], ...]
    draft_token_ids: tuple[tuple[int, ...], ...]
    stage_times: tuple[tuple[float, float, float], ...] = field(default=())  # (t0, t1, recv) per stage


def plan_from_scheduler_output(out: SchedulerOutput, num_spec_tokens: int = 0) -> BatchPlan:
    entries = []
    for e in out.entries:
        is_new = type(e) is NewRequestData
        drafts = tuple(e.spec_token_ids)
        params = e.sampling_params if is_new else None
        entries.append(EntryPlan(
            req_id=e.req_id, start=e.num_computed_tokens, num_new=e.num_new_tokens,
            token_ids=tuple(e.new_token_ids) + drafts, num_drafts=len(drafts),
            new_block_ids=tuple(e.new_block_ids),
            replaces_table=is_new or e.resumed_from_preemption,
            prompt_token_ids=tuple(e.prompt_token_ids) if is_new else None,
            temperature=params.temperature if params is not None else 0.0,
            seed=params.seed if params is not None else None))
    assert out.batch_id is not None, "an empty batch is never submitted"
    return BatchPlan(out.batch_id, tuple(entries), tuple(sorted(out.finished_req_ids)),
                     num_spec_tokens)
