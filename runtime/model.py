"""A Llama-architecture decoder in plain PyTorch (gpt-fast style).

The model knows nothing of caches or pipelines: a forward takes a flattened
batch of tokens (several sequences back to back), their positions, and an
`attend` callable that does the attention over whatever context the caller
keeps (a paged KV cache, or just the tokens themselves for a dense forward).
Splitting the layers into pipeline stages is `stages.split_into_stages`.

Shapes: T tokens in the flattened batch, D = dim, H heads, Hkv KV heads,
Dh head dim, V vocabulary.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig


class Attend(Protocol):
    """Attention over the caller's context for one layer.

    q: [T, H, Dh], k/v: [T, Hkv, Dh] (RoPE applied) -> [T, H, Dh]."""

    def __call__(self, layer_id: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor: ...


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:                          # x: [T, D]
        xf = x if x.dtype == torch.float64 else x.float()            # statistics in >= fp32
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


class Rotary(nn.Module):
    """Rotary embeddings, the rotate-half convention of Hugging Face Llama (so
    its q/k projection weights load unpermuted)."""

    def __init__(self, head_dim: int, max_positions: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)                  # [P, Dh]
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:       # x: [T, h, Dh]
        cos = self.cos[positions].to(x.dtype)[:, None, :]             # [T, 1, Dh]
        sin = self.sin[positions].to(x.dtype)[:, None, :]
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x: Tensor, positions: Tensor, rotary: Rotary, attend: Attend) -> Tensor:
        T = x.shape[0]                                                # x: [T, D]
        q = rotary(self.wq(x).view(T, self.n_heads, self.head_dim), positions)      # [T, H, Dh]
        k = rotary(self.wk(x).view(T, self.n_kv_heads, self.head_dim), positions)   # [T, Hkv, Dh]
        v = self.wv(x).view(T, self.n_kv_heads, self.head_dim)                      # [T, Hkv, Dh]
        out = attend(self.layer_id, q, k, v)                                        # [T, H, Dh]
        return self.wo(out.reshape(T, self.n_heads * self.head_dim))                # [T, D]


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.intermediate_size, bias=False)   # gate
        self.w3 = nn.Linear(cfg.dim, cfg.intermediate_size, bias=False)   # up
        self.w2 = nn.Linear(cfg.intermediate_size, cfg.dim, bias=False)   # down

    def forward(self, x: Tensor) -> Tensor:                          # [T, D] -> [T, D]
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg, layer_id)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: Tensor, positions: Tensor, rotary: Rotary, attend: Attend) -> Tensor:
        h = x + self.attention(self.attention_norm(x), positions, rotary, attend)   # [T, D]
        return h + self.feed_forward(self.ffn_norm(h))                              # [T, D]


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(TransformerBlock(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.rotary = Rotary(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta)

    def forward(self, tokens: Tensor, positions: Tensor, attend: Attend) -> Tensor:
        x = self.tok_embeddings(tokens)                              # [T] -> [T, D]
        for layer in self.layers:
            x = layer(x, positions, self.rotary, attend)             # [T, D]
        return self.output(self.norm(x))                             # [T, V]
