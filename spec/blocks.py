"""The KV block pool's operations, as pure functions on `BlockPool`.

These mirror vLLM's BlockPool/KVCacheManager closely enough that allocation
succeeds or fails here exactly when it does there:
* fresh blocks are popped from the head of the free queue, evicting any label
  the popped block still caches;
* a prefix hit walks the request's block labels and stops at the first miss;
  hit blocks with no holder are taken out of the free queue wherever they are;
* at most one block caches a label: a full block whose label another block
  already caches stays unlabelled (vLLM keeps duplicates; the lookup answer is
  the same as long as the first stays cached);
* a freed table is released in reverse order, so its tail is evicted first;
  blocks that reach reference count 0 join the tail of the free queue with
  their labels, so they can still be hit until evicted.

Abstracted away: the hash function (labels stand for chained hashes), the
null block vLLM reserves from 0.9, and preallocation of blocks ahead of need.
"""

from __future__ import annotations

from dataclasses import replace

from .state import BlockPool


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def cached_block(pool: BlockPool, label: int) -> int | None:
    """The block caching `label`, if any."""
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
    num_evictable_hit = sum(1 for b in hit if pool.ref_counts[b] == 0)
    return num_new_blocks <= len(pool.free_queue) - num_evictable_hit


def touch(pool: BlockPool, hit: tuple[int, ...]) -> BlockPool:
    """Take hold of hit blocks: out of the free queue, reference count + 1."""
    if not hit:
        return pool                   # the common case (no prefix hit): nothing to take
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
    taken = pool.free_queue[:num_blocks]
    refs, labels = list(pool.ref_counts), list(pool.labels)
    for b in taken:
        refs[b] = 1
        labels[b] = None
    return BlockPool(tuple(refs), tuple(labels), pool.free_queue[num_blocks:]), taken


def cache_labels(pool: BlockPool, table: tuple[int, ...], labels: list[int]) -> BlockPool:
    """Label the first len(labels) blocks of `table` with their content, skipping
    blocks already labelled and labels another block already caches."""
    new = list(pool.labels)
    for block, label in zip(table, labels):
        if new[block] is None and label not in new:
            new[block] = label
    return replace(pool, labels=tuple(new))


def free_table(pool: BlockPool, table: tuple[int, ...]) -> BlockPool:
    """Release a block table, last block first."""
    refs, free = list(pool.ref_counts), list(pool.free_queue)
    for b in reversed(table):
        refs[b] -= 1
        if refs[b] == 0:
            free.append(b)
    return replace(pool, ref_counts=tuple(refs), free_queue=tuple(free))
