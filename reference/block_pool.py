"""The KV block pool by identity (vLLM's `BlockPool` and `KVCacheBlock`).

* Blocks have ids 0..num_blocks-1; none is reserved (vLLM >= 0.9 keeps a null
  block; a trace from such a writer says so with `usable_blocks`).
* The free queue is in eviction order, head first: initially 0, 1, ...
  Fresh blocks come from the head; a popped block that still caches a hash
  loses it (eviction). Freed blocks join the tail with their hash, so they can
  still be hit until evicted (LRU).
* Prefix caching by identity, duplicates kept as vLLM 0.8.x keeps them
  (`BlockPool.cache_full_blocks`, `get_cached_block`,
  `_maybe_evict_cached_block`): `cached_block_hash_to_block[hash]` maps block
  id -> block for every block caching that hash, in the order they were
  cached; a second full block with the same content is cached too; a hit is
  served from the first block still cached; evicting one copy removes only
  that block id.

The free queue is an OrderedDict: O(1) pop from the head, append at the tail
and removal from the middle (a hit on a free block), like vLLM's doubly
linked list.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

# The parent of a request's first block, so every block hash is a chain.
_ROOT_HASH = hash("flightcheck-root")


def hash_block_tokens(parent_hash: int | None, token_ids: Sequence[int], lora: int = 0) -> int:
    """Chained hash of one full block: the prefix is identified by the parent's
    hash, so equal hashes mean equal prefixes (up to hash collisions, which, as
    in vLLM's default hash, are not guarded against). A LoRA request's blocks
    carry its LoRA (vLLM's extra keys, `generate_block_hash_extra_keys`)."""
    parent = _ROOT_HASH if parent_hash is None else parent_hash
    return hash((parent, tuple(token_ids))) if not lora else hash((parent, tuple(token_ids), lora))


class KVCacheBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0                       # live block tables holding this block
        self.block_hash: int | None = None     # set while the block is cached

    def __repr__(self) -> str:
        cached = "" if self.block_hash is None else ", cached"
        return f"KVCacheBlock({self.block_id}, ref={self.ref_cnt}{cached})"


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool,
                 unhashed_blocks_to_head: bool = False) -> None:
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        # vLLM 0.33 `BlockPool.free_blocks` (profiles.py): freed blocks without
        # a hash are reused first; 0.8.x: every freed block joins the tail.
        self.unhashed_blocks_to_head = unhashed_blocks_to_head
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue: OrderedDict[int, KVCacheBlock] = OrderedDict(
            (b.block_id, b) for b in self.blocks)
        # hash -> {block id: block}, oldest first (dicts keep insertion order).
        self.cached_block_hash_to_block: dict[int, dict[int, KVCacheBlock]] = {}

    def get_num_free_blocks(self) -> int:
        return len(self.free_block_queue)

    def free_block_ids(self) -> list[int]:
        """The free queue in eviction order (head first)."""
        return list(self.free_block_queue)

    def get_cached_block(self, block_hash: int) -> KVCacheBlock | None:
        """The first block still caching `block_hash` (vLLM's `get_cached_block`
        takes the first entry of the hash's dict), or None."""
        copies = self.cached_block_hash_to_block.get(block_hash)
        return next(iter(copies.values())) if copies else None

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop `num_blocks` from the head of the free queue, evicting their hashes."""
        if num_blocks > len(self.free_block_queue):
            raise ValueError(f"cannot get {num_blocks} free blocks from the pool "
                             f"({len(self.free_block_queue)} free)")
        new_blocks = []
        for _ in range(num_blocks):
            _, block = self.free_block_queue.popitem(last=False)
            self._evict(block)
            block.ref_cnt = 1
            new_blocks.append(block)
        return new_blocks

    def _evict(self, block: KVCacheBlock) -> None:
        """Drop this block, and only this one, from its hash's copies."""
        if block.block_hash is not None:
            copies = self.cached_block_hash_to_block[block.block_hash]
            del copies[block.block_id]
            if not copies:
                del self.cached_block_hash_to_block[block.block_hash]
            block.block_hash = None

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take hold of prefix-hit blocks: a free one leaves the free queue
        wherever it is (it is no longer evictable)."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self.free_block_queue[block.block_id]
            block.ref_cnt += 1

    def cache_block(self, block: KVCacheBlock, block_hash: int) -> None:
        """Cache a full block under its hash, after any other block already
        caching it (vLLM 0.8.x `cache_full_blocks` keeps duplicates)."""
        block.block_hash = block_hash
        self.cached_block_hash_to_block.setdefault(block_hash, {})[block.block_id] = block

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Release one hold on each block; blocks nobody holds join the tail of
        the free queue in the given order (so the first is evicted first).
        Under vLLM 0.33's rule those without a hash (every one with caching
        off) go to the head instead, in the given order (the first is reused
        first: `FreeKVCacheBlockQueue.prepend_n`), the hashed ones to the tail."""
        if self.unhashed_blocks_to_head:
            self._free_blocks_unhashed_first(ordered_blocks)
            return
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_block_queue[block.block_id] = block

    def _free_blocks_unhashed_first(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        to_head: list[KVCacheBlock] = []
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None or not self.enable_caching:
                    to_head.append(block)
                else:
                    self.free_block_queue[block.block_id] = block
        # Each moved to the front, last first, so that to_head[0] heads the queue.
        for block in reversed(to_head):
            self.free_block_queue[block.block_id] = block
            self.free_block_queue.move_to_end(block.block_id, last=False)

    def evict_blocks(self, block_ids: set[int]) -> None:
        """vLLM `BlockPool.evict_blocks`: forget these blocks' hashes (a KV
        load failed into them); held blocks stay held."""
        for block_id in block_ids:
            self._evict(self.blocks[block_id])

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; only possible when no block is held."""
        if len(self.free_block_queue) != self.num_blocks:
            return False
        for block in self.blocks:
            block.block_hash = None
        self.cached_block_hash_to_block.clear()
        return True
