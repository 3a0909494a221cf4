"""One pipeline stage's work on one batch, independent of transport.

The worker keeps, per request, what a stage must remember between batches:
its block table (from the snapshots' new block ids), the number of known
tokens (to tell a final prefill chunk from a partial one, as vLLM's model
runner does from its own state) and, on the last stage, the token history
the drafter looks up. It drops a request's state when the request's id
arrives in `finished_req_ids`.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .attention import BatchLayout, PagedAttention, SeqSlice
from .drafter import propose_ngram
from .kv_cache import PagedKVCache
from .plan import BatchPlan, BatchResult, EntryPlan
from .sampler import accept_drafts, sample_tokens
from .stages import Stage


@dataclass
class RequestState:
    block_table: list[int]
    num_known: int
    history: list[int]                  # tokens by position, scheduled drafts included
    temperature: float = 0.0
    seed: int = 0


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

    # -- per-request state ------------------------------------------------------

    def _update_state(self, e: EntryPlan) -> RequestState:
        if len(e.token_ids) != e.num_new:
            raise ValueError(f"batch entry {e.req_id}: {len(e.token_ids)} token ids for "
                             f"{e.num_new} scheduled tokens")
        known = e.start + e.num_new - e.num_drafts
        if e.prompt_token_ids is not None:                 # admission
            seed = e.seed if e.seed is not None else self.seed * 7919 + zlib.crc32(e.req_id.encode())
            state = RequestState(list(e.new_block_ids), len(e.prompt_token_ids),
                                 list(e.prompt_token_ids), e.temperature, seed)
            self.requests[e.req_id] = state
            return state
        state = self.requests.get(e.req_id)
        if state is None:
            raise ValueError(f"batch entry for {e.req_id!r}, which this stage has not seen admitted")
        if e.replaces_table:
            state.block_table = list(e.new_block_ids)
        else:
            state.block_table.extend(e.new_block_ids)
        if len(state.history) < e.start:
            raise ValueError(f"{e.req_id}: chunk starts at {e.start}, {len(state.history)} tokens known")
        # Drafts too: the accepted ones are known tokens the next chunk does not repeat.
        state.history[e.start:] = e.token_ids
        state.num_known = max(state.num_known, known)
        return state

    def reset(self) -> None:
        self.requests.clear()

    # -- one batch --------------------------------------------------------------

    @torch.no_grad()
    def execute(self, plan: BatchPlan, inputs: Tensor | None) -> Tensor | BatchResult:
        """inputs: hidden states [T, D] from the previous stage (None on stage 0).
        Returns this stage's hidden states [T, D], or on the last stage the result."""
        for req_id in plan.finished_req_ids:
            self.requests.pop(req_id, None)
        states = [self._update_state(e) for e in plan.entries]
        layout = BatchLayout([SeqSlice(e.start, e.num_new, s.block_table)
                              for e, s in zip(plan.entries, states)], self.block_size, self.device)
        if self.stage.is_first:
            tokens = [t for e in plan.entries for t in e.token_ids]
            inputs = torch.tensor(tokens, dtype=torch.long, device=self.device)        # [T]
        assert inputs is not None
        hidden = self.stage(inputs, layout.positions, PagedAttention(self.cache, layout))  # [T, D]
        if not self.stage.is_last:
            return hidden
        return self._sample(plan, states, hidden)

    def _sample(self, plan: BatchPlan, states: list[RequestState], hidden: Tensor) -> BatchResult:
        # Rows to project: for each entry that reaches its known tokens, the
        # positions whose next token is drawn (drafts + 1 of them).
        rows: list[int] = []
        spans: list[tuple[int, int] | None] = []
        offset = 0
        for e, s in zip(plan.entries, states):
            if e.start + e.num_new - e.num_drafts >= s.num_known:
                first = offset + e.num_new - e.num_drafts - 1
                spans.append((len(rows), e.num_drafts + 1))
                rows.extend(range(first, offset + e.num_new))
            else:
                spans.append(None)                         # a partial prefill chunk
            offset += e.num_new
        logits = self.stage.logits(hidden[rows]) if rows else None                 # [N, V]
        sampled, drafts = [], []
        for e, s, span in zip(plan.entries, states, spans):
            if span is None:
                sampled.append(())
                drafts.append(())
                continue
            lo, count = span
            positions = list(range(e.start + e.num_new - count + 1, e.start + e.num_new + 1))
            entry_logits = logits[lo:lo + count]
            if self.record is not None:
                self.record.rows.extend((e.req_id, p - 1, entry_logits[i].clone())
                                        for i, p in enumerate(positions))
            target = sample_tokens(entry_logits, positions, s.temperature, s.seed, self.top_p)
            tokens = accept_drafts(e.token_ids[e.num_new - e.num_drafts:], target)
            sampled.append(tuple(tokens))
            known = s.history[:e.start + e.num_new - e.num_drafts]
            drafts.append(tuple(propose_ngram(known + tokens, plan.num_spec_tokens)))
        return BatchResult(plan.batch_id, tuple(e.req_id for e in plan.entries),
                           tuple(sampled), tuple(drafts))
