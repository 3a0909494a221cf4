"""Attention for a flattened batch that mixes prefill chunks and decodes.

A batch is B sequences back to back: sequence b contributes its n_b new
tokens at positions [start_b, start_b + n_b) (start_b includes a prefix-cache
hit) and attends to every position < start_b + n_b of its own context, read
from a paged KV cache through its block table. Per layer, the new K/V of the
whole batch are written into the cache first and then each sequence's
context is gathered, so a request whose prefix hit was computed by another
request in the same batch reads it already written (the scheduler caches
blocks at schedule time).

One SDPA call per layer over the context gathered into [B, C] with the mask
(k_pos <= q_pos) & (k_pos < seq_len); padded query rows attend to position 0
only (their outputs are dropped), so no row is fully masked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .kv_cache import PagedKVCache


@dataclass(frozen=True)
class SeqSlice:
    """One sequence of the flattened batch."""

    start: int                      # first new position (prefix hit included)
    num_new: int                    # new tokens, drafts included
    block_table: Sequence[int]      # the request's blocks, covering start + num_new


class BatchLayout:
    """Index tensors of one batch, built once and shared by every layer."""

    def __init__(self, seqs: Sequence[SeqSlice], block_size: int, device: torch.device | str) -> None:
        B = len(seqs)
        max_q = max(s.num_new for s in seqs)
        max_blocks = max(-(-(s.start + s.num_new) // block_size) for s in seqs)
        max_ctx = max_blocks * block_size
        positions, slots, tok_seq, tok_off = [], [], [], []
        q_index = torch.zeros(B, max_q, dtype=torch.long)
        q_pos = torch.zeros(B, max_q, dtype=torch.long)
        tables = torch.zeros(B, max_blocks, dtype=torch.long)
        seq_lens = torch.empty(B, dtype=torch.long)
        t = 0
        for b, s in enumerate(seqs):
            seq_len = s.start + s.num_new
            n_blocks = -(-seq_len // block_size)
            if len(s.block_table) < n_blocks:
                raise ValueError(f"block table of {len(s.block_table)} blocks cannot hold "
                                 f"{seq_len} tokens")
            table = list(s.block_table[:n_blocks])
            tables[b, :n_blocks] = torch.tensor(table, dtype=torch.long)
            seq_lens[b] = seq_len
            for i in range(s.num_new):
                pos = s.start + i
                positions.append(pos)
                slots.append(table[pos // block_size] * block_size + pos % block_size)
                tok_seq.append(b)
                tok_off.append(i)
            q_index[b, :s.num_new] = torch.arange(t, t + s.num_new)
            q_pos[b, :s.num_new] = torch.arange(s.start, seq_len)
            t += s.num_new
        self.num_tokens = t
        self.positions = torch.tensor(positions, dtype=torch.long, device=device)        # [T]
        self.slot_mapping = torch.tensor(slots, dtype=torch.long, device=device)         # [T]
        self.q_index = q_index.to(device)                                                # [B, Q]
        self.tok_seq = torch.tensor(tok_seq, dtype=torch.long, device=device)            # [T]
        self.tok_off = torch.tensor(tok_off, dtype=torch.long, device=device)            # [T]
        offsets = torch.arange(block_size)
        self.ctx_slots = (tables[:, :, None] * block_size + offsets).reshape(B, max_ctx).to(device)  # [B, C]
        k_pos = torch.arange(max_ctx)
        mask = (k_pos[None, None, :] <= q_pos[:, :, None]) & \
               (k_pos[None, None, :] < seq_lens[:, None, None])                          # [B, Q, C]
        self.mask = mask[:, None, :, :].to(device)                                       # [B, 1, Q, C]


class PagedAttention:
    """The `Attend` of a stage: write this batch's K/V, attend over the pages."""

    def __init__(self, cache: PagedKVCache, layout: BatchLayout) -> None:
        self.cache, self.layout = cache, layout

    def __call__(self, layer_id: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        lay = self.layout
        self.cache.write(layer_id, lay.slot_mapping, k, v)
        keys, values = self.cache.gather(layer_id, lay.ctx_slots)      # [B, C, Hkv, Dh] each
        queries = q[lay.q_index]                                       # [B, Q, H, Dh]
        out = F.scaled_dot_product_attention(
            queries.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
            attn_mask=lay.mask, enable_gqa=True)                       # [B, H, Q, Dh]
        return out.transpose(1, 2)[lay.tok_seq, lay.tok_off]           # [T, H, Dh]


class DenseCausalAttention:
    """No cache: each sequence of the flattened batch attends causally to its
    own tokens only (a full recompute from position 0)."""

    def __init__(self, seq_lens: Sequence[int]) -> None:
        self.seq_lens = list(seq_lens)

    def __call__(self, layer_id: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        outs, t = [], 0
        for n in self.seq_lens:
            qs, ks, vs = (x[t:t + n].transpose(0, 1) for x in (q, k, v))   # [h, n, Dh]
            outs.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True,
                                                       enable_gqa=True).transpose(0, 1))
            t += n
        return torch.cat(outs)                                          # [T, H, Dh]
