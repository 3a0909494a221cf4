"""A stage's paged KV cache: for each of the stage's layers, one K and one V
pool of `num_blocks * block_size` token slots, addressed by the scheduler's
block ids (slot = block_id * block_size + offset). The cache holds no
per-request state: block tables arrive with every batch."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor


class PagedKVCache:
    def __init__(self, layer_ids: Iterable[int], num_blocks: int, block_size: int,
                 n_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu") -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        shape = (num_blocks * block_size, n_kv_heads, head_dim)                 # [S, Hkv, Dh]
        self.k = {i: torch.zeros(shape, dtype=dtype, device=device) for i in layer_ids}
        self.v = {i: torch.zeros(shape, dtype=dtype, device=device) for i in layer_ids}

    def write(self, layer_id: int, slots: Tensor, k: Tensor, v: Tensor) -> None:
        """slots: [T]; k, v: [T, Hkv, Dh]."""
        self.k[layer_id][slots] = k
        self.v[layer_id][slots] = v

    def gather(self, layer_id: int, slots: Tensor) -> tuple[Tensor, Tensor]:
        """slots: [B, C] -> K, V: [B, C, Hkv, Dh]."""
        return self.k[layer_id][slots], self.v[layer_id][slots]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k.values(), *self.v.values()))
