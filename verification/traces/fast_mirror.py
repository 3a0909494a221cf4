"""The fast path's mirror (fast.py): a mutable copy of what the events it
handles change in the spec's `State`, and the way back to a `State`.

Abstracted away: nothing. Per request in `running`: its known tokens
(prompt and outputs), num_computed, block table (a list), how many of its
table's leading blocks are known to be cached, and the known tokens at which
it finishes by length; the records of the requests whose status changed
here (arrivals, admissions, resets), the statuses of those that finished,
`waiting` and `running` as lists, the batches in flight as tuples
(request, start, n, samples: every entry live, no drafts), and the pool (a
version advanced with the spec's own operations). Every other part of the
state is `base`, the State it was entered from.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from flightcheck.spec import State, Status
from flightcheck.spec import blocks
from flightcheck.spec.state import Entry, Request, evolve


class Mirror:
    """The mutable copy (module docstring)."""

    __slots__ = ("base", "waiting", "running", "records", "finished", "known", "comp", "table", "cached", "cap",
                 "in_flight", "pool", "num_slots", "max_model_len")

    def __init__(self, base: State, in_flight: deque, max_model_len: int) -> None:
        self.base = base
        requests = base.requests
        self.waiting = list(base.waiting)
        self.running = list(base.running)
        self.records: dict[int, Request] = {}      # records replaced here (counters of running ones apart)
        self.finished: dict[int, Status] = {}      # requests finished here: their status
        self.known: dict[int, int] = {}
        self.comp: dict[int, int] = {}
        self.table: dict[int, list[int]] = {}
        self.cap: dict[int, int] = {}
        self.max_model_len = max_model_len
        for r in base.running:
            self.track(r, requests[r])
        self.cached: dict[int, int] = {}           # filled when first needed (cached_of)
        self.in_flight = in_flight
        self.pool = base.pool
        self.num_slots = len(requests)

    def track(self, r: int, q: Request) -> None:
        """Keep r's running counters here (from its record `q`)."""
        self.known[r] = q.num_tokens
        self.comp[r] = q.num_computed
        self.table[r] = list(q.block_table)
        # known tokens at which it finishes by length (0.8.x's check_stop)
        self.cap[r] = min(self.max_model_len, q.prompt_len + q.max_tokens)

    def record(self, r: int) -> Request:
        """r's record as the mirror has it (running counters apart)."""
        q = self.records.get(r)
        return self.base.requests[r] if q is None else q

    def status(self, r: int) -> Status:
        return self.finished[r] if r in self.finished else self.record(r).status

    def cached_of(self, r: int, pool: Any) -> int:
        """How many of r's leading table blocks are known to be cached (read
        in `pool`, the newest version: a label of a held block is never evicted)."""
        known = self.cached.get(r)
        if known is None:
            self.cached[r] = known = cached_prefix(pool, self.table[r])
        return known

    def to_state(self) -> State:
        """The spec State the mirror stands for."""
        requests = list(self.base.requests)
        for r, q in self.records.items():
            requests[r] = q
        for r, status in self.finished.items():
            requests[r] = evolve(requests[r], status=status, num_output=self.known[r] - requests[r].prompt_len,
                                 num_computed=0, num_drafts=0, block_table=())
        for r in self.running:
            q = requests[r]
            table, out = self.table[r], self.known[r] - q.prompt_len
            if q.num_computed != self.comp[r] or q.num_output != out or len(q.block_table) != len(table):
                kept = q.block_table if len(q.block_table) == len(table) else tuple(table)
                requests[r] = evolve(q, num_computed=self.comp[r], num_output=out, block_table=kept)
        in_flight = tuple(tuple(Entry(r, start, n, samples, 0) for r, start, n, samples in batch)
                          for batch in self.in_flight)
        return evolve(self.base, requests=tuple(requests), in_flight=in_flight, pool=self.pool,
                      running=tuple(self.running), waiting=tuple(self.waiting))


def cached_prefix(pool: Any, table: Any, start: int = 0) -> int:
    """How many of `table`'s leading blocks carry a label (from `start`, known cached)."""
    i = start
    while i < len(table) and blocks.label_of(pool, table[i]) is not None:
        i += 1
    return i
