"""Sampling on the last stage, and rejection of draft tokens.

Greedy (temperature below GREEDY_BELOW, 0 included) takes the argmax, as
vLLM does below its sampling epsilon: dividing logits by a temperature
that small (1e-310, a subnormal) overflows them to inf, and the softmax of
inf is NaN. Otherwise temperature and top-p
sampling draw from a generator seeded by (request seed, position of the token
drawn): a token depends on its request and position only, not on batching,
pipeline depth or preemption, so every run of a seeded workload agrees.

Drafts are checked against the target model's own choices at their
positions: accepted while equal, then one more token (the correction, or the
bonus token after all drafts). With greedy targets this is exact; with
sampled targets it is the "sample, then compare" rule, which keeps the
target distribution.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

# Temperatures below this sample greedily (vLLM's `_SAMPLING_EPS` is the same
# 1e-5): logits of a few tens divided by it stay far inside float range.
GREEDY_BELOW = 1e-5


def sample_tokens(logits: Tensor, positions: Sequence[int], temperature: float,
                  seed: int, top_p: float = 1.0) -> list[int]:
    """logits: [N, V], one row per token to draw at `positions`."""
    if not temperature >= GREEDY_BELOW:           # NaN too: never a distribution
        return logits.argmax(dim=-1).tolist()
    probs = torch.softmax(logits.double() / temperature, dim=-1)            # [N, V]
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p                      # the first always kept
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    tokens = []
    for row, pos in zip(probs, positions):
        gen = torch.Generator().manual_seed((seed * 1_000_003 + pos) % (1 << 63))
        tokens.append(int(torch.multinomial(row.cpu(), 1, generator=gen)))
    return tokens


def accept_drafts(drafts: Sequence[int], target: Sequence[int]) -> list[int]:
    """target[i] is the model's token where drafts[i] was proposed, and
    target[len(drafts)] the one after the last draft. Returns the accepted
    drafts followed by one token from the target."""
    assert len(target) == len(drafts) + 1
    out = []
    for draft, chosen in zip(drafts, target):
        out.append(chosen)
        if draft != chosen:
            return out
    out.append(target[len(drafts)])
    return out
