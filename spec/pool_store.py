"""A representation of large `BlockPool`s: the same values, updated in place.

Abstracted away: nothing. A `BlockPool` is a value (four tuples: reference
counts, labels, free queue, duplicates), and blocks.py's operations are
functions from pools to pools. Written with tuples, every allocation copies
the whole pool, which is what a trace's pools (10^5-10^6 blocks) cannot
afford. Here a large pool is a version of a `PoolStore`: mutable arrays
that hold the newest version's contents (with a label -> copies index and a
free queue that pops, appends and removes without scanning). An operation
on the newest version changes the store in place and gives the old version
an undo record; any older version is still the same value, rebuilt from
the newest one and the undo records when something reads its tuples
(`materialize`). An operation on an older version rebuilds it and starts a
new store. blocks.py uses a store only for pools of at least
`STORE_MIN_BLOCKS` blocks (the explicit-state search's pools are tiny and
stay tuples); tests/test_pool_store.py runs the two representations side by
side on random operations and requires the same pools.

The free queue is kept by tickets: each queued block has an integer whose
order is the queue's order (a block freed to the head gets a ticket below
every other, one freed to the tail above), except the blocks never popped
yet at the queue's tail end of a fresh pool, an ascending run
`fresh_next .. n-1` whose tickets are their ids (the head's tickets are
negative, the tail's from n up). A heap of (ticket, block), cleaned lazily,
finds the head.
"""

from __future__ import annotations

import heapq
from typing import Any

# a spec.state.BlockPool (state.py imports this module to rebuild a version's tuples)
BlockPool = Any

# Pools with fewer blocks stay plain tuples (tests lower it to 0).
STORE_MIN_BLOCKS = 1024

REF, LABEL, COPIES, TICKET, FRESH = range(5)


class PoolStore:
    """The newest version's contents of a pool, and which pool that is."""

    __slots__ = ("n", "refs", "labels", "copies", "ticket", "heap", "fresh_next", "next_head",
                 "next_tail", "current")

    def __init__(self, pool: BlockPool) -> None:
        n = self.n = len(pool.ref_counts)
        self.refs: list[int] = list(pool.ref_counts)
        self.labels: list[int | None] = list(pool.labels)
        self.copies: dict[int, list[int]] = {}
        for b in pool.duplicates:                  # caching order, within each label
            self.copies.setdefault(pool.labels[b], []).append(b)  # type: ignore[arg-type]
        for b, label in enumerate(pool.labels):
            if label is not None and label not in self.copies:
                self.copies[label] = [b]
        free = pool.free_queue
        run = len(free)                            # the fresh run: an unlabelled ascending tail ending at n-1
        while run > 0 and free[run - 1] == n - (len(free) - run) - 1 and pool.labels[free[run - 1]] is None:
            run -= 1
        self.fresh_next = n - (len(free) - run)
        self.ticket: dict[int, int] = {b: i - run for i, b in enumerate(free[:run])}
        self.heap = [(t, b) for b, t in self.ticket.items()]
        heapq.heapify(self.heap)
        self.next_head, self.next_tail = -run - 1, n
        self.current: BlockPool | None = None


def usable(pool: BlockPool) -> bool:
    """Whether this pool can be (or is) a store's version: large enough, and
    of the form a store keeps (a free queue without repeats, `duplicates`
    listing every copy of each label cached twice or more, grouped by label,
    no block twice); a pool not of that form stays tuples, as written."""
    if "_store" in pool.__dict__:
        return True
    if len(pool.ref_counts) < STORE_MIN_BLOCKS:
        return False
    free, labels, duplicates = pool.free_queue, pool.labels, pool.duplicates
    if len(set(free)) != len(free) or len(set(duplicates)) != len(duplicates):
        return False
    counts: dict[int, int] = {}
    for label in labels:
        if label is not None:
            counts[label] = counts.get(label, 0) + 1
    listed = [labels[b] for b in duplicates]
    return (None not in listed and listed == sorted(listed)  # type: ignore[type-var]
            and sum(1 for c in counts.values() if c > 1 for _ in range(c)) == len(duplicates)
            and all(counts[label] > 1 for label in listed))  # type: ignore[index]


def store_of(pool: BlockPool) -> PoolStore:
    """The store whose newest version `pool` is: its own, or a new one."""
    store = pool.__dict__.get("_store")
    if store is not None and store.current is pool:
        return store
    store = PoolStore(pool)
    store.current = pool
    return store


def new_version(store: PoolStore, old: BlockPool, undo: list[tuple]) -> BlockPool:
    """After an in-place change: the new pool, newest of `store`; `old` keeps
    how to get back to itself."""
    pool = object.__new__(type(old))
    object.__setattr__(pool, "_store", store)
    object.__setattr__(old, "_undo", undo)
    object.__setattr__(old, "_next", pool)
    store.current = pool
    return pool


def is_newest(pool: BlockPool) -> bool:
    store = pool.__dict__.get("_store")
    return store is not None and store.current is pool


# -- reading --------------------------------------------------------------------


def ref_count(pool: BlockPool, b: int) -> int:
    return pool.__dict__["_store"].refs[b] if is_newest(pool) else pool.ref_counts[b]


def label_of(pool: BlockPool, b: int) -> int | None:
    return pool.__dict__["_store"].labels[b] if is_newest(pool) else pool.labels[b]


def label_list(pool: BlockPool) -> Any:
    """The pool's labels, indexable by block, for reads before the pool next
    changes (the newest version's list, else the tuple)."""
    return pool.__dict__["_store"].labels if is_newest(pool) else pool.labels


def num_free(pool: BlockPool) -> int:
    if is_newest(pool):
        store = pool.__dict__["_store"]
        return len(store.ticket) + store.n - store.fresh_next
    return len(pool.free_queue)


def is_free(store: PoolStore, b: int) -> bool:
    return b in store.ticket or store.fresh_next <= b < store.n


def changes_since(before: BlockPool, after: BlockPool) -> dict[int, dict[Any, Any]] | None:
    """For `after` the newest version of a store reached from `before` by
    in-place changes: each kind's changed keys (blocks, labels) with their
    value in `before`; None when `after` is not reached that way."""
    if not is_newest(after):
        return None
    found: dict[int, dict[Any, Any]] = {REF: {}, LABEL: {}, COPIES: {}, TICKET: {}, FRESH: {}}
    version = before
    while version is not after:
        if "_next" not in version.__dict__:
            return None
        for kind, key, value in version.__dict__["_undo"]:
            found[kind].setdefault(key, value)
        version = version.__dict__["_next"]
    return found


def materialize(pool: BlockPool) -> None:
    """Give a version its four tuples (from the newest version and the undo
    records between)."""
    chain = []
    version = pool
    while "_next" in version.__dict__:
        chain.append(version)
        version = version.__dict__["_next"]
    store: PoolStore = version.__dict__["_store"]
    refs, labels = list(store.refs), list(store.labels)
    copies = {label: tuple(bs) for label, bs in store.copies.items() if len(bs) > 1}
    ticket, fresh_next = dict(store.ticket), store.fresh_next
    for older in reversed(chain):
        for kind, key, value in reversed(older.__dict__["_undo"]):
            if kind == REF:
                refs[key] = value
            elif kind == LABEL:
                labels[key] = value
            elif kind == COPIES:
                copies[key] = value
            elif kind == TICKET:
                if value is None:
                    ticket.pop(key, None)
                else:
                    ticket[key] = value
            else:
                fresh_next = value
    queued = sorted(ticket, key=ticket.__getitem__)
    head = [b for b in queued if ticket[b] < 0]
    free = tuple(head) + tuple(range(fresh_next, store.n)) + tuple(queued[len(head):])
    duplicates = tuple(b for label in sorted(k for k, v in copies.items() if len(v) > 1) for b in copies[label])
    for name, value in (("ref_counts", tuple(refs)), ("labels", tuple(labels)), ("free_queue", free),
                        ("duplicates", duplicates)):
        object.__setattr__(pool, name, value)


# -- the operations, in place (blocks.py: the same functions on tuples) ----------


def touch(pool: BlockPool, hit: tuple[int, ...]) -> BlockPool:
    store = store_of(pool)
    refs, ticket, undo = store.refs, store.ticket, []
    for b in hit:
        undo.append((REF, b, refs[b]))
        refs[b] += 1
    for b in set(hit):
        t = ticket.pop(b, None)
        if t is not None:
            undo.append((TICKET, b, t))
        # (a block of the fresh run is unlabelled: never hit)
    return new_version(store, pool, undo)


def _pop_head(store: PoolStore, undo: list[tuple]) -> int | None:
    heap, ticket = store.heap, store.ticket
    while heap and ticket.get(heap[0][1]) != heap[0][0]:
        heapq.heappop(heap)                       # an entry of a block since taken
    if store.fresh_next < store.n and not (heap and heap[0][0] < 0):
        undo.append((FRESH, None, store.fresh_next))
        store.fresh_next += 1
        return store.fresh_next - 1
    if not heap:
        return None
    t, b = heapq.heappop(heap)
    del ticket[b]
    undo.append((TICKET, b, t))
    return b


def pop_fresh(pool: BlockPool, num_blocks: int) -> tuple[BlockPool, tuple[int, ...]]:
    store = store_of(pool)
    undo: list[tuple] = []
    taken = []
    for _ in range(num_blocks):
        b = _pop_head(store, undo)
        if b is None:
            break
        taken.append(b)
    refs = store.refs
    for b in taken:
        undo.append((REF, b, refs[b]))
        refs[b] = 1
        _forget_label(store, b, undo)             # evicted, if it was cached
    return new_version(store, pool, undo), tuple(taken)


def cache_labels(pool: BlockPool, table: tuple[int, ...], labels: list[int],
                 keep_duplicates: bool) -> BlockPool:
    store = store_of(pool)
    cached, copies, undo = store.labels, store.copies, []
    for block, label in zip(table, labels):
        if cached[block] is not None:
            continue
        existing = copies.get(label)
        if existing:
            if not keep_duplicates:
                continue
            undo.append((COPIES, label, tuple(existing)))
            existing.append(block)
        else:
            undo.append((COPIES, label, ()))
            copies[label] = [block]
        undo.append((LABEL, block, None))
        cached[block] = label
    if not undo:
        return pool
    return new_version(store, pool, undo)


def free_table(pool: BlockPool, table: tuple[int, ...], order: str,
               unhashed_to_head: bool) -> BlockPool | None:
    """None where the tuples' version would queue a block twice (a block
    already free reaching count 0 again: a malformed state, left to them)."""
    store = store_of(pool)
    refs, labels = store.refs, store.labels
    counts: dict[int, int] = {}
    to_head: list[int] = []
    to_tail: list[int] = []
    for b in (reversed(table) if order == "reverse" else table):
        counts[b] = counts.get(b, refs[b]) - 1
        if counts[b] == 0:
            if is_free(store, b):
                return None
            (to_head if unhashed_to_head and labels[b] is None else to_tail).append(b)
    undo: list[tuple] = [(REF, b, refs[b]) for b in counts]
    for b, count in counts.items():
        refs[b] = count
    base = store.next_head - len(to_head) + 1
    queued = [(base + i, b) for i, b in enumerate(to_head)]
    store.next_head = base - 1
    queued += [(store.next_tail + i, b) for i, b in enumerate(to_tail)]
    store.next_tail += len(to_tail)
    for t, b in queued:
        undo.append((TICKET, b, None))
        store.ticket[b] = t
        heapq.heappush(store.heap, (t, b))
    return new_version(store, pool, undo)


def first_copy(pool: BlockPool, label: int) -> int | None:
    """The newest version's block a hit on `label` is served from."""
    copies = pool.__dict__["_store"].copies.get(label)
    return copies[0] if copies else None


def uncache(pool: BlockPool, table: tuple[int, ...]) -> BlockPool:
    """The blocks of `table` leave the prefix cache, held or free, where they are."""
    store = store_of(pool)
    undo: list[tuple] = []
    for b in dict.fromkeys(table):
        _forget_label(store, b, undo)
    return new_version(store, pool, undo) if undo else pool


def _forget_label(store: PoolStore, b: int, undo: list[tuple]) -> None:
    """Block b leaves the prefix cache (its label and its place among the
    label's copies), the old values recorded in `undo`; nothing if uncached."""
    label = store.labels[b]
    if label is None:
        return
    copies = store.copies
    undo.append((COPIES, label, tuple(copies[label])))
    copies[label].remove(b)
    if not copies[label]:
        del copies[label]
    undo.append((LABEL, b, label))
    store.labels[b] = None


def copies_hold(store: PoolStore, blocks: dict[int, Any], keep_duplicates: bool) -> bool:
    """S9's caching clause on the labels of `blocks` (block -> its old label)
    and their old labels, read from the store: each such label's copies are
    exactly the blocks labelled with it (the store lists them in caching
    order, grouped, so `duplicates` has its form), and one at most unless
    the profile caches duplicates."""
    labels, copies = store.labels, store.copies
    changed = {label for b, old in blocks.items() for label in (old, labels[b]) if label is not None}
    for label in changed:
        listed = copies.get(label, ())
        if any(labels[b] != label for b in listed) or len(set(listed)) != len(listed):
            return False
        if len(listed) > 1 and not keep_duplicates:
            return False
    return all(labels[b] is None or b in copies.get(labels[b], ()) for b in blocks)
