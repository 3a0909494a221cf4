"""The incremental trace checker: the verdict of the full replay (check.py),
at a cost per event that depends on what the event touches, not on the
history.

The full replay checks every property of the whole state after every event,
and its state has one request slot per arrival ever made, so both the spec's
own transitions (which copy the request tuple) and the checks grow with the
history. This checker differs in two ways, and in nothing else:

* **Only the touched parts are checked.** Every invariant is the conjunction
  of a part per request, a part per in-flight batch and a state part
  (spec/invariants.py). An event replaces the records of the requests it
  touches (an arrival or abort: that request; a schedule step: the requests
  it scheduled or preempted; a completion: the requests of the completed
  batch) and adds at most one batch; every other request's part reads only
  what did not change (its record, its own entries, its own membership of
  the queues and of the one-batch-per-request set, the labels of its own
  blocks), and a batch's part reads only its snapshot, which S4 keeps fixed.
  So after each event this checker evaluates the request parts of the
  touched requests, the batch part of a new batch, and the state parts; the
  pool's state part (S9's reference counts, free queue and labels) it
  evaluates on the blocks the touched requests' tables held or hold (the
  only blocks an event can change), with the holders of each block kept up
  to date from those tables; S9's caching clause (a label cached once, or,
  with the profile's duplicate caching, every copy listed in
  `BlockPool.duplicates`) per label whose copies changed. S12 is checked
  per touched request, with the schedule step's own record instead of a
  second `schedule`. Two state parts are implied by their value before the
  event: L3 when the oldest batch is the same, L2 after an arrival onto an
  idle engine that had a batch to form, the newcomer at the tail of
  `waiting` (`_arrival_behind_a_schedulable_queue`).

* **Finished requests' slots are reused.** A slot whose request has
  finished and has nothing left in flight is given to a later arrival, so
  the state holds as many slots as requests are ever alive at once (plus
  the finished ones still in flight), not one per arrival. Before reuse the
  slot is reset to a request that has not arrived, and the labels its old
  incarnation's output blocks cached are evicted from the pool, every copy
  of each (a resumed request recomputes its last full block, so its label
  can be cached twice): those labels are unique to the slot, so in the full
  replay nothing could ever hit them again; left in place, they would be
  hit by the new incarnation.

Every version profile (spec/profiles.py) is checked the same way: release
order, preallocation and duplicate caching live in the spec's transitions,
which both checkers run unchanged.

The full replay stays available (`check-trace --full`); a differential test
(tests/test_check_trace_incremental.py) runs both on every trace the test
suite has, on long generated ones of every profile and on vLLM's own
traces, and requires the same verdict, property, event, message, profile
and `state_before` (which names requests by the trace's ids, in arrival
order, and leaves out the finished requests with nothing in flight: the only
ones whose slots are reused).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from flightcheck.spec import (
    invariants_for,
    transition_properties_for,
    Abort,
    Action,
    Arrive,
    BlockPool,
    CompleteOldest,
    Config,
    Invariant,
    Request,
    Reset,
    Schedule,
    SetPause,
    State,
)
from flightcheck.spec import pool_store, request_store
from flightcheck.spec.blocks import group_duplicates
from flightcheck.spec.sessions import waiting_for_input
from flightcheck.spec.state import Batch
from flightcheck.spec.transitions import (GRAMMAR_EVENTS, KV_REPORTS, FailKvLoad, FailKvOutput, SendInput,
                                          s12_no_admission_after_preemption,
                                          status_only_moves_forward)

from .connector import transfer_pending
from .schema import show

S12 = "S12_status_monotonicity"


@dataclass(frozen=True)
class Footprint:
    """What one event changed: all that the incremental checks read."""

    before: State
    after: State
    action: Action
    touched: list[int]              # the requests whose records the event replaced
    new_batch: Batch | None         # the batch a schedule step put in flight, if any
    blocks: set[int]                # the blocks whose holders, count, place or label may have changed


class Incremental:
    """What turns check.py's TraceChecker into the incremental checker
    (check.IncrementalChecker): check only what each event touches, reuse the
    slots of finished requests (see the module docstring). A mixin, so that
    this module needs nothing of check.py: it raises the checker's violations
    through `self._violation`."""

    def __init__(self, events: list[dict[str, Any]], profile: str | None = None) -> None:
        super().__init__(events, profile)  # type: ignore[call-arg]
        self.holders: Counter[int] = Counter()          # block -> tables holding it
        self.arrival_number: dict[int, int] = {}        # slot -> arrival count when it arrived
        # slot -> block -> the output label it cached for that slot: every
        # copy, since with duplicate caching a label can be cached twice
        self.output_labels: dict[int, dict[int, int]] = {}
        self.retired: dict[str, Any] = {}               # name whose slot was reused -> its final status
        self.finished_slots: dict[int, None] = {}       # slots of finished requests, oldest finish first
        self.next_unused = 0
        self.num_arrivals = 0

    # -- slots --------------------------------------------------------------

    def _num_slots(self, events: list[dict[str, Any]]) -> int:
        """The most requests the trace has alive or in flight at once (by its
        own arrive, finish, abort, schedule and complete events), plus one: a
        finished request keeps its slot while an entry of it is in flight.
        Until the first violation the spec's requests and batches are the
        trace's, so this many slots suffice."""
        incarnation: dict[Any, tuple[Any, int]] = {}   # name -> its latest incarnation
        alive: set[tuple[Any, int]] = set()
        in_flight: list[list[tuple[Any, int]]] = []     # each in-flight batch's incarnations, oldest first
        flying: Counter[tuple[Any, int]] = Counter()    # incarnation -> in-flight batches holding it
        num_finished_flying = 0                          # incarnations finished but still in flight
        transfers = _KvTransfers(events[0])              # incarnations a KV transfer holds
        num_arrivals = most = 0
        for e in events:
            kind = e["ev"]
            if kind == "arrive":
                num_arrivals += 1
                incarnation[e["req"]] = key = (e["req"], num_arrivals)
                alive.add(key)
            elif kind in ("finish", "abort") and incarnation.get(e["req"]) in alive:
                key = incarnation[e["req"]]
                alive.discard(key)
                num_finished_flying += flying[key] > 0
            elif kind == "schedule" and e["entries"]:
                keys = [incarnation.get(x["req"], (x["req"], -1)) for x in e["entries"]]
                in_flight.append(keys)
                for key in keys:
                    num_finished_flying += flying[key] == 0 and key not in alive
                    flying[key] += 1
            elif kind == "complete" and in_flight:
                for key in in_flight.pop(0):
                    flying[key] -= 1
                    if flying[key] == 0:
                        del flying[key]
                        num_finished_flying -= key not in alive
            transfers.see(e, incarnation)
            most = max(most, len(alive) + num_finished_flying + transfers.finished_held(alive, flying))
        return most + 1

    def _new_slot(self) -> int:
        r = self._reusable_slot()
        self.arrival_number[r] = self.num_arrivals
        self.num_arrivals += 1
        return r

    def _reusable_slot(self) -> int:
        if self.next_unused < len(self.state.requests):
            self.next_unused += 1
            self.names.append("")                      # filled in by _on_arrive
            return self.next_unused - 1
        for r in self.finished_slots:
            if not self.state.entries_of(r, fate=None) and not transfer_pending(self.state.requests[r]):
                # nothing of it left in flight, no KV transfer holding its blocks
                del self.finished_slots[r]
                self._reset_slot(r)
                return r
        raise RuntimeError("incremental checker: no request slot is free (the count of "
                           "requests alive at once was wrong)")

    def _reset_slot(self, r: int) -> None:
        old_name = self.names[r]
        if self.slot.get(old_name) == r:
            del self.slot[old_name]
            self.retired[old_name] = self.state.requests[r].status
        pool = self.state.pool
        # (the labels not evicted by a pop since; a large pool: in place, pool_store.py)
        evicted = [block for block, label in self.output_labels.pop(r, {}).items()
                   if pool_store.label_of(pool, block) == label]
        if pool_store.usable(pool):
            pool = pool_store.uncache(pool, tuple(evicted))
        else:
            labels = list(pool.labels)
            for block in evicted:
                labels[block] = None
            # a copy evicted here leaves `duplicates` as a pop would (blocks.pop_fresh)
            duplicates = group_duplicates([b for b in pool.duplicates if labels[b] is not None], labels)
            pool = replace(pool, labels=tuple(labels), duplicates=duplicates)
        # a reused slot arrives anew: its old place in the arrival order
        # (the priority policy's rank, 0.34's load limit) goes with it
        arrivals = tuple(x for x in self.state.arrivals if x != r)
        self.state = replace(self.state, pool=pool, arrivals=arrivals).with_request(r, **_fresh_request_fields())

    # -- checking -------------------------------------------------------------

    def _touched(self, before: State, action: Action, after: State) -> list[int]:
        if isinstance(action, (FailKvLoad, FailKvOutput)):
            # a failed sync load also fails or rolls back the requests sharing
            # its invalid blocks (spec/kv_reports.py, shared_holders); an
            # output's failures together (fail_kv_output): every one's
            failing = [f.req for f in action.failures] if isinstance(action, FailKvOutput) else [action.req]
            return failing + [r for r, (b, a) in enumerate(zip(before.requests, after.requests))
                              if b is not a and r not in failing]
        if isinstance(action, (Arrive, Abort, SendInput) + KV_REPORTS + GRAMMAR_EVENTS):
            return [action.req]
        if isinstance(action, (Reset, SetPause)):
            # a reset preempts every running request (spec/reset_pause.py); a pause touches none
            return [r for r, (b, a) in enumerate(zip(before.requests, after.requests)) if b is not a]
        if isinstance(action, Schedule):
            assert self.scheduled is not None
            if self.cfg.kv_connector is not None:
                # the waiting loop also parks and promotes requests it does not schedule
                return [r for r, (b, a) in enumerate(zip(before.requests, after.requests)) if b is not a]
            if self.cfg.rules.output_placeholders:
                # async: every schedule() call moves each request's stagger
                # countdown and adds a batch S6' counts from its sampling entries
                return list(range(len(before.requests)))
            return list(dict.fromkeys([e.req for e in self.scheduled.entries] + list(self.scheduled.preempted)))
        if isinstance(action, CompleteOldest):
            # and the failed grammars the update finishes (spec/grammar.py)
            return list(dict.fromkeys([e.req for e in before.in_flight[0]] + sorted(before.grammar_errors)))
        raise TypeError(f"not an action: {action!r}")

    def _check_properties(self, before: State, after: State, action: Action) -> None:
        request_store.settle(after)             # the checks below read many requests
        touched = self._touched(before, action, after)
        new_batch = after.in_flight[-1] if isinstance(action, Schedule) and self.scheduled.entries else None
        blocks = self._update_holders(before, after, touched)
        footprint = Footprint(before, after, action, touched, new_batch, blocks)
        self._note_output_labels(after, touched)
        for r in touched:
            if after.requests[r].status.is_finished and not before.requests[r].status.is_finished:
                self.finished_slots[r] = None
        for inv in invariants_for(self.cfg, auxiliary=False):
            if not self._holds(inv, footprint):
                raise self._violation(inv.name, inv.statement)
        for prop in transition_properties_for(self.cfg):
            if prop.name == S12:
                ok = all(status_only_moves_forward(before.requests[r], after.requests[r], action) for r in touched) and \
                    (not isinstance(action, Schedule) or s12_no_admission_after_preemption(before, self.scheduled))
            else:
                ok = prop.holds(before, after, action, self.cfg)
            if not ok:
                raise self._violation(prop.name, prop.statement)
        self.scheduled = None

    def _holds(self, inv: Invariant, event: Footprint) -> bool:
        """Invariant `inv` after the event, from the parts the event touched."""
        cfg, s, before = self.cfg, event.after, event.before
        if inv.of_state is not None:
            if inv.name == "S9_kv_ownership":
                # a reset of the prefix cache uncaches blocks no touched request
                # holds (duplicate copies among them): the whole clause then
                whole = isinstance(event.action, Reset)
                if not (inv.of_state(s, cfg) if whole else self._pool_holds(before, s, event.blocks, event.touched)):
                    return False
            elif inv.name == "L3_drain" and _same_head(before, s):
                pass                   # it held of `before`, and reads only the oldest batch
            elif inv.name == "L2_no_deadlock" and self._l2_judged_later():
                pass                   # of the next input's state (step_inputs.py)
            elif inv.name == "L2_no_deadlock" and not self.l2_owed_before \
                    and _arrival_behind_a_schedulable_queue(before, s, event.action, cfg):
                pass                   # it held of `before` with a batch to form: see below
            elif not inv.of_state(s, cfg):
                return False
        if inv.of_request is not None and not all(inv.of_request(s, cfg, r) for r in event.touched):
            return False
        return inv.of_batch is None or event.new_batch is None or inv.of_batch(s, cfg, event.new_batch)

    def _update_holders(self, before: State, after: State, touched: list[int]) -> set[int]:
        """Bring the holders count up to date; the blocks whose holders,
        reference count, free-queue place or label the event can change."""
        blocks: set[int] = set()
        for r in touched:
            old, new = before.requests[r].block_table, after.requests[r].block_table
            if old is new:
                continue
            self.holders.subtract(old)
            self.holders.update(new)
            blocks.update(old)
            blocks.update(new)
        if before.deferred_frees is not after.deferred_frees or before.error_frees is not after.error_frees:
            # blocks freed behind the step fence (a KV connector) are held by
            # the fence until drained: still referenced, not yet free
            old_deferred, new_deferred = _deferred_blocks(before), _deferred_blocks(after)
            self.holders.subtract(old_deferred)
            self.holders.update(new_deferred)
            blocks.update(old_deferred)
            blocks.update(new_deferred)
        return blocks

    def _pool_holds(self, before: State, s: State, blocks: set[int], touched: list[int]) -> bool:
        """S9's pool part on the blocks the event could change (the rest of
        the pool is as it was, and it held then)."""
        pool = s.pool
        if pool is before.pool and not blocks:
            return True
        changes = pool_store.changes_since(before.pool, pool)
        if changes is not None:
            return self._store_holds(pool, blocks, changes)
        if any(pool.ref_counts[b] != self.holders[b] for b in blocks):
            return False
        free = pool.free_queue
        if free is not before.pool.free_queue:
            free_set = set(free)
            if len(free_set) != len(free):
                return False
            if any((pool.ref_counts[b] == 0) != (b in free_set) for b in blocks):
                return False
        if pool.labels is before.pool.labels and pool.duplicates is before.pool.duplicates:
            return True
        # the only blocks a transition relabels: a pop evicts the label of a
        # block it puts in a table (in `blocks`), caching labels blocks of a
        # scheduled request's table, new or old (a block fills up after it
        # joined the table)
        relabelled = blocks.union(*(s.requests[r].block_table for r in touched)) \
            if pool.labels is not before.pool.labels else set()
        return self._cached_copies_hold(before.pool, pool, relabelled)

    def _store_holds(self, pool: BlockPool, blocks: set[int], changes: dict[int, dict]) -> bool:
        """`_pool_holds` for a large pool's newest version (spec/pool_store.py),
        from the blocks the event changed as the store recorded them: their
        reference counts against their holders, their place in the free queue
        (a store's queue has no repeats) and the caching clause on the labels
        they had or have."""
        store = pool.__dict__["_store"]
        refs = store.refs
        for b in blocks.union(changes[pool_store.REF], changes[pool_store.TICKET]):
            if refs[b] != self.holders[b] or (refs[b] == 0) != pool_store.is_free(store, b):
                return False
        return pool_store.copies_hold(store, changes[pool_store.LABEL], self.cfg.cache_duplicate_blocks)

    def _cached_copies_hold(self, before: BlockPool, pool: BlockPool, relabelled: set[int]) -> bool:
        """S9's caching clause (spec cached_copies_as_profile_allows) on the labels the event
        could change: the old and new labels of `relabelled`, the blocks
        whose label it may have changed. The clause is a conjunction
        per label (its copies: one, or all in `duplicates`) plus the form of
        `duplicates` (no repeats, grouped by label); every other label's
        copies, and their place in `duplicates`, are as they were, and held."""
        labels, old_labels = pool.labels, before.labels
        changed = {label for b in relabelled if labels[b] != old_labels[b]
                   for label in (labels[b], old_labels[b]) if label is not None}
        if not self.cfg.cache_duplicate_blocks:
            return not pool.duplicates and all(labels.count(label) <= 1 for label in changed)
        duplicates = pool.duplicates
        order = [labels[b] for b in duplicates]
        if len(set(duplicates)) != len(duplicates) or order != sorted(order):  # type: ignore[type-var]
            return False
        kept = {b for b in duplicates if labels[b] not in changed}
        if kept != {b for b in before.duplicates if old_labels[b] not in changed}:
            return False
        listed = {b for b in duplicates if labels[b] in changed}
        return listed == {b for label in changed for b in _copies(labels, label)}

    def _note_output_labels(self, s: State, touched: list[int]) -> None:
        """Remember which block caches each output label of a touched request
        (negative labels are output labels: content_label)."""
        labels = pool_store.label_list(s.pool)
        for r in touched:
            for b in s.requests[r].block_table:
                label = labels[b]
                if label is not None and label < 0:
                    self.output_labels.setdefault(r, {})[b] = label

    # -- what the full replay finds by a pass over every slot -------------------

    def _newly_finished(self, before: State, after: State) -> list[int]:
        batch = before.in_flight[0]
        finished = {r for r in [e.req for e in batch] + sorted(before.grammar_errors)    # (spec/grammar.py)
                    if after.requests[r].status.is_finished and not before.requests[r].status.is_finished}
        return sorted(finished, key=self.arrival_number.__getitem__)

    def _arrival_order(self) -> list[int]:
        return sorted(self.arrival_number, key=self.arrival_number.__getitem__)

    def _active_slots(self) -> list[int]:
        active = [r for r, q in enumerate(self.state.requests) if q.status.is_active]
        return sorted(active, key=self.arrival_number.__getitem__)

    def _on_finish(self, event: dict) -> None:
        name = event["req"]
        if name not in self.slot and name in self.retired:
            raise self._violation("finish_decision", f"{show(name)} finishes ({event['reason']}) in the trace, but is "
                             f"{self.retired[name].value} in the spec")
        super()._on_finish(event)


class _KvTransfers:
    """For the slot count: the incarnations whose blocks a KV transfer still
    holds, by the trace's own events: an async load from its park to its
    `kv_received`; a finished request held for a send (`finish.held`, or
    with no `held` any finish under a producer) to its `kv_sent`."""

    def __init__(self, config: dict[str, Any]) -> None:
        connector = config.get("kv_connector")
        self.producer = bool(connector and connector.get("producer"))
        self.pending: set[tuple[Any, int]] = set()

    def see(self, e: dict[str, Any], incarnation: dict[Any, tuple[Any, int]]) -> None:
        kind = e["ev"]
        if kind == "schedule":
            self.pending.update(incarnation.get(x["req"], (x["req"], -1)) for x in e.get("kv_loads", ()))
        elif kind == "finish" and e["req"] in incarnation and \
                e.get("held", self.producer and e["reason"] in ("stop", "length")):
            self.pending.add(incarnation[e["req"]])
        elif kind in ("kv_received", "kv_sent") and e["req"] in incarnation:
            self.pending.discard(incarnation[e["req"]])

    def finished_held(self, alive: set, flying: Counter) -> int:
        """The incarnations held that are neither alive nor in flight."""
        return sum(1 for key in self.pending if key not in alive and not flying[key]) if self.pending else 0


def _deferred_blocks(state: State) -> list[int]:
    """Every block waiting in the step fence's deferred frees, or for the
    end of the update that finished its request by the fail policy."""
    return [b for _, table, *_ in state.deferred_frees + state.error_frees for b in table]


def _copies(labels: tuple[int | None, ...], label: int) -> list[int]:
    """The blocks caching `label` when two or more do, else none (the
    duplicates S9 requires to be listed); found by C-level scans of the labels."""
    if labels.count(label) < 2:
        return []
    found, start = [], 0
    while True:
        try:
            start = labels.index(label, start) + 1
        except ValueError:
            return found
        found.append(start - 1)


def _arrival_behind_a_schedulable_queue(before: State, after: State, action: Action, cfg: Config) -> bool:
    """L2 after an arrival, from L2 before it. L2 held of `before` (a slot
    reset for the arrival changes nothing `schedule` reads: the evicted
    labels are the old incarnation's own, which no other request looks up); if
    `before` had nothing in flight and a request unfinished (all of them are
    in `waiting` or `running`, by S10), that says `schedule(before)` forms a
    batch or preempts. An arrival that joins the tail of `waiting` (and, one
    batch per request, adds an unscheduled request to vLLM 0.8.4's engine
    gate) leaves `schedule` walking `running` and then `waiting` in order
    with the same budget, seats and pool, so it schedules or preempts
    everything it did before it reaches the newcomer, and is not None
    either. Without this, each of the arrivals that fill an idle engine
    would re-run `schedule` over the whole queue. Not for a newcomer that
    goes ahead of a waiting request: under the priority policy it joins
    `waiting` at its rank (`PriorityRequestQueue.add_request`), and a head
    that can never be admitted stops the waiting loop for all behind it
    (hunt seed 379 index 4: r1, priority 0, an async load of 6 blocks that
    the reservation of vLLM 0.33/0.34 `Scheduler.schedule` leaves 5 for);
    nor where vLLM 0.34's cache-aware reorder may move it ahead (its second
    waiting request can open the window). Not while a streaming session
    waits for input: a parked session sits in a waiting queue without
    counting as unfinished, and L2 may have held of `before` as its
    client's wait (spec/deadlock.py), which says nothing of the newcomer."""
    if not isinstance(action, Arrive) or before.in_flight or not (before.waiting or before.running):
        return False
    joins_the_tail = after.waiting == before.waiting + (action.req,)
    may_reorder = cfg.rules.cache_aware_admission and cfg.cache_aware_admission_window > 0
    return joins_the_tail and not may_reorder and not waiting_for_input(before)


def _same_head(before: State, after: State) -> bool:
    """The oldest in-flight batch is the same object (fates included) in both:
    L3 (can the oldest batch be consumed?) reads nothing else but its entries'
    requests, and `complete_oldest`'s only failure is a sample the batch's
    entries cannot take."""
    return bool(before.in_flight) and bool(after.in_flight) and before.in_flight[0] is after.in_flight[0]


def _fresh_request_fields() -> dict[str, Any]:
    """Every field of a request that has not arrived."""
    fresh = Request()
    return {name: getattr(fresh, name) for name in Request.__dataclass_fields__}
