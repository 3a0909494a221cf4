"""Dense references without a KV cache: the oracle the paged runtime is
tested against (full recompute of the whole sequence at every step)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .attention import DenseCausalAttention
from .model import Transformer


@torch.no_grad()
def dense_logits(model: Transformer, tokens: Sequence[int]) -> Tensor:
    """[L] tokens -> [L, V] logits, position 0 onwards."""
    device = model.tok_embeddings.weight.device
    ids = torch.tensor(list(tokens), dtype=torch.long, device=device)
    positions = torch.arange(len(tokens), device=device)
    return model(ids, positions, DenseCausalAttention([len(tokens)]))


@torch.no_grad()
def dense_greedy(model: Transformer, prompt: Sequence[int], max_tokens: int,
                 eos_token_id: int | None = None, max_model_len: int | None = None) -> list[int]:
    """Greedy generation by full recompute; stops as the scheduler does
    (max_tokens, then EOS, then max_model_len)."""
    tokens = list(prompt)
    out: list[int] = []
    while len(out) < max_tokens:
        token = int(dense_logits(model, tokens)[-1].argmax())
        tokens.append(token)
        out.append(token)
        if token == eos_token_id or (max_model_len is not None and len(tokens) >= max_model_len):
            break
    return out
