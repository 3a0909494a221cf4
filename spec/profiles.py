"""The version profiles: where vLLM versions differ in a way the spec can see,
each difference is a named constant of a `Profile`, documented with the vLLM
function it is read from.

A profile models a version's *intended* behaviour. Its bugs (0.8.4's counter
drift and stale completions, 0.8.5's stale token) stay mutants in
`verification/mutants/` or counterexamples; they are never part of a profile.

Abstracted away: every knob that is the same in all profiles (those are plain
`Config` fields), and everything `config.py` already abstracts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ReleaseOrder = Literal["reverse", "forward"]
Policy = Literal["continue-prefill", "one-batch-per-request"]


@dataclass(frozen=True)
class Profile:
    """One vLLM version's constants."""

    name: str
    # The scheduling policy. vLLM 0.8.1-0.8.4 `Scheduler.schedule` skips a
    # request in `scheduled_req_ids` (one batch per request, with the engine's
    # gate in `EngineCore.step_with_batch_queue`); 0.8.5 continues prefill
    # chunks of a request already in flight ("[V1][PP] Continue scheduling
    # prefill chunks").
    policy: Policy
    # `KVCacheManager.free` (0.8.4 and 0.8.5): with prefix caching on, a
    # table is released last block first (`reversed(blocks)`) so its tail is
    # evicted first; with prefix caching off, in table order.
    release_order_with_prefix_caching: ReleaseOrder
    release_order_without_prefix_caching: ReleaseOrder
    # `KVCacheManager.__init__(num_preallocate_tokens=64)` in 0.8.4: whenever
    # `allocate_slots` needs new blocks it takes
    # `max(0, cdiv(num_preallocate_tokens, block_size) - num_lookahead_tokens // block_size)`
    # more, capped by the free blocks and by `cdiv(max_model_len, block_size)`
    # blocks per request; they join the request's table. 0.8.5 removed it.
    num_preallocate_tokens: int
    # `BlockPool.cache_full_blocks` (0.8.x) stores
    # `cached_block_hash_to_block[hash][block_id]`: a second full block whose
    # hash is already cached is cached too. `BlockPool.get_cached_block`
    # serves a hit from the first copy in that dict (the oldest still cached);
    # `_maybe_evict_cached_block` removes only the evicted block's copy.
    cache_duplicate_blocks: bool

    def release_order(self, prefix_caching: bool) -> ReleaseOrder:
        return (self.release_order_with_prefix_caching if prefix_caching
                else self.release_order_without_prefix_caching)


VLLM_0_8_5 = Profile(name="vllm-0.8.5", policy="continue-prefill",
                     release_order_with_prefix_caching="reverse",
                     release_order_without_prefix_caching="forward",
                     num_preallocate_tokens=0, cache_duplicate_blocks=True)

VLLM_0_8_4 = Profile(name="vllm-0.8.4", policy="one-batch-per-request",
                     release_order_with_prefix_caching="reverse",
                     release_order_without_prefix_caching="forward",
                     num_preallocate_tokens=64, cache_duplicate_blocks=True)

DEFAULT_PROFILE = VLLM_0_8_5.name

PROFILES: dict[str, Profile] = {p.name: p for p in (VLLM_0_8_5, VLLM_0_8_4)}

# `vllm.__version__` -> the profile that models it.
VERSION_PROFILES: dict[str, str] = {"0.8.5": VLLM_0_8_5.name, "0.8.5.post1": VLLM_0_8_5.name,
                                    "0.8.4": VLLM_0_8_4.name}


def profile(name: str) -> Profile:
    """The profile called `name`; ValueError naming the known ones otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}") from None


def profile_for_version(version: str) -> Profile | None:
    """The profile of a `vllm.__version__` string (a local suffix such as
    "+cpu" ignored), or None when no profile covers that version."""
    name = VERSION_PROFILES.get(version.split("+", 1)[0])
    return None if name is None else PROFILES[name]


def num_preallocate_blocks(num_preallocate_tokens: int, block_size: int,
                           num_lookahead_tokens: int = 0) -> int:
    """0.8.4 `KVCacheManager.allocate_slots`: the extra blocks asked for on an
    allocation that needs new blocks, before the caps."""
    return max(0, -(-num_preallocate_tokens // block_size) - num_lookahead_tokens // block_size)
