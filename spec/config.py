"""The constants of the spec: the scheduler's configuration.

Abstracted away: everything about the model (layers, weights, dtypes), the
encoder budgets, LoRA, structured output, priorities, async scheduling and KV
connectors. None of them changes how many tokens are in flight for whom, which
is all this spec is about. Preallocation of blocks ahead of need
(`num_preallocate_tokens`) is fixed at 0, as in vLLM from 0.9.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    """The scheduler's knobs (vLLM's SchedulerConfig/CacheConfig names)."""

    num_stages: int = 2                      # K: pipeline stages = batch queue depth
    max_num_batched_tokens: int = 8          # token budget per batch
    max_num_seqs: int = 2                    # running requests at most
    block_size: int = 2                      # tokens per KV block
    num_blocks: int = 8                      # the pool
    max_model_len: int = 16                  # prompt + outputs at most
    long_prefill_token_threshold: int = 0    # 0 = off; else one request's chunk cap
    num_spec_tokens: int = 0                 # k: drafts proposed per step at most
    prefix_caching: bool = True
    continue_prefill: bool = True            # the PR; False = one batch per request
    # PLACEHOLDER (issue 19, helper z3prof) until the spec's profiles land: the
    # version-profile constants the Z3 encoding reads, with today's behaviour as
    # defaults. The spec's own Config (spec/profiles.py) replaces these.
    profile: str = "vllm-0.8.5"
    release_order: str = "reverse"           # "reverse" | "forward": KVCacheManager.free
    num_preallocate_tokens: int = 0          # 0.8.4: 64 (KVCacheManager.allocate_slots)
    cache_duplicate_blocks: bool = False     # vLLM 0.8.x: True (BlockPool.cache_full_blocks)

    def __post_init__(self) -> None:
        positive = ("num_stages", "max_num_batched_tokens", "max_num_seqs",
                    "block_size", "num_blocks", "max_model_len")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be >= 0")
        if self.num_spec_tokens < 0:
            raise ValueError("num_spec_tokens must be >= 0")
        if self.release_order not in ("reverse", "forward"):
            raise ValueError(f"release_order must be 'reverse' or 'forward', got {self.release_order!r}")
        if self.num_preallocate_tokens < 0:
            raise ValueError("num_preallocate_tokens must be >= 0")

    @property
    def num_preallocate_blocks(self) -> int:
        """KVCacheManager: cdiv(num_preallocate_tokens, block_size) extra blocks
        on an allocation that needs new ones (no lookahead tokens: no EAGLE)."""
        return -(-self.num_preallocate_tokens // self.block_size)
