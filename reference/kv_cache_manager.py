"""Per-request KV block tables on top of the block pool (vLLM's KVCacheManager).

The rules the spec checks step for step:
* `get_computed_blocks`: the longest run of cached blocks matching the
  request's full-block hashes from the start, at most (num_tokens - 1) //
  block_size blocks: the last known token is always recomputed, so that the
  batch samples (a full hit drops its last block).
* `allocate_slots`: room for num_computed (+ hit) + num_new tokens, all or
  nothing; it fails when the fresh blocks needed exceed the free blocks that
  are not themselves being hit. When it needs fresh blocks it also
  preallocates the profile's `num_preallocate_tokens` worth (vLLM 0.8.4
  `allocate_slots`: `ceil(num_preallocate_tokens / block_size)` more, capped
  by the free blocks left after the hit and by max_model_len's blocks per
  request); they join the table. On success every full block of known,
  scheduled tokens not yet cached is cached (duplicates too, as vLLM 0.8.x
  does), at schedule time, before its KV exists: a later batch that hits it
  runs after this one at every pipeline stage.
* `free`: the table joins the free queue in the profile's release order
  (vLLM `KVCacheManager.free`: last block first with prefix caching, so its
  tail is evicted first; first block first without).
"""

from __future__ import annotations

from collections.abc import Sequence

from .block_pool import BlockPool, KVCacheBlock, hash_block_tokens
from .config import cdiv
from .request import Request


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool, *,
                 release_order: str | None = None, num_preallocate_tokens: int = 0,
                 max_model_len: int | None = None,
                 unhashed_blocks_to_head: bool = False, caches_through_a_negative_count: bool = False) -> None:
        """`release_order` None: vLLM's (reverse with caching, forward without).
        `caches_through_a_negative_count`: the released 0.8.x profiles' slice
        (reference/profiles.py; `_cache_through_a_negative_count`)."""
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.max_model_len = max_model_len
        if release_order is None:
            release_order = "reverse" if enable_caching else "forward"
        if release_order not in ("reverse", "forward"):
            raise ValueError(f"release_order must be 'reverse' or 'forward', got {release_order!r}")
        self.release_reversed = release_order == "reverse"
        self.num_preallocate_blocks = cdiv(num_preallocate_tokens, block_size)
        # A table never grows past max_model_len's blocks (caps preallocation).
        self.max_num_blocks_per_req = (num_blocks if max_model_len is None
                                       else cdiv(max_model_len, block_size))
        self.block_pool = BlockPool(num_blocks, enable_caching, unhashed_blocks_to_head)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # Leading table blocks already cached, per request.
        self.num_cached_block: dict[str, int] = {}
        self.caches_through_a_negative_count = caches_through_a_negative_count

    # -- queries ------------------------------------------------------------

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, ())]

    def get_num_free_blocks(self) -> int:
        return self.block_pool.get_num_free_blocks()

    @property
    def usage(self) -> float:
        """vLLM `KVCacheManager.usage` (`BlockPool.get_usage`): `1.0 - free /
        total`, total the pool less vLLM's null block (this pool has none)."""
        return 1.0 - (self.block_pool.get_num_free_blocks() / self.block_pool.num_blocks)

    def get_num_cached_tokens(self, request: Request) -> int:
        """vLLM 0.34 `KVCacheManager.get_num_cached_tokens`: the tokens of the
        request's prefix-cache hit, probed without taking its blocks."""
        return self.get_computed_blocks(request)[1]

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The prefix-cache hit: (blocks, number of tokens they hold); none
        for a request that asks for prompt logprobs (vLLM 0.33/0.34
        `prefix_cache_lookup_enabled`: the cache holds no prompt logits)."""
        if not self.enable_caching or request.prompt_logprobs:
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
                       num_draft_tokens: int = 0, *, reserved_blocks: int = 0,
                       delay_cache_blocks: bool = False, num_lookahead_tokens: int = 0) -> list[KVCacheBlock] | None:
        """Blocks for `num_new_tokens` more tokens after the request's computed
        ones and the hit `new_computed_blocks`. Returns the blocks appended to
        its table (hit blocks first), or None, changing nothing, if they do not fit.
        A connector's async load (vLLM 0.33 `allocate_slots`) leaves
        `reserved_blocks` free and caches nothing (`delay_cache_blocks`). A
        drafter's `num_lookahead_tokens` slots are reserved past the tokens,
        up to max_model_len (0.34 `allocate_slots`' `num_tokens_need_slot`)."""
        pool = self.block_pool
        req_blocks = self.req_to_blocks.get(request.request_id, ())
        num_computed_tokens = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        num_slots = num_computed_tokens + num_new_tokens
        if num_lookahead_tokens:
            num_slots += num_lookahead_tokens
            if self.max_model_len is not None and num_slots > self.max_model_len:
                num_slots = self.max_model_len
        num_required = -(-num_slots // self.block_size)  # cdiv, inline
        # (Negative when the table holds more than needed. Comparisons here,
        # not min()/max(): those parse their arguments slowly on CPython 3.11.)
        num_new_blocks = num_required - len(req_blocks) - len(new_computed_blocks)
        new_blocks: list[KVCacheBlock] = []
        if num_new_blocks > 0 or new_computed_blocks:    # most decode steps need neither
            # Hit blocks that nobody holds sit in the free queue: taking them
            # removes them from it, so they cannot also serve as fresh blocks.
            num_evictable_hits = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
            if num_new_blocks > pool.get_num_free_blocks() - num_evictable_hits - reserved_blocks:
                return None
            if not isinstance(req_blocks, list):
                req_blocks = self.req_to_blocks[request.request_id] = []
            if new_computed_blocks:
                pool.touch(new_computed_blocks)
                req_blocks.extend(new_computed_blocks)
            if num_new_blocks > 0:
                num_new_blocks = self._with_preallocation(num_new_blocks, len(req_blocks))
                new_blocks = pool.get_new_blocks(num_new_blocks)
                req_blocks.extend(new_blocks)
        if self.enable_caching and not delay_cache_blocks:
            # Drafts may be rejected: only known tokens are cached.
            num_known = num_computed_tokens + num_new_tokens - num_draft_tokens
            if num_known > len(request.all_token_ids):
                num_known = len(request.all_token_ids)
            self._cache_full_blocks(request, req_blocks, num_known // self.block_size)
        if new_computed_blocks:
            return [*new_computed_blocks, *new_blocks]
        return new_blocks

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Cache the request's full blocks up to `num_computed_tokens` (capped
        at its known tokens, not at its table): vLLM 0.33/0.34
        `KVCacheManager.cache_blocks`, which `update_from_output` calls for
        the settled tokens under async scheduling or with drafts. A count
        past the table happens only to a request whose `num_in_flight_tokens`
        an older request's batch drove below 0 (a reused id, the released
        profiles' `outputs_by_id_alone`); `_cache_full_blocks` then counts
        blocks the table does not hold yet as cached, as vLLM does."""
        req_blocks = self.req_to_blocks.get(request.request_id)
        if not self.enable_caching or not req_blocks:
            return
        num_tokens = min(num_computed_tokens, len(request.all_token_ids))
        self._cache_full_blocks(request, req_blocks, num_tokens // self.block_size)

    def fits_whole_sequence(self, request: Request, new_computed_blocks: Sequence[KVCacheBlock],
                            max_model_len: int) -> bool:
        """vLLM 0.33 `KVCacheManager.allocate_slots(full_sequence_must_fit=True)`
        (`scheduler_reserve_full_isl`, on by default): blocks for the request's
        whole current sequence, `min(num_tokens, max_model_len)` tokens, less
        the hit, fit among the free blocks that are not themselves being hit.
        Asked of a waiting or preempted request, whose table is empty."""
        whole = -(-min(request.num_tokens, max_model_len) // self.block_size)
        needed = whole - len(self.req_to_blocks.get(request.request_id, ())) - len(new_computed_blocks)
        num_evictable_hits = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        return max(0, needed) <= self.block_pool.get_num_free_blocks() - num_evictable_hits

    def _with_preallocation(self, num_new_blocks: int, num_table_blocks: int) -> int:
        """vLLM 0.8.4 `allocate_slots`: an allocation that needs fresh blocks
        takes the preallocation too, capped by the free blocks (after the hit
        was taken out of the free queue) and by the blocks one request may
        hold. The fit check before it counted only the blocks needed."""
        if not self.num_preallocate_blocks:
            return num_new_blocks
        return min(num_new_blocks + self.num_preallocate_blocks,
                   self.block_pool.get_num_free_blocks(),
                   self.max_num_blocks_per_req - num_table_blocks)

    def free(self, request: Request) -> None:
        """Release the request's table in the release order."""
        req_id = request.request_id
        blocks = self.req_to_blocks.pop(req_id, None)
        if blocks:
            self.block_pool.free_blocks(reversed(blocks) if self.release_reversed else blocks)
        self.num_cached_block.pop(req_id, None)

    def pop_blocks(self, request: Request) -> list[KVCacheBlock]:
        """vLLM `pop_blocks_for_free`: the request's table, in table order,
        taken from it without freeing (the step fence frees it later)."""
        self.num_cached_block.pop(request.request_id, None)
        return self.req_to_blocks.pop(request.request_id, [])

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
                                            tokens[i * bs:(i + 1) * bs], request.lora_int_id))
        return hashes

    def _cache_full_blocks(self, request: Request, req_blocks: list[KVCacheBlock],
                           num_full_blocks: int) -> None:
        """Cache table blocks from the first not yet cached up to `num_full_blocks`,
        in table order (vLLM `BlockPool.cache_full_blocks`; a hit block is
        cached already, so it is skipped). The count becomes `num_full_blocks`
        even where the table is shorter: vLLM 0.33/0.34
        `SingleTypeKVCacheManager.cache_blocks` records it whatever
        `cache_full_blocks`'s slice of the table held, so the blocks appended
        later at those positions are never hashed and, freed, go to the free
        queue's head (`BlockPool.free_blocks`; seed 302 index 134)."""
        req_id = request.request_id
        start = self.num_cached_block.get(req_id, 0)
        if self.caches_through_a_negative_count and (num_full_blocks < 0 or start < 0) \
                and num_full_blocks != start:
            self._cache_through_a_negative_count(request, req_blocks, start, num_full_blocks)
            return
        if num_full_blocks <= start:
            return                                    # the common decode step
        hashes = self._block_hashes(request, num_full_blocks)
        num_held = len(req_blocks)
        for i in range(start, num_full_blocks if num_full_blocks < num_held else num_held):
            block = req_blocks[i]
            if block.block_hash is None:
                self.block_pool.cache_block(block, hashes[i])
        self.num_cached_block[req_id] = num_full_blocks

    def _cache_through_a_negative_count(self, request: Request, req_blocks: list[KVCacheBlock],
                                        start: int, num_full_blocks: int) -> None:
        """vLLM 0.8.4/0.8.5 `KVCacheManager.allocate_slots` with a negative
        count (`num_computed_tokens + num_tokens - len(request.spec_token_ids)`
        floor-divided: a request resumed holding more drafts than it is given
        tokens), or after one was recorded: `BlockPool.cache_full_blocks`
        caches `blocks[num_cached_blocks:num_full_blocks]` with Python's
        negative indices, so -1 caches every block but the table's last, and
        the count is recorded as given. Each block takes its position's hash;
        only blocks whose tokens are all known (past them vLLM's own
        `len(block_tokens) == block_size` assertion fails). Not modelled: after
        a recorded negative count vLLM takes the hashes from the end of the
        request's hash list (`block_hashes[num_cached_blocks:]`)."""
        num_known_blocks = len(request.all_token_ids) // self.block_size
        positions = range(len(req_blocks))[start:num_full_blocks]
        hashes = self._block_hashes(request, min(num_known_blocks, positions.stop))
        for i in positions:
            if i >= num_known_blocks:
                break
            block = req_blocks[i]
            if block.block_hash is None:
                self.block_pool.cache_block(block, hashes[i])
        self.num_cached_block[request.request_id] = num_full_blocks
