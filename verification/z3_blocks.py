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

from .z3_state import PAD, Layout, SPool
from .z3_terms import Builder, conj, count, disj, eq, ite, le, lt, member, neg, pick, put


def cached_block(lay: Layout, pool: SPool, label: Any) -> tuple[Any, Any]:
    """(some block caches `label`, the first block that does): `labels.index`."""
    found = disj(*[eq(lab, label) for lab in pool.label])
    block = z3.IntVal(PAD)
    for b in range(lay.B - 1, -1, -1):
        block = ite(eq(pool.label[b], label), z3.IntVal(b), block)
    return found, block


def lookup_hit(lay: Layout, bld: Builder, pool: SPool, labels: list, num_labels: Any,
               max_blocks: Any) -> tuple[Any, list]:
    """The longest cached prefix of labels[:num_labels], at most max_blocks long:
    (its length, its blocks slot by slot, PAD past the length)."""
    going, hits = z3.BoolVal(True), []
    for t, label in enumerate(labels):
        found, block = cached_block(lay, pool, label)
        going = bld.let(f"hit{t}", conj(going, lt(t, num_labels), lt(t, max_blocks), found))
        hits.append((going, bld.let(f"hitb{t}", ite(going, block, z3.IntVal(PAD)))))
    return count(g for g, _ in hits), [b for _, b in hits]


def num_evictable(pool: SPool, hit: list, num_hit: Any) -> Any:
    """Hit blocks that sit in the free queue (reference count 0), with multiplicity."""
    return count(conj(lt(t, num_hit), eq(pick(pool.ref, b, z3.IntVal(-1)), 0)) for t, b in enumerate(hit))


def can_allocate(pool: SPool, num_new_blocks: Any, hit: list, num_hit: Any) -> Any:
    """vLLM: fail when the new blocks exceed the free ones not being hit."""
    return le(num_new_blocks, pool.free_len - num_evictable(pool, hit, num_hit))


def touch(lay: Layout, bld: Builder, pool: SPool, hit: list, num_hit: Any) -> SPool:
    """Take hold of hit blocks: out of the free queue, reference count + 1."""
    ref = [r + count(conj(lt(t, num_hit), eq(x, b)) for t, x in enumerate(hit))
           for b, r in enumerate(pool.ref)]
    # Compaction: slot j survives if it is in the queue and not hit; it moves
    # to the number of survivors before it.
    keep = [bld.let(f"keep{j}", conj(lt(j, pool.free_len),
                                     neg(disj(*[conj(lt(t, num_hit), eq(x, f)) for t, x in enumerate(hit)]))))
            for j, f in enumerate(pool.free)]
    pos = [bld.let(f"pos{j}", count(keep[:j])) for j in range(lay.B)]
    free = []
    for slot in range(lay.B):
        v = z3.IntVal(PAD)
        for j in range(slot, lay.B):
            v = ite(conj(keep[j], eq(pos[j], slot)), pool.free[j], v)
        free.append(v)
    return SPool(ref, list(pool.label), free, count(keep))


def pop_fresh(lay: Layout, pool: SPool, num: Any, max_num: int) -> tuple[SPool, list]:
    """Pop `num` (<= max_num) blocks from the head of the free queue, evicting
    their labels: (the pool, the popped blocks slot by slot)."""
    taken = [ite(lt(t, num), pool.free[t], z3.IntVal(PAD)) if t < lay.B else z3.IntVal(PAD)
             for t in range(max_num)]
    popped = [disj(*[conj(lt(t, num), eq(pool.free[t], b)) for t in range(min(max_num, lay.B))])
              for b in range(lay.B)]
    ref = [ite(popped[b], z3.IntVal(1), pool.ref[b]) for b in range(lay.B)]
    label = [ite(popped[b], z3.IntVal(lay.none_label), pool.label[b]) for b in range(lay.B)]
    new_len = pool.free_len - num
    free = []
    for slot in range(lay.B):
        v = z3.IntVal(PAD)
        for d in range(min(max_num, lay.B - slot), -1, -1):
            if slot + d < lay.B:
                v = ite(eq(num, d), pool.free[slot + d], v)
        free.append(ite(lt(slot, new_len), v, z3.IntVal(PAD)))
    return SPool(ref, label, free, new_len), taken


def cache_labels(lay: Layout, pool: SPool, table: list, table_len: Any, labels: list,
                 num_labels: Any) -> SPool:
    """Label the first num_labels blocks of `table` with their content, skipping
    blocks already labelled and labels another block already caches."""
    new = list(pool.label)
    for t, (block, label) in enumerate(zip(table, labels)):
        cond = conj(lt(t, table_len), lt(t, num_labels),
                    eq(pick(new, block, z3.IntVal(lay.none_label - 1)), lay.none_label),
                    neg(disj(*[eq(x, label) for x in new])))
        new = put(new, block, label, cond)
    return SPool(list(pool.ref), new, list(pool.free), pool.free_len)


def free_table(lay: Layout, pool: SPool, table: list, table_len: Any, when: Any = True) -> SPool:
    """Release a block table, last block first: a block whose count reaches 0
    joins the tail of the free queue."""
    ref, free, free_len = list(pool.ref), list(pool.free), pool.free_len
    for t in range(len(table) - 1, -1, -1):
        b = table[t]
        active = conj(when, lt(t, table_len))
        ref = [ite(conj(active, eq(b, k)), r - 1, r) for k, r in enumerate(ref)]
        zero = conj(active, eq(pick(ref, b, z3.IntVal(-1)), 0))
        free = put(free, free_len, b, zero)
        free_len = ite(zero, free_len + 1, free_len)
    return SPool(ref, list(pool.label), free, free_len)


def append_blocks(lay: Layout, table: list, table_len: Any, new: list, num_new: Any) -> tuple[list, Any]:
    """table + new[:num_new], PAD past the new length."""
    out = []
    for s in range(lay.T):
        v = z3.IntVal(PAD)
        for base in range(s, -1, -1):
            if s - base < len(new):
                v = ite(eq(table_len, base), ite(lt(s - base, num_new), new[s - base], z3.IntVal(PAD)), v)
        out.append(ite(lt(s, table_len), table[s], v))
    return out, table_len + num_new


def member_of_table(b: Any, table: list, table_len: Any) -> Any:
    return member(b, table, table_len)
