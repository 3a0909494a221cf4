"""One pipeline stage's work on one batch, independent of transport.

The worker keeps, per request, what a stage must remember between batches:
its block table (from the snapshots' new block ids), the number of known
tokens (to tell a final prefill chunk from a partial one, as vLLM's model
runner does from its own state) and, on the last stage, the token history
the drafter looks up. It drops a request's state when the request's id
arrives in `finished_req_ids`.

With sampled-token feedback (feedback.py) the plan leaves a running
request's known tokens out: stage 0 takes each one it has not seen from the
last stage's feedback (by generation and position), the last stage keeps the
tokens it sampled, and the stages between need no token ids at all. Every
stage numbers the incarnations (generations) in plan order: an admission or
a resumption opens one, a finish or a preemption closes it.

With feedback every stage also keeps its own count of a request's computed
positions (`RequestState.num_computed`), as vLLM's V2 runner keeps
`num_computed_tokens` on the device and corrects it by `num_rejected`
(`post_update`, v1/worker/gpu/input_batch.py): under async scheduling the
scheduler places a decode before the previous one's rejections are known,
counting its drafts as accepted, so the plan's `start` may lie past the
request's true position by the drafts that are rejected meanwhile. A running
entry runs at the stage's own count instead (`_true_start`), so the positions
of rejected drafts are written again by the next decode and no token attends
to their stale K/V. The stages before the last learn the rejection count
from the entry's feedback record, the last stage when it samples; stage 0
fills the entry's draft slots with the drafts the last stage proposed after
the previous decode (`draft_slots`), which the scheduler did not have yet.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .attention import BatchLayout, PagedAttention, SeqSlice
from .drafter import propose_ngram
from .feedback import EntryFeedback, SampledTokens, TokenInbox
from .kv_cache import PagedKVCache
from .plan import BatchPlan, BatchResult, EntryPlan
from .sampler import accept_drafts, sample_tokens
from .stages import Stage


@dataclass
class RequestState:
    block_table: list[int]
    num_known: int
    history: list[int]                  # tokens by position (feedback mode: known ones only)
    temperature: float = 0.0
    seed: int = 0
    generation: int | None = None       # None: closed by a preemption
    # Feedback mode: positions this stage has computed (rejected drafts
    # taken off once known); the index (`StageWorker.num_batches` then) of
    # the batch of the last sampling entry whose rejections it has not yet
    # taken off (stages before the last); the drafts the last stage proposed
    # after that entry, for the next decode's draft slots.
    num_computed: int = 0
    unsettled_batch: int | None = None
    proposed_drafts: tuple[int, ...] = ()


# The token in a draft slot the drafter left empty (it proposed fewer drafts
# than the scheduler placed slots for): checked like any draft, so it is
# accepted only where the model itself chooses it.
EMPTY_DRAFT_SLOT = 0


def draft_slots(proposed: tuple[int, ...], num_slots: int) -> list[int]:
    """The tokens of an entry's `num_slots` draft slots, from the drafts the
    last stage proposed (vLLM fills its `-1` placeholder drafts on the
    device the same way); stage 0 embeds them and the last stage checks them."""
    return [*proposed[:num_slots], *[EMPTY_DRAFT_SLOT] * (num_slots - len(proposed))]


@dataclass
class LogitsRecord:
    """Optional capture of the last stage's logits (tests)."""

    rows: list[tuple[str, int, Tensor]] = field(default_factory=list)   # (req, position, [V])


class StageWorker:
    def __init__(self, stage: Stage, num_blocks: int, block_size: int, *,
                 seed: int = 0, top_p: float = 1.0, device: torch.device | str = "cpu") -> None:
        cfg = stage.config
        self.stage, self.device = stage, torch.device(device)
        self.block_size = block_size
        self.dtype = next(stage.parameters()).dtype
        self.cache = PagedKVCache(stage.layer_ids, num_blocks, block_size, cfg.n_kv_heads,
                                  cfg.head_dim, self.dtype, device)
        self.seed, self.top_p = seed, top_p
        self.requests: dict[str, RequestState] = {}
        self.record: LogitsRecord | None = None
        # Sampled-token feedback: stage 0 reads `inbox`, the last stage
        # calls `send_sampled` with every batch's tokens.
        self.feedback = False
        self.inbox: TokenInbox | None = None
        self.send_sampled: Callable[[SampledTokens], None] | None = None
        self._next_generation = 0
        self.num_batches = 0                # batch plans executed (since the start)
        # Feedback mode: running entries run behind the plan's `start` (drafts
        # the scheduler counted as accepted were rejected), and draft slots
        # filled with drafts the snapshot did not have (tests read these).
        self.num_behind_plan = 0
        self.num_drafts_not_in_plan = 0

    def use_feedback(self, inbox: TokenInbox | None,
                     send_sampled: Callable[[SampledTokens], None] | None) -> None:
        """Feedback mode: every stage but the last needs `inbox`, the last
        stage `send_sampled` (a single stage needs neither: it keeps what it
        samples)."""
        if self._takes_feedback and inbox is None:
            raise ValueError("a stage before the last needs an inbox for the sampled-token "
                             "feedback")
        if self._sends_feedback and send_sampled is None:
            raise ValueError("the last stage needs a way to send its sampled tokens")
        self.feedback, self.inbox, self.send_sampled = True, inbox, send_sampled

    # -- per-request state ------------------------------------------------------

    @property
    def _takes_feedback(self) -> bool:
        return not self.stage.is_last

    @property
    def _sends_feedback(self) -> bool:
        return self.stage.is_last and not self.stage.is_first

    def _open_generation(self, state: RequestState) -> None:
        state.generation, self._next_generation = self._next_generation, self._next_generation + 1
        if self.inbox is not None:
            self.inbox.open(state.generation)

    def _close_generation(self, state: RequestState | None) -> None:
        if state is not None and state.generation is not None:
            if self.inbox is not None:
                self.inbox.close(state.generation)
            state.generation = None

    def _update_state(self, e: EntryPlan) -> tuple[RequestState, int]:
        """The entry's request state and the position its tokens start at
        (the plan's `start`, or with feedback the stage's own count)."""
        if e.known_token_ids is not None and len(e.known_token_ids) != e.num_known:
            raise ValueError(f"batch entry {e.req_id}: {len(e.known_token_ids)} known token ids "
                             f"for {e.num_known} scheduled")
        if e.prompt_token_ids is not None:                 # admission
            seed = e.seed if e.seed is not None else self.seed * 7919 + zlib.crc32(e.req_id.encode())
            state = RequestState(list(e.new_block_ids), len(e.prompt_token_ids),
                                 list(e.prompt_token_ids), e.temperature, seed)
            self._close_generation(self.requests.get(e.req_id))
            self.requests[e.req_id] = state
            self._open_generation(state)
            start = e.start
        else:
            state = self.requests.get(e.req_id)
            if state is None:
                raise ValueError(f"batch entry for {e.req_id!r}, which this stage has not seen "
                                 "admitted")
            if e.replaces_table:
                state.block_table = list(e.new_block_ids)
                self._close_generation(state)
                self._open_generation(state)
            else:
                state.block_table.extend(e.new_block_ids)
            start = self._true_start(e, state) if self.feedback else e.start
            if self.feedback:
                self._learn_tokens(e, state, start)
            else:
                if len(state.history) < start:
                    raise ValueError(f"{e.req_id}: chunk starts at {start}, "
                                     f"{len(state.history)} tokens known")
                # Drafts too: the accepted ones are known tokens the next chunk does not repeat.
                state.history[start:] = [*(e.known_token_ids or ()), *e.draft_token_ids]
        state.num_known = max(state.num_known, start + e.num_known)
        if self.feedback:
            state.num_computed = start + e.num_new     # the last stage takes rejections off
            if self._takes_feedback and start + e.num_new - e.num_drafts >= state.num_known:
                state.unsettled_batch = self.num_batches  # it samples: its record will come
        return state, start

    def _true_start(self, e: EntryPlan, state: RequestState) -> int:
        """Feedback mode: where a running entry's tokens really start. An
        admission or resumption starts at the plan's `start` (prefix hit
        included); a running entry at this stage's count once the previous
        sampling entry's rejected drafts are taken off it (stages before the
        last wait for that entry's record; vLLM's ranks apply `num_rejected`
        from the broadcast, `PPHandler.get_prev_sampled_outputs` then
        `post_update`). The scheduler's `start` may only be ahead of it, by
        drafts it counted as accepted."""
        if e.replaces_table:
            state.num_computed, state.unsettled_batch, state.proposed_drafts = e.start, None, ()
            return e.start
        if state.unsettled_batch is not None:
            assert self.inbox is not None and state.generation is not None
            record = self.inbox.settle(state.generation, state.unsettled_batch, self.num_batches)
            state.num_computed -= record.num_rejected
            state.proposed_drafts = record.draft_token_ids
            state.unsettled_batch = None
        if state.num_computed > e.start:
            raise ValueError(f"{e.req_id}: scheduled at {e.start}, but {state.num_computed} "
                             "positions are computed already")
        self.num_behind_plan += state.num_computed < e.start
        return state.num_computed

    def _learn_tokens(self, e: EntryPlan, state: RequestState, start: int) -> None:
        """Feedback mode: the history holds known tokens only. A resumption
        brings the whole sequence; stage 0 takes the tokens of a running
        request it has not seen from the feedback, in position order; the
        last stage has them already (it sampled them); the stages between
        need none."""
        if e.all_token_ids is not None:
            state.history = list(e.all_token_ids)
        elif e.known_token_ids is not None:
            if len(state.history) < start:
                raise ValueError(f"{e.req_id}: chunk starts at {start}, "
                                 f"{len(state.history)} tokens known")
            state.history[start:start + e.num_known] = e.known_token_ids
        end = start + e.num_known
        if not self.stage.is_first and not self.stage.is_last:
            return
        if not self._takes_feedback:
            if len(state.history) < end:           # the last stage sampled them itself
                raise ValueError(f"{e.req_id}: tokens up to {end} scheduled, "
                                 f"{len(state.history)} sampled")
            return
        # Every position up to the chunk's known tokens, the accepted drafts
        # of the previous decode included (they precede `start`).
        assert self.inbox is not None and state.generation is not None
        while len(state.history) < end:
            state.history.append(self.inbox.take(state.generation, len(state.history),
                                                 self.num_batches))

    def entry_drafts(self, e: EntryPlan, state: RequestState) -> list[int]:
        """The tokens in the entry's draft slots: the snapshot's drafts, or
        with feedback the drafts the last stage proposed after the request's
        previous sampling entry (the same as the snapshot's under sync
        scheduling; under async the scheduler had not seen them yet)."""
        if not self.feedback:
            return list(e.draft_token_ids)
        drafts = draft_slots(state.proposed_drafts, e.num_drafts)
        self.num_drafts_not_in_plan += drafts != list(e.draft_token_ids)
        return drafts

    def entry_token_ids(self, e: EntryPlan, state: RequestState, start: int) -> list[int]:
        """The num_new tokens stage 0 embeds: known ones, then drafts."""
        if e.known_token_ids is not None and not self.feedback:
            return [*e.known_token_ids, *e.draft_token_ids]
        return [*state.history[start:start + e.num_known], *self.entry_drafts(e, state)]

    def reset(self) -> None:
        for state in self.requests.values():
            self._close_generation(state)
        self.requests.clear()

    # -- one batch --------------------------------------------------------------

    @torch.no_grad()
    def execute(self, plan: BatchPlan, inputs: Tensor | None) -> Tensor | BatchResult:
        """inputs: hidden states [T, D] from the previous stage (None on stage 0).
        Returns this stage's hidden states [T, D], or on the last stage the result."""
        for req_id in plan.finished_req_ids:
            self._close_generation(self.requests.pop(req_id, None))
        for req_id in plan.preempted_req_ids:
            self._close_generation(self.requests.get(req_id))
        updated = [self._update_state(e) for e in plan.entries]
        states = [s for s, _ in updated]
        starts = [start for _, start in updated]
        layout = BatchLayout([SeqSlice(start, e.num_new, s.block_table)
                              for e, s, start in zip(plan.entries, states, starts)],
                             self.block_size, self.device)
        if self.stage.is_first:
            tokens = [t for e, s, start in zip(plan.entries, states, starts)
                      for t in self.entry_token_ids(e, s, start)]
            inputs = torch.tensor(tokens, dtype=torch.long, device=self.device)        # [T]
        assert inputs is not None
        hidden = self.stage(inputs, layout.positions, PagedAttention(self.cache, layout))  # [T, D]
        self.num_batches += 1
        if not self.stage.is_last:
            return hidden
        result = self._sample(plan, states, starts, hidden)
        if self._sends_feedback and self.send_sampled is not None:
            self.send_sampled(sampled_rows(plan, states, starts, result))
        return result

    def _sample(self, plan: BatchPlan, states: list[RequestState], starts: list[int],
                hidden: Tensor) -> BatchResult:
        # Rows to project: for each entry that reaches its known tokens, the
        # positions whose next token is drawn (drafts + 1 of them).
        rows: list[int] = []
        spans: list[tuple[int, int] | None] = []
        offset = 0
        for e, s, start in zip(plan.entries, states, starts):
            if start + e.num_new - e.num_drafts >= s.num_known:
                first = offset + e.num_new - e.num_drafts - 1
                spans.append((len(rows), e.num_drafts + 1))
                rows.extend(range(first, offset + e.num_new))
            else:
                spans.append(None)                         # a partial prefill chunk
            offset += e.num_new
        logits = self.stage.logits(hidden[rows]) if rows else None                 # [N, V]
        sampled, drafts = [], []
        for e, s, start, span in zip(plan.entries, states, starts, spans):
            if span is None:
                sampled.append(())
                drafts.append(())
                continue
            lo, count = span
            positions = list(range(start + e.num_new - count + 1, start + e.num_new + 1))
            entry_logits = logits[lo:lo + count]
            if self.record is not None:
                self.record.rows.extend((e.req_id, p - 1, entry_logits[i].clone())
                                        for i, p in enumerate(positions))
            target = sample_tokens(entry_logits, positions, s.temperature, s.seed, self.top_p)
            tokens = accept_drafts(self.entry_drafts(e, s), target)
            sampled.append(tuple(tokens))
            known = s.history[:start + e.num_known]
            proposed = tuple(propose_ngram(known + tokens, plan.num_spec_tokens))
            if self.feedback:
                s.history[start + e.num_known:] = tokens       # the last stage keeps its samples
                # Its rejected drafts' positions are computed again by the next decode.
                s.num_computed -= e.num_drafts + 1 - len(tokens)
                s.proposed_drafts = proposed
            drafts.append(proposed)
        return BatchResult(plan.batch_id, tuple(e.req_id for e in plan.entries),
                           tuple(sampled), tuple(drafts))


def sampled_rows(plan: BatchPlan, states: list[RequestState], starts: list[int],
                 result: BatchResult) -> SampledTokens:
    """Every token the batch sampled, tagged (generation, position): an
    entry's tokens follow its known tokens (accepted drafts, then the bonus);
    and for every entry that sampled, its rejected drafts and the drafts
    proposed after it."""
    rows = []
    records = []
    for e, s, start, tokens, proposed in zip(plan.entries, states, starts,
                                             result.sampled_token_ids, result.draft_token_ids):
        assert s.generation is not None
        if not tokens:
            continue                                   # a partial prefill chunk
        first = start + e.num_known
        rows.extend((s.generation, first + i, t) for i, t in enumerate(tokens))
        records.append(EntryFeedback(s.generation, e.num_drafts + 1 - len(tokens), proposed))
    return SampledTokens(plan.batch_id, tuple(rows), tuple(records))
