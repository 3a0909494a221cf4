"""The KV block pool's operations, as pure functions on `BlockPool`.

These mirror vLLM's BlockPool/KVCacheManager closely enough that allocation
succeeds or fails here exactly when it does there, with the same block ids:
* fresh blocks are popped from the head of the free queue, evicting any label
  the popped block still caches;
* a prefix hit walks the request's block labels and stops at the first miss;
  hit blocks with no holder are taken out of the free queue wherever they are;
* a full block is cached under its label even when another block already
  caches that label (`Config.cache_duplicate_blocks`, vLLM 0.8.x
  `cached_block_hash_to_block[hash][block_id]`); a hit is served from the
  copy cached first among those still cached (`get_cached_block`), and
  evicting one copy leaves the others cached. With the flag off, a label is
  cached once (a later block with it stays unlabelled);
* a freed table joins the tail of the free queue last block first or in
  table order (`Config.release_order`: vLLM 0.8.x's `KVCacheManager.free`
  reverses it only with prefix caching on, 0.33's always); under vLLM 0.33
  (`Profile.unhashed_blocks_to_head`) its unlabelled blocks join the head
  instead; blocks that reach reference count 0 keep their labels, so they
  can still be hit until evicted;
* preallocation (`Config.num_preallocate_tokens`, vLLM 0.8.4) is decided by
  `num_preallocated`: the caller pops those blocks with the ones it needs.

Abstracted away: the hash function (labels stand for chained hashes) and the
null block vLLM reserves from 0.9.

Each operation is written here on the pool's tuples. A large pool (a
trace's) is instead a version of a store updated in place (pool_store.py):
the same values, without a copy of the pool per allocation; `_in_place`
says which way an operation goes, and tests/test_pool_store.py requires
both ways to give the same pools.
"""

from __future__ import annotations

from dataclasses import replace

from . import pool_store
from .config import Config
from .pool_store import label_list, label_of, num_free, ref_count  # noqa: F401  (the spec's readers import them from here)
from .profiles import num_preallocate_blocks
from .state import BlockPool


def _in_place(pool: BlockPool) -> bool:
    """Whether `pool` is (or becomes) a version of a store (pool_store.py)."""
    return pool_store.usable(pool)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def cached_block(pool: BlockPool, label: int) -> int | None:
    """The block a hit on `label` is served from, if any: the first copy cached."""
    if pool_store.is_newest(pool):
        return pool_store.first_copy(pool, label)
    for block in pool.duplicates:
        if pool.labels[block] == label:
            return block
    try:
        return pool.labels.index(label)
    except ValueError:
        return None


def lookup_hit(pool: BlockPool, labels: list[int], max_blocks: int) -> tuple[int, ...]:
    """The longest cached prefix of `labels`, at most `max_blocks` blocks."""
    hit: list[int] = []
    for label in labels[:max_blocks]:
        block = cached_block(pool, label)
        if block is None:
            break
        hit.append(block)
    return tuple(hit)


def can_allocate(pool: BlockPool, num_new_blocks: int, hit: tuple[int, ...]) -> bool:
    """vLLM: fail when the new blocks exceed the free ones not being hit."""
    num_evictable_hit = sum(1 for b in hit if ref_count(pool, b) == 0)
    return num_new_blocks <= num_free(pool) - num_evictable_hit


def num_preallocated_under(cfg: Config, pool: BlockPool, num_fresh: int, table_len: int) -> int:
    """`num_preallocated` under `cfg`: vLLM 0.8.4's blocks ahead of need, taken
    only when new blocks are needed. No lookahead tokens: vLLM passes them only
    for EAGLE drafters, whose KV the spec does not model; the spec's drafts (as
    ngram's) are scheduled tokens."""
    if cfg.num_preallocate_tokens == 0:
        return 0
    extra = num_preallocate_blocks(cfg.num_preallocate_tokens, cfg.block_size)
    return num_preallocated(pool, num_fresh, table_len, extra, cfg.max_blocks_per_request)


def num_preallocated(pool_after_touch: BlockPool, num_new_blocks: int, table_len: int,
                     num_preallocate_blocks: int, max_blocks_per_request: int) -> int:
    """vLLM 0.8.4 `allocate_slots`: when new blocks are needed, the extra blocks
    taken with them: the preallocation, capped (together with the needed ones)
    by the free blocks and by the request's room below max_model_len.
    `table_len` counts the hit blocks already appended."""
    if num_new_blocks <= 0:
        return 0
    total = min(num_new_blocks + num_preallocate_blocks, num_free(pool_after_touch),
                max_blocks_per_request - table_len)
    return max(0, total - num_new_blocks)


def touch(pool: BlockPool, hit: tuple[int, ...]) -> BlockPool:
    """Take hold of hit blocks: out of the free queue, reference count + 1."""
    if not hit:
        return pool                   # the common case (no prefix hit): nothing to take
    if _in_place(pool) and all(label_of(pool, b) is not None for b in hit):
        return pool_store.touch(pool, hit)
    refs = list(pool.ref_counts)
    for b in hit:
        refs[b] += 1
    free = list(pool.free_queue)
    for b in set(hit):
        while b in free:              # list scans run in C: a hit costs no Python pass over the queue
            free.remove(b)
    return replace(pool, ref_counts=tuple(refs), free_queue=tuple(free))


def pop_fresh(pool: BlockPool, num_blocks: int) -> tuple[BlockPool, tuple[int, ...]]:
    """Pop `num_blocks` from the head of the free queue, evicting their labels."""
    if num_blocks == 0:
        return pool, ()                   # the common case (a decode within its last block)
    if _in_place(pool):
        return pool_store.pop_fresh(pool, num_blocks)
    taken = pool.free_queue[:num_blocks]
    refs, labels = list(pool.ref_counts), list(pool.labels)
    for b in taken:
        refs[b] = 1
        labels[b] = None
    duplicates = group_duplicates([b for b in pool.duplicates if labels[b] is not None], labels)
    return BlockPool(tuple(refs), tuple(labels), pool.free_queue[num_blocks:], duplicates), taken


def cache_labels(pool: BlockPool, table: tuple[int, ...], labels: list[int],
                 keep_duplicates: bool = True) -> BlockPool:
    """Label the first len(labels) blocks of `table` with their content, skipping
    blocks already labelled; a label another block already caches is cached
    again (a duplicate) if `keep_duplicates`, else skipped."""
    if _in_place(pool):
        return pool_store.cache_labels(pool, table, labels, keep_duplicates)
    unlabelled = [(block, label) for block, label in zip(table, labels) if pool.labels[block] is None]
    if not unlabelled:
        return pool                       # the common case: every full block already cached
    new = list(pool.labels)
    order = list(pool.duplicates)
    for block, label in unlabelled:
        if new[block] is not None:
            continue
        if label in new:
            if not keep_duplicates:
                continue
            order += [b for b, lab in enumerate(new) if lab == label and b not in order]
            order.append(block)
        new[block] = label
    return replace(pool, labels=tuple(new), duplicates=group_duplicates(order, new))


def uncache(pool: BlockPool, table: tuple[int, ...]) -> BlockPool:
    """`BlockPool.evict_blocks`: the blocks leave the prefix cache (their
    labels dropped), held or free, where they are."""
    if _in_place(pool):
        return pool_store.uncache(pool, table)
    labels = [None if b in table else label for b, label in enumerate(pool.labels)]
    duplicates = group_duplicates([b for b in pool.duplicates if labels[b] is not None], labels)
    return replace(pool, labels=tuple(labels), duplicates=duplicates)


def group_duplicates(order: list[int], labels: list[int | None]) -> tuple[int, ...]:
    """The canonical `BlockPool.duplicates` from blocks in caching order (any
    superset of the duplicated ones): caching order within a label, grouped
    by label, and only labels still cached by two blocks or more. An
    abstraction of a pool that keeps vLLM's `cached_block_hash_to_block`
    builds it from each hash's block ids in that dict's order."""
    counts: dict[int, int] = {}
    for b in order:
        counts[labels[b]] = counts.get(labels[b], 0) + 1  # type: ignore[index]
    kept = [b for b in order if counts[labels[b]] >= 2]  # type: ignore[index]
    return tuple(sorted(kept, key=lambda b: labels[b]))  # type: ignore[arg-type, return-value]


def free_table(pool: BlockPool, table: tuple[int, ...], order: str,
               unhashed_to_head: bool = False) -> BlockPool:
    """Release a block table: last block first ("reverse") or in table order
    ("forward"). The blocks it brings to reference count 0 join the tail of
    the free queue, or, with `unhashed_to_head` (vLLM 0.33
    `BlockPool.free_blocks`), those without a label join its head, in the
    order visited, and only the labelled ones its tail."""
    if _in_place(pool):
        freed = pool_store.free_table(pool, table, order, unhashed_to_head)
        if freed is not None:
            return freed
    refs = list(pool.ref_counts)
    to_head: list[int] = []
    to_tail: list[int] = []
    for b in (reversed(table) if order == "reverse" else table):
        refs[b] -= 1
        if refs[b] == 0:
            (to_head if unhashed_to_head and pool.labels[b] is None else to_tail).append(b)
    free = tuple(to_head) + pool.free_queue + tuple(to_tail)
    return replace(pool, ref_counts=tuple(refs), free_queue=free)
