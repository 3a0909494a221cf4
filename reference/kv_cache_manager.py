"""Per-request KV block tables on top of the block pool (vLLM's KVCacheManager).

The rules the spec checks step for step:
* `get_computed_blocks`: the longest run of cached blocks matching the
  request's full-block hashes from the start, at most (num_tokens - 1) //
  block_size blocks: the last known token is always recomputed, so that the
  batch samples (a full hit drops its last block).
* `allocate_slots`: room for num_computed (+ hit) + num_new tokens, all or
  nothing; it fails when the fresh blocks needed exceed the free blocks that
  are not themselves being hit. No preallocation (num_preallocate_tokens = 0).
  On success every full block of known, scheduled tokens that has no hash yet
  is cached (one block per hash), at schedule time, before its KV exists: a
  later batch that hits it runs after this one at every pipeline stage.
* `free`: the table is released last block first, so its tail is evicted first.
"""

from __future__ import annotations

from collections.abc import Sequence

from .block_pool import BlockPool, KVCacheBlock, hash_block_tokens
from .config import cdiv
from .request import Request


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # Leading table blocks already offered to the cache, per request.
        self.num_cached_block: dict[str, int] = {}
        # Indices of full blocks left uncached because another block cached
        # their hash; offered again on every allocation, in case that block
        # has been evicted meanwhile.
        self.req_to_uncached_blocks: dict[str, list[int]] = {}

    # -- queries ------------------------------------------------------------

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, ())]

    def get_num_free_blocks(self) -> int:
        return self.block_pool.get_num_free_blocks()

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The prefix-cache hit: (blocks, number of tokens they hold)."""
        if not self.enable_caching:
            return [], 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        hashes = self._block_hashes(request, max_blocks)
        pool = self.block_pool
        hits: list[KVCacheBlock] = []
        for i in range(max_blocks):
            block = pool.get_cached_block(hashes[i])
            if block is None:
                break           # a prefix: stop at the first miss
            hits.append(block)
        return hits, len(hits) * self.block_size

    # -- changes ------------------------------------------------------------

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: Sequence[KVCacheBlock] = (),
                       num_draft_tokens: int = 0) -> list[KVCacheBlock] | None:
        """Blocks for `num_new_tokens` more tokens after the request's computed
        ones and the hit `new_computed_blocks`. Returns the blocks appended to
        its table (hit blocks first), or None, changing nothing, if they do not fit."""
        pool = self.block_pool
        req_blocks = self.req_to_blocks.get(request.request_id, ())
        num_computed_tokens = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        num_required = cdiv(num_computed_tokens + num_new_tokens, self.block_size)
        num_new_blocks = max(0, num_required - len(req_blocks) - len(new_computed_blocks))
        # Hit blocks that nobody holds sit in the free queue: taking them
        # removes them from it, so they cannot also serve as fresh blocks.
        num_evictable_hits = sum(1 for b in new_computed_blocks if b.ref_cnt == 0) \
            if new_computed_blocks else 0
        if num_new_blocks > pool.get_num_free_blocks() - num_evictable_hits:
            return None

        if not isinstance(req_blocks, list):
            req_blocks = self.req_to_blocks[request.request_id] = []
        if new_computed_blocks:
            pool.touch(new_computed_blocks)
            req_blocks.extend(new_computed_blocks)
        new_blocks = pool.get_new_blocks(num_new_blocks) if num_new_blocks else []
        if new_blocks:
            req_blocks.extend(new_blocks)
        if self.enable_caching:
            # Drafts may be rejected: only known tokens are cached.
            num_known = min(num_computed_tokens + num_new_tokens - num_draft_tokens,
                            request.num_tokens)
            self._cache_full_blocks(request, req_blocks, num_known // self.block_size)
        if new_computed_blocks:
            return [*new_computed_blocks, *new_blocks]
        return new_blocks

    def free(self, request: Request) -> None:
        """Release the request's table, last block first."""
        req_id = request.request_id
        blocks = self.req_to_blocks.pop(req_id, None)
        if blocks:
            self.block_pool.free_blocks(reversed(blocks))
        self.num_cached_block.pop(req_id, None)
        self.req_to_uncached_blocks.pop(req_id, None)

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    # -- helpers ------------------------------------------------------------

    def _block_hashes(self, request: Request, num_blocks: int) -> list[int]:
        """The request's chained block hashes, computed up to `num_blocks` full blocks."""
        hashes = request.block_hashes
        bs = self.block_size
        tokens = request.all_token_ids
        while len(hashes) < num_blocks:
            i = len(hashes)
            hashes.append(hash_block_tokens(hashes[i - 1] if i else None,
                                            tokens[i * bs:(i + 1) * bs]))
        return hashes

    def _cache_full_blocks(self, request: Request, req_blocks: list[KVCacheBlock],
                           num_full_blocks: int) -> None:
        """Cache every one of the first `num_full_blocks` table blocks that has
        no hash yet, in table order, one block per hash."""
        req_id = request.request_id
        pool = self.block_pool
        start = self.num_cached_block.get(req_id, 0)
        retry = self.req_to_uncached_blocks.get(req_id)
        if not retry and num_full_blocks <= start:
            return                                    # the common decode step
        hashes = self._block_hashes(request, num_full_blocks)
        still_uncached = []
        for i in retry or ():
            # A block past this allocation's known tokens is not offered now.
            if i >= num_full_blocks or not pool.cache_block(req_blocks[i], hashes[i]):
                still_uncached.append(i)
        for i in range(start, num_full_blocks):
            block = req_blocks[i]
            if block.block_hash is None and not pool.cache_block(block, hashes[i]):
                still_uncached.append(i)
        self.num_cached_block[req_id] = max(start, num_full_blocks)
        if still_uncached:
            self.req_to_uncached_blocks[req_id] = still_uncached
        else:
            self.req_to_uncached_blocks.pop(req_id, None)
