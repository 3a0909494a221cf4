"""spec/blocks.py in Z3: the KV block pool's operations on a symbolic `SPool`.

Each function mirrors the concrete one of the same name, loop for loop, with
the loops unrolled over the layout's static bounds and guarded by the
symbolic lengths. The free queue keeps its order exactly (LRU eviction from
the head, freed blocks to the tail, hit blocks taken out wherever they are),
so allocation succeeds or fails here exactly when it does in the spec.
"""

from __future__ import annotations

from typing import Any

import z3
from flightcheck.verification.z3.encoding.state import PAD, Layout, SPool
from flightcheck.verification.z3.encoding.terms import (
    Builder,
    V,
    conj,
    count,
    disj,
    eq,
    ite,
    le,
    lt,
    neg,
    pick,
    put,
)


def cached_block(layout: Layout, pool: SPool, label: Any) -> tuple[Any, Any]:
    """(some block caches `label`, the block a hit is served from): the copy of
    rank 0 (`get_cached_block`'s first copy still cached), which is
    `labels.index` when a label is cached once."""
    found = disj(*[eq(lab, label) for lab in pool.label])
    served_copy = layout.cfg.cache_duplicate_blocks
    block = V(PAD)
    for b in range(layout.B - 1, -1, -1):
        served = conj(eq(pool.label[b], label), eq(pool.copy_rank[b], 0)) if served_copy else eq(pool.label[b], label)
        block = ite(served, V(b), block)
    return found, block


def _label_of(layout: Layout, labels: list, block: Any) -> Any:
    """labels[block], for a symbolic block (a value no label takes if out of range)."""
    return pick(labels, block, V(layout.none_label - 1))


def lookup_hit(layout: Layout, builder: Builder, pool: SPool, labels: list, num_labels: Any,
               max_blocks: Any) -> tuple[Any, list]:
    """The longest cached prefix of labels[:num_labels], at most max_blocks long:
    (its length, its blocks slot by slot, PAD past the length)."""
    going, hits = z3.BoolVal(True), []
    for t, label in enumerate(labels):
        found, block = cached_block(layout, pool, label)
        going = builder.let(f"hit{t}", conj(going, lt(t, num_labels), lt(t, max_blocks), found))
        hits.append((going, builder.let(f"hitb{t}", ite(going, block, V(PAD)))))
    return count(g for g, _ in hits), [b for _, b in hits]


def num_evictable(pool: SPool, hit: list, num_hit: Any) -> Any:
    """Hit blocks that sit in the free queue (reference count 0), with multiplicity."""
    return count(conj(lt(t, num_hit), eq(pick(pool.ref, b, V(-1)), 0)) for t, b in enumerate(hit))


def can_allocate(pool: SPool, num_new_blocks: Any, hit: list, num_hit: Any) -> Any:
    """vLLM: fail when the new blocks exceed the free ones not being hit."""
    return le(num_new_blocks, pool.free_len - num_evictable(pool, hit, num_hit))


def touch(layout: Layout, builder: Builder, pool: SPool, hit: list, num_hit: Any) -> SPool:
    """Take hold of hit blocks: out of the free queue, reference count + 1."""
    ref = [r + count(conj(lt(t, num_hit), eq(x, b)) for t, x in enumerate(hit))
           for b, r in enumerate(pool.ref)]
    # Compaction: slot j survives if it is in the queue and not hit; it moves
    # to the number of survivors before it.
    keep = [builder.let(f"keep{j}", conj(lt(j, pool.free_len),
                                     neg(disj(*[conj(lt(t, num_hit), eq(x, f)) for t, x in enumerate(hit)]))))
            for j, f in enumerate(pool.free)]
    pos = [builder.let(f"pos{j}", count(keep[:j])) for j in range(layout.B)]
    free = []
    for slot in range(layout.B):
        v = V(PAD)
        for j in range(slot, layout.B):
            v = ite(conj(keep[j], eq(pos[j], slot)), pool.free[j], v)
        free.append(v)
    return SPool(ref, list(pool.label), free, count(keep), list(pool.copy_rank))


def pop_fresh(layout: Layout, pool: SPool, num: Any, max_num: int) -> tuple[SPool, list]:
    """Pop `num` (<= max_num) blocks from the head of the free queue, evicting
    their labels: (the pool, the popped blocks slot by slot)."""
    taken = [ite(lt(t, num), pool.free[t], V(PAD)) if t < layout.B else V(PAD)
             for t in range(max_num)]
    popped = [disj(*[conj(lt(t, num), eq(pool.free[t], b)) for t in range(min(max_num, layout.B))])
              for b in range(layout.B)]
    ref = [ite(popped[b], V(1), pool.ref[b]) for b in range(layout.B)]
    label = [ite(popped[b], V(layout.none_label), pool.label[b]) for b in range(layout.B)]
    new_len = pool.free_len - num
    free = []
    for slot in range(layout.B):
        v = V(PAD)
        for d in range(min(max_num, layout.B - slot), -1, -1):
            if slot + d < layout.B:
                v = ite(eq(num, d), pool.free[slot + d], v)
        free.append(ite(lt(slot, new_len), v, V(PAD)))
    return SPool(ref, label, free, new_len, _ranks_without(layout, pool, popped)), taken


def _ranks_without(layout: Layout, pool: SPool, gone: list) -> list:
    """The copy ranks once the blocks flagged in `gone` lose their labels:
    theirs 0, and each later copy of the same label moves up one."""
    rank = [ite(gone[b], V(0), pool.copy_rank[b]) for b in range(layout.B)]
    if layout.cfg.cache_duplicate_blocks:
        rank = [ite(gone[b], V(0), pool.copy_rank[b] - count(
                    conj(gone[b2], eq(pool.label[b2], pool.label[b]), lt(pool.copy_rank[b2], pool.copy_rank[b]))
                    for b2 in range(layout.B) if b2 != b))
                for b in range(layout.B)]
    return rank


def uncache(layout: Layout, pool: SPool, gone: list) -> SPool:
    """spec.blocks.uncache (`BlockPool.evict_blocks`): the blocks flagged in
    `gone` (a Bool per block) leave the prefix cache, held or free, where they are."""
    label = [ite(gone[b], V(layout.none_label), pool.label[b]) for b in range(layout.B)]
    return SPool(list(pool.ref), label, list(pool.free), pool.free_len, _ranks_without(layout, pool, gone))


def cache_labels(layout: Layout, pool: SPool, table: list, table_len: Any, labels: list,
                 num_labels: Any) -> SPool:
    """Label the first num_labels blocks of `table` with their content, skipping
    blocks already labelled and labels another block already caches.

    The concrete loop is sequential, but when a request's content labels are
    distinct (`Layout.distinct_labels`: no prompt repeats a label) and its
    table holds no block twice (S9), no iteration can see another's write, so
    every slot is decided against the labels as they were: a flat circuit
    instead of a chain of T dependent updates."""
    if layout.cfg.cache_duplicate_blocks:
        return _cache_labels_keeping_duplicates(layout, pool, table, table_len, labels, num_labels)
    if not layout.distinct_labels:
        return _cache_labels_sequential(layout, pool, table, table_len, labels, num_labels)
    new = list(pool.label)
    for t, (block, label) in enumerate(zip(table, labels)):
        cond = conj(lt(t, table_len), lt(t, num_labels),
                    eq(pick(pool.label, block, V(layout.none_label - 1)), layout.none_label),
                    neg(disj(*[eq(x, label) for x in pool.label])))
        new = put(new, block, label, cond)
    return SPool(list(pool.ref), new, list(pool.free), pool.free_len, list(pool.copy_rank))


def _cache_labels_sequential(layout: Layout, pool: SPool, table: list, table_len: Any, labels: list,
                             num_labels: Any) -> SPool:
    new = list(pool.label)
    for t, (block, label) in enumerate(zip(table, labels)):
        cond = conj(lt(t, table_len), lt(t, num_labels),
                    eq(pick(new, block, V(layout.none_label - 1)), layout.none_label),
                    neg(disj(*[eq(x, label) for x in new])))
        new = put(new, block, label, cond)
    return SPool(list(pool.ref), new, list(pool.free), pool.free_len, list(pool.copy_rank))


def _cache_labels_keeping_duplicates(layout: Layout, pool: SPool, table: list, table_len: Any, labels: list,
                                     num_labels: Any) -> SPool:
    """cache_labels with duplicate caching (vLLM 0.8.x): every unlabelled block
    of the first num_labels slots takes its label, even one another block
    caches; its copy rank is the number of copies cached before it. Slots are
    visited in order, since a slot's rank counts the copies earlier slots made."""
    new, rank = list(pool.label), list(pool.copy_rank)
    for t, (block, label) in enumerate(zip(table, labels)):
        cond = conj(lt(t, table_len), lt(t, num_labels), eq(_label_of(layout, new, block), layout.none_label))
        rank = put(rank, block, count(eq(x, label) for x in new), cond)
        new = put(new, block, label, cond)
    return SPool(list(pool.ref), new, list(pool.free), pool.free_len, rank)


def free_table(layout: Layout, pool: SPool, table: list, table_len: Any, when: Any = True) -> SPool:
    """Release a block table in the configuration's release order (last block
    first, "reverse", or first block first, "forward"): a block whose count
    reaches 0 joins the tail of the free queue, or, under vLLM 0.33
    (`Profile.unhashed_blocks_to_head`, spec.blocks.free_table's
    `unhashed_to_head`), the head when it caches no label, in the order visited.

    Written without the loop's chain of updates, and exactly equal to it:
    slot t brings its block b to 0 when ref[b] equals the number of b's
    occurrences in slot t and the slots the loop visits before it, and then b
    goes to the tail after the blocks freed by the slots visited before t
    (or, to the head, after the unlabelled blocks freed before it; the queue
    moves up by the number of those)."""
    forward = layout.cfg.release_order == "forward"
    used = [conj(when, lt(t, table_len)) for t in range(len(table))]
    ref = [r - count(conj(used[t], eq(x, b)) for t, x in enumerate(table)) for b, r in enumerate(pool.ref)]

    def visited_by(t: int) -> range:
        """Slot t and the slots the loop visits before it."""
        return range(0, t + 1) if forward else range(t, len(table))

    zero = []
    for t, b in enumerate(table):
        seen = count(conj(used[t2], eq(table[t2], b)) for t2 in visited_by(t))
        zero.append(conj(used[t], eq(pick(pool.ref, b, V(-1)), seen)))
    if layout.cfg.rules.unhashed_blocks_to_head:
        return _free_unhashed_to_head(layout, pool, table, zero, ref, forward)
    free = list(pool.free)
    for t, b in enumerate(table):
        before = zero[:t] if forward else zero[t + 1:]
        free = put(free, pool.free_len + count(before), b, zero[t])
    return SPool(ref, list(pool.label), free, pool.free_len + count(zero), list(pool.copy_rank))


def _free_unhashed_to_head(layout: Layout, pool: SPool, table: list, zero: list, ref: list,
                           forward: bool) -> SPool:
    """free_table's queue under vLLM 0.33 (`BlockPool.free_blocks`): of the
    blocks the release brings to 0, those with no label (every one, with
    prefix caching off: nothing is labelled) go to the head in the order
    visited (`prepend_n`), the others to the tail (`append_n`). Labels are
    read before the release, which changes none."""
    if layout.cfg.prefix_caching:
        unlabelled = [eq(_label_of(layout, pool.label, b), layout.none_label) for b in table]
    else:
        unlabelled = [z3.BoolVal(True)] * len(table)
    head = [conj(z, u) for z, u in zip(zero, unlabelled)]
    tail = [conj(z, neg(u)) for z, u in zip(zero, unlabelled)]
    num_head = count(head)
    # the queue as it was, moved up by the blocks going to its head
    free = []
    for slot in range(layout.B):
        v = V(PAD)
        for d in range(min(slot, len(table)), -1, -1):
            v = ite(eq(num_head, d), pool.free[slot - d], v)
        free.append(v)
    for t, b in enumerate(table):
        visited_before = range(0, t) if forward else range(t + 1, len(table))
        free = put(free, count(head[t2] for t2 in visited_before), b, head[t])
        free = put(free, num_head + pool.free_len + count(tail[t2] for t2 in visited_before), b, tail[t])
    return SPool(ref, list(pool.label), free, pool.free_len + count(zero), list(pool.copy_rank))


def append_blocks(layout: Layout, table: list, table_len: Any, new: list, num_new: Any) -> tuple[list, Any]:
    """table + new[:num_new], PAD past the new length."""
    out = []
    for s in range(layout.T):
        v = V(PAD)
        for base in range(s, -1, -1):
            if s - base < len(new):
                v = ite(eq(table_len, base), ite(lt(s - base, num_new), new[s - base], V(PAD)), v)
        out.append(ite(lt(s, table_len), table[s], v))
    return out, table_len + num_new
