"""What every stage receives for one batch: the scheduler's snapshot, copied
out of the `SchedulerOutput` when the batch is submitted, in plain values
that pickle small. Nothing is read from the scheduler's objects afterwards.

Two ways for stage 0 to learn a running request's tokens:
* from the snapshot (vLLM's synchronous PP: `CachedRequestData.new_token_ids`
  plus the scheduled drafts): the sampled tokens travel from the last stage
  to the driver, and from the scheduler to stage 0 in the next batch;
* `feedback=True`: from the last stage directly (feedback.py), as vLLM's V2
  model runner does under async scheduling. The plan then carries no known
  tokens of a running request (`known_token_ids=None`), only the prompt of an
  admission and the whole sequence of a resumption (`all_token_ids`: the V2
  runner re-adds a resumed request as new with `prefill_token_ids =
  req._all_token_ids`, vLLM 0.33 `Scheduler.schedule`). Under async
  scheduling with drafts a running entry's `start` and `draft_token_ids` are
  the scheduler's guesses (drafts counted as accepted, drafts one decode
  old): the stages run it at their own count and fill its draft slots from
  the feedback (worker.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from flightcheck.reference import NewRequestData, SchedulerOutput

# A resumed request's whole token sequence, read when the snapshot is made.
AllTokenIds = Callable[[str], Sequence[int]]


@dataclass(frozen=True)
class EntryPlan:
    req_id: str
    start: int                          # num_computed_tokens (prefix hit included)
    num_new: int                        # tokens scheduled, drafts included
    # The num_new - drafts known tokens from `start` on; None (feedback mode,
    # a running request): the stages know them (stage 0 from the feedback).
    known_token_ids: tuple[int, ...] | None
    draft_token_ids: tuple[int, ...]
    new_block_ids: tuple[int, ...]
    replaces_table: bool                # admission or resumption: the whole table
    prompt_token_ids: tuple[int, ...] | None   # admissions only
    temperature: float = 0.0
    seed: int | None = None
    # Feedback mode, resumptions only: every token the scheduler holds.
    all_token_ids: tuple[int, ...] | None = None

    @property
    def num_drafts(self) -> int:
        return len(self.draft_token_ids)

    @property
    def num_known(self) -> int:
        """Known tokens scheduled (the rest are drafts)."""
        return self.num_new - len(self.draft_token_ids)

    @property
    def is_resumption(self) -> bool:
        return self.replaces_table and self.prompt_token_ids is None


@dataclass(frozen=True)
class BatchPlan:
    batch_id: int
    entries: tuple[EntryPlan, ...]
    finished_req_ids: tuple[str, ...]   # stages drop their state for these first
    num_spec_tokens: int = 0            # drafts the last stage proposes per request
    kind: str = "batch"                 # "batch"; "reset" drops all request state; "stop"
    # Preempted since the last plan: their incarnations end (feedback mode
    # drops their tokens still to come, like vLLM's freed slots).
    preempted_req_ids: tuple[str, ...] = ()

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


def plan_from_scheduler_output(out: SchedulerOutput, num_spec_tokens: int = 0, *,
                               feedback: bool = False,
                               all_token_ids: AllTokenIds | None = None,
                               finished_before: Sequence[str] = (),
                               preempted_before: Sequence[str] = ()) -> BatchPlan:
    """The batch's plan. `feedback`: leave a running request's known tokens
    out (stage 0 takes them from the last stage) and give a resumption the
    whole sequence, read now through `all_token_ids`. `finished_before`,
    `preempted_before`: ids that empty batches since the last plan carried
    (vLLM 0.33 queues empty batches; no stage runs them)."""
    if feedback and all_token_ids is None:
        raise ValueError("feedback mode needs all_token_ids for resumptions")
    entries = []
    for e in out.entries:
        is_new = type(e) is NewRequestData
        resumed = not is_new and e.resumed_from_preemption
        params = e.sampling_params if is_new else None
        known = tuple(e.new_token_ids)
        if feedback and not is_new and not resumed:
            known = None                          # vLLM async: no new_token_ids
        entries.append(EntryPlan(
            req_id=e.req_id, start=e.num_computed_tokens, num_new=e.num_new_tokens,
            known_token_ids=known, draft_token_ids=tuple(e.spec_token_ids),
            new_block_ids=tuple(e.new_block_ids),
            replaces_table=is_new or resumed,
            prompt_token_ids=tuple(e.prompt_token_ids) if is_new else None,
            temperature=params.temperature if params is not None else 0.0,
            seed=params.seed if params is not None else None,
            all_token_ids=(tuple(all_token_ids(e.req_id))
                           if feedback and resumed and all_token_ids is not None else None)))
    assert out.batch_id is not None, "an empty batch is never submitted"
    return BatchPlan(out.batch_id, tuple(entries),
                     tuple(sorted({*finished_before, *out.finished_req_ids})), num_spec_tokens,
                     preempted_req_ids=(*preempted_before, *out.preempted_req_ids))


class PendingIds:
    """Ids an empty batch carried (vLLM 0.33 queues empty batches, which no
    stage runs): they go to the stages with the next batch, before its entries."""

    def __init__(self) -> None:
        self.finished: list[str] = []
        self.preempted: list[str] = []

    def hold(self, out: SchedulerOutput) -> None:
        self.finished.extend(out.finished_req_ids)
        self.preempted.extend(out.preempted_req_ids)

    def plan(self, out: SchedulerOutput, num_spec_tokens: int, *, feedback: bool,
             all_token_ids: AllTokenIds | None) -> BatchPlan:
        plan = plan_from_scheduler_output(out, num_spec_tokens, feedback=feedback,
                                          all_token_ids=all_token_ids,
                                          finished_before=self.finished,
                                          preempted_before=self.preempted)
        self.finished, self.preempted = [], []
        return plan

    def clear(self) -> None:
        self.finished, self.preempted = [], []
