"""The spec state of a streamed trace grows as the trace goes: request slots
and pool blocks are added when an event needs them, instead of being sized
by a pass over the whole trace before its first event (what check.py's
whole-trace checkers do, `_num_slots` and `modelled_pool`).

* **Slots.** The state starts with INITIAL_SLOTS request slots; when an
  arrival finds none free (the incremental checker reuses a finished
  request's slot first, incremental.py), their number doubles. So the slots
  are at most twice the most requests alive or in flight at once (the full
  replay, which never reuses a slot, doubles up to twice the arrivals).
  Growing renames the output labels: `content_label` numbers an output
  block `-(1 + r + slots * index)`, so every cached output label (and the
  incremental checker's record of them) is rewritten to its value under the
  new slot count, the duplicates list regrouped. The rename is one-to-one on
  output labels and leaves prompt labels (never negative) alone, so every
  cache hit, miss and duplicate is as before: the spec's decisions do not
  read the slot count otherwise.

* **Blocks.** The pool is cut, as `modelled_pool` cuts it, to the blocks the
  arrivals so far can take, and grows at each arrival by what that arrival
  can take (never past the configured pool). The cut is exact for the same
  reason as the whole-trace cut: no more blocks are popped than the arrivals
  so far can take, so the never-popped blocks form one run of the free
  queue, in order, ending with the pool's last block; growing inserts the new
  blocks right after it, which is where a pool cut larger from the start has
  them. Only `state_before` can differ from the whole-trace cut: its free
  queue lists the blocks of the arrivals read so far, not of the whole trace.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from flightcheck.spec import State
from flightcheck.spec.blocks import group_duplicates
from flightcheck.spec.state import Request

from .configuration import arrival_blocks
from .named_state import describe_named
from .reading import MalformedTrace
from .schema import MAX_POOL_BLOCKS

INITIAL_SLOTS = 8


class Growing:
    """A mixin for check.py's checkers (before them in the bases): slots and
    blocks added as the trace needs them. Built from the config event alone."""

    state: State
    names: list[str]

    def _num_slots(self, events: list[dict[str, Any]]) -> int:
        return INITIAL_SLOTS

    def start_growing(self, whole_pool_blocks: int, cut: bool) -> None:
        """`whole_pool_blocks`: the configured pool; `cut`: whether the pool is
        cut to the arrivals (modelled_pool cuts it unless the whole is read)."""
        self.whole_pool_blocks = whole_pool_blocks
        self.cut_pool = cut
        self.demand = 1                      # blocks the arrivals so far can take, plus one
        self.arrivals_demand = 0             # of those, one table of each arrival so far

    def describe(self, state: State) -> str:
        """As the checker's `describe`; a state from before the slots grew
        lists the slots it has (a new one holds a request not yet arrived)."""
        size = len(state.requests)
        return describe_named(state, [r for r in self._arrival_order() if r < size],  # type: ignore[attr-defined]
                              self._quoted_name)  # type: ignore[attr-defined]

    # -- slots ----------------------------------------------------------------

    def _new_slot(self) -> int:
        if not hasattr(self, "next_unused") and len(self.names) == len(self.state.requests):
            self._grow_slots()                  # the full replay: one slot per arrival
        return super()._new_slot()  # type: ignore[misc]

    def _reusable_slot(self) -> int:
        try:
            return super()._reusable_slot()  # type: ignore[misc]
        except RuntimeError:                    # every slot is alive or in flight
            self._grow_slots()
            return super()._reusable_slot()  # type: ignore[misc]

    def _grow_slots(self) -> None:
        old = len(self.state.requests)
        new = max(INITIAL_SLOTS, 2 * old)
        rename = _output_label_renaming(old, new)
        pool = self.state.pool
        labels = tuple(rename(label) for label in pool.labels)
        duplicates = group_duplicates(list(pool.duplicates), list(labels)) if pool.duplicates else ()
        pool = replace(pool, labels=labels, duplicates=duplicates)
        self.state = replace(self.state, pool=pool, requests=self.state.requests + (Request(),) * (new - old))
        recorded = getattr(self, "output_labels", None)      # the incremental checker's record
        if recorded:
            for blocks in recorded.values():
                for block, label in blocks.items():
                    blocks[block] = rename(label)

    # -- blocks ---------------------------------------------------------------

    def grow_pool_for(self, event: dict[str, Any], line: int) -> None:
        """Before an arrival is applied: the pool holds what it can take.
        Before a reset of the running requests: what every request so far
        can take once more (each may be preempted and take its table again,
        as configuration.modelled_pool counts it)."""
        if not self.cut_pool:
            return
        cfg = self.cfg  # type: ignore[attr-defined]
        if event["ev"] == "reset":
            self.demand += self.arrivals_demand
        else:
            self.arrivals_demand += arrival_blocks(cfg, event)
            self.demand += arrival_blocks(cfg, event)
        wanted = min(self.whole_pool_blocks, self.demand)
        if wanted > MAX_POOL_BLOCKS:
            raise MalformedTrace(f"line {line}: {event['ev']} event: the trace's arrivals up to this one can take up "
                                 f"to {wanted} blocks of the pool (num_blocks {self.whole_pool_blocks}); the "
                                 f"checker models pools of at most {MAX_POOL_BLOCKS} blocks")
        if wanted > cfg.num_blocks:
            # at least doubled (within the whole pool and the bound): each growth
            # copies the pool, so arrivals that each need a little more cost
            # O(pool) in all, not per arrival; a larger cut changes no decision
            # (no allocation fails in a pool the arrivals cannot fill)
            size = min(self.whole_pool_blocks, MAX_POOL_BLOCKS, max(wanted, 2 * cfg.num_blocks))
            self.state = replace(self.state, pool=_grown_pool(self.state.pool, size))
            self.cfg = replace(cfg, num_blocks=size)  # type: ignore[attr-defined]


def _output_label_renaming(old_slots: int, new_slots: int):
    """content_label's output label of (slot r, block index i) under
    `old_slots` to its value under `new_slots`; other labels unchanged."""
    def rename(label: int | None) -> int | None:
        if label is None or label >= 0:
            return label
        index, r = divmod(-label - 1, old_slots)
        return -(1 + r + new_slots * index)
    return rename


def _grown_pool(pool, num_blocks: int):
    """The pool with blocks len..num_blocks-1 added, free, unlabelled, right
    after the run of never-popped blocks (which ends with the last block)."""
    old = len(pool.ref_counts)
    added = tuple(range(old, num_blocks))
    free = pool.free_queue
    at = free.index(old - 1) + 1 if old else 0
    return replace(pool, ref_counts=pool.ref_counts + (0,) * len(added),
                   labels=pool.labels + (None,) * len(added), free_queue=free[:at] + added + free[at:])
