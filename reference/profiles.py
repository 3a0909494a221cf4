"""Version profiles: where vLLM versions differ in what the scheduler and its
KV cache manager do, each difference a named constant read from that
version's source (the function named beside it). `SchedulerConfig.profile`
selects one; the policy steps read the constants, never the version string.

The spec keeps its own copy of these names and values (spec/profiles.py;
the reference shares no code with spec/). A profile models a version's
intended behaviour: its bugs stay mutants (mutant_steps.py).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PROFILE = "vllm-0.8.5"


@dataclass(frozen=True)
class Profile:
    name: str
    # `KVCacheManager.allocate_slots` (0.8.4): on an allocation that needs new
    # blocks, `ceil(num_preallocate_tokens / block_size)` more are taken
    # (capped by the free blocks and by max_model_len's blocks per request)
    # and join the request's table. 0.8.5 removed it.
    num_preallocate_tokens: int
    # `KVCacheManager.free` (0.8.4 and 0.8.5): a request's blocks join the
    # free queue's tail in reverse table order when prefix caching is on
    # (its tail is evicted first), in table order when it is off.
    release_reversed_with_caching: bool
    release_reversed_without_caching: bool
    # `BlockPool.cache_full_blocks` / `get_cached_block` (0.8.x):
    # `cached_block_hash_to_block[hash][block_id]` keeps every full block of a
    # hash; a hit is served from the first of them still cached, and evicting
    # one copy removes only that block id.
    cache_duplicate_blocks: bool
    # 0.8.5 "[V1][PP] Continue scheduling prefill chunks": a request may have
    # several batches in flight. 0.8.4: one batch per request
    # (`scheduled_req_ids`), with the engine's `get_num_unscheduled_requests`
    # gate (drive.py `VLLM_0_8_4_LOOP`).
    continue_prefill: bool

    def release_order(self, enable_prefix_caching: bool) -> str:
        """"reverse" or "forward": the order a released table joins the free queue."""
        reversed_ = (self.release_reversed_with_caching if enable_prefix_caching
                     else self.release_reversed_without_caching)
        return "reverse" if reversed_ else "forward"


PROFILES: dict[str, Profile] = {
    "vllm-0.8.5": Profile("vllm-0.8.5", num_preallocate_tokens=0,
                          release_reversed_with_caching=True,
                          release_reversed_without_caching=False,
                          cache_duplicate_blocks=True, continue_prefill=True),
    "vllm-0.8.4": Profile("vllm-0.8.4", num_preallocate_tokens=64,
                          release_reversed_with_caching=True,
                          release_reversed_without_caching=False,
                          cache_duplicate_blocks=True, continue_prefill=False),
}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known: {sorted(PROFILES)}") from None
