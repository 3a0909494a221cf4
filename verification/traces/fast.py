"""The fast path of the incremental checker: the common events of a run
checked on a mutable mirror of the spec's state, at a cost per entry close
to the scheduler's own, and everything else handed back to the spec.

What it handles, under a profile without a KV connector, drafts,
asynchronous scheduling, vLLM 0.8.4's engine gate, stale-output counters,
preallocation, the step fence or cache-aware admission (`_static_domain`: in
practice vLLM 0.8.5's), on a trace that numbers no engine steps:
* `schedule` events the spec forms without preempting or resuming: the
  running loop with every allocation succeeding, then the waiting loop's
  admissions of new requests (fast_admission.py);
* `complete` events whose every sampling entry returned one token, the
  requests they finish (by a stop token or a length cap) finished on the
  mirror, while another batch stays in flight;
* the `finish` events of those requests, and arrivals while a batch is in
  flight (fast_admission.py).
Every other event (aborts, preemptions, resumptions, drafts, anything the
trace gets wrong, an event with engine-step notes) is handed over: the
mirror becomes a spec `State` again (`_leave`, fast_mirror.py) and the
incremental checker (incremental.py) runs the event, so its verdict, message
and state before it are the spec's own.

The mirror (fast_mirror.py) holds what the handled events change: per
running request its known tokens, num_computed, block table (a list) and how
many of the table's leading blocks are known to be cached; the records of
requests that arrived, were admitted, reset or finished; the queues as
lists; the batches in flight as tuples; and the pool, which it advances
with the spec's own operations (blocks.pop_fresh, touch, cache_labels,
free_table, uncache: in place on a large pool, pool_store.py).

Why its acceptance is the spec's:

* **Decisions.** A `schedule` event is accepted only if the trace's batch is
  the one spec/schedule.py's `schedule` forms from the mirrored state: the
  running loop's clip (threshold, budget, room below max_model_len) per
  running request in order, an allocation of exactly the blocks
  `_allocate` takes (none preallocated), the same block caching (the full
  blocks not yet cached, in table order: `cache_labels` skips the cached
  ones itself, and a block of a running table cannot lose its label, since
  only a pop of a free block evicts one), no preemption, then the waiting
  loop's admissions with their prefix hits. The trace's block ids are
  matched with the same `_match_blocks`. A `complete` event is accepted
  only if every sampling entry returned exactly one token (no drafts) and
  no partial chunk returned tokens: `complete_oldest` then appends one
  output to each sampling entry's request and finishes those that stop or
  reach a length cap (`_stop_reason`'s order), freeing their tables as
  `_finish` does (nothing of theirs is left in flight, or it is handed over).
* **Properties.** The events accepted are spec transitions from a state the
  checks before it accepted, and leave a batch in flight (a completion that
  would drain the FIFO, and an arrival onto an idle engine, are handed over:
  L2 runs `schedule` there). Within this domain each invariant's touched
  parts follow from the transition itself (counters advance by the entry, a
  request keeps one sampling entry last, the pool's counts are the tables'
  as the spec's pool operations set them, statuses move WAITING -> RUNNING
  -> finished, every entry in flight is live, L3 reads live entries), which
  is what the spec's model-checked inductiveness says; the transition
  properties (S4, S12, S13) hold of transitions that change no snapshot or
  fate and move statuses only forward, with no preemption.
* **The incremental checker's own records** are kept as it keeps them: the
  holders of each block, the output labels each slot cached
  (`output_labels`, noted as they are cached), the finished slots in the
  order it notes them, arrival numbers, names and retired names.

tests/test_check_trace_fast.py and tests/conftest.py compare this checker
with the incremental one (and through it the full replay) on every trace the
suite checks, on generated traces and on damaged ones: the same verdict,
property, event, message and state before it.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from flightcheck.spec import State, Status
from flightcheck.spec import blocks
from flightcheck.spec.schedule import _threshold_in_force
from flightcheck.spec.state import Entry, Fate, evolve

from .fast_admission import FastAdmission, Queues
from .fast_mirror import Mirror, cached_prefix
from .replay import REASONS, _Violation

BLOCK_IDS_UNCHECKED = "block identity (schedule entries carry no block_ids)"
STOPS_UNCHECKED = "stop tokens (no eos_token_id or stop_token_ids in the trace)"
_HANDLERS = {"schedule": "_fast_schedule", "complete": "_fast_complete", "finish": "_fast_finish",
             "arrive": "_fast_arrive"}
# keys of a schedule or complete event that the fast path leaves to the spec
_NOTES = ("empty_batch", "empty_batches_before", "engine_step", "kv_loads", "dropped", "next_drafts")


class FastPath(FastAdmission):
    """A mixin before incremental.py's checker (check.IncrementalChecker):
    `feed` takes the fast path where it can, else hands the event to the
    spec. `state` reads the spec state (leaving the mirror) wherever the
    checker or its caller reads it; `last_before` is the state before the
    event the spec path last took (what a violation is reported with)."""

    _mirror: Mirror | None = None
    fast_events = 0                         # events the fast path took (for the tests and benchmarks)

    @property  # type: ignore[override]
    def state(self) -> State:
        if self._mirror is not None:
            self._leave()
        return self._state

    @state.setter
    def state(self, value: State) -> None:
        self._mirror = None
        self._state = value

    def feed(self, event: dict[str, Any]) -> None:
        kind = event["ev"]
        if kind in _HANDLERS and self._fast_allowed(event) and \
                (self._mirror is not None or (kind in ("schedule", "complete") and self._enter())):
            taken = getattr(self, _HANDLERS[kind])(event)
            if taken:
                self.fast_events += 1
                return
        self.last_before = self.state
        super().feed(event)  # type: ignore[misc]

    def in_flight_slots(self) -> list[int]:
        """The requests of every batch in flight, without leaving the mirror."""
        if self._mirror is not None:
            return [entry[0] for batch in self._mirror.in_flight for entry in batch]
        return [e.req for batch in self._state.in_flight for e in batch]

    def num_live(self) -> int:
        """Requests waiting or running, without leaving the mirror."""
        if self._mirror is not None:
            return len(self._mirror.waiting) + len(self._mirror.running)
        return len(self._state.waiting) + len(self._state.running)

    # -- entering and leaving -------------------------------------------------

    def _fast_allowed(self, event: dict[str, Any]) -> bool:
        """The checker's own conditions for skipping replay.py's `feed` prelude:
        nothing pending that the prelude checks, no note it reads."""
        if not getattr(self, "_static_ok", None):
            self._static_ok = _static_domain(self.cfg)  # type: ignore[attr-defined]
            if not self._static_ok:
                return False
        if self.ended or self.just_aborted is not None:  # type: ignore[attr-defined]
            return False
        if self.finished_now and event["ev"] != "finish":  # type: ignore[attr-defined]
            return False                            # a missing finish: the spec's message
        if self.numbers_engine_steps is not False:  # type: ignore[attr-defined]
            return False                           # replay.py's prelude decides (engine_steps.py)
        return not any(key in event for key in _NOTES)

    def _enter(self) -> bool:
        """Mirror the spec state, if it is in the fast path's domain."""
        if self._mirror is not None:
            return True
        s = self._state
        if s.kv_holding or s.deferred_frees or s.error_frees or s.scheduled_ids or s.invalid_kv \
                or s.unwritten_kv:
            return False
        in_flight: deque = deque()
        for batch in s.in_flight:
            if not batch:
                return False
            mirrored = []
            for e in batch:
                if e.fate is not Fate.LIVE or e.drafts or e.name is not None or e.external or e.blocks:
                    return False
                mirrored.append((e.req, e.start, e.n, e.samples))
            in_flight.append(mirrored)
        requests = s.requests
        for r in s.running:
            q = requests[r]
            if q.status is not Status.RUNNING or q.num_drafts or q.placeholders or q.decode_countdown:
                return False
        if any(requests[r].status is not Status.WAITING for r in s.waiting):
            return False                    # a preempted request: its orphans are the spec's
        self._mirror = Mirror(s, in_flight, self.cfg.max_model_len)  # type: ignore[attr-defined]
        return True

    def _leave(self) -> None:
        """The mirror as a spec State again (the checker reads the spec's from here on)."""
        m, self._mirror = self._mirror, None
        assert m is not None
        self._state = m.to_state()

    # -- schedule ---------------------------------------------------------------

    def _fast_schedule(self, event: dict[str, Any]) -> bool:
        """A schedule event the spec forms without preempting or resuming; False: hand it over."""
        m, cfg = self._mirror, self.cfg  # type: ignore[attr-defined]
        assert m is not None
        entries = event["entries"]
        if event.get("preempted") or not entries or len(m.in_flight) >= cfg.queue_depth:
            return False
        planned = self._plan(m, len(entries))
        if planned is None:
            return False
        plan, pool = planned
        names = self.names  # type: ignore[attr-defined]
        if len(plan) != len(entries):
            return False
        for (r, start, n, cached, samples, _, _, _), x in zip(plan, entries):
            got_samples = x.get("samples")
            if (x["req"] != names[r] or x["start"] != start or x["n"] != n or x.get("cached", 0) != cached
                    or x.get("drafts", 0) != 0 or x.get("external", 0) != 0
                    or (got_samples is not None and bool(got_samples) != samples)):
                return False
        if not self._blocks_match(plan, entries):
            return False
        self._commit_schedule(m, plan, pool, event)
        return True

    def _plan(self, m: Mirror, most: int) -> tuple[list, Any] | None:
        """The running loop, then the waiting loop, on the mirror: (entry
        plan, pool after it), or None where the spec must judge (an allocation
        that fails in the running loop: a preemption; a resumption) or the
        batch is longer than the trace's. A plan entry: (request, start, n,
        cached, samples, new blocks, (block, label) offered for caching,
        whether it is an admission)."""
        cfg = self.cfg  # type: ignore[attr-defined]
        bs, budget, pool = cfg.block_size, cfg.max_num_batched_tokens, m.pool
        threshold = _threshold_in_force(Queues(m.waiting, m.running), cfg)  # type: ignore[arg-type]
        room_cap = cfg.max_model_len - cfg.rules.sampled_token_slot
        caching = cfg.prefix_caching
        known_of, comp, tables = m.known, m.comp, m.table
        plan: list = []
        for r in m.running:
            if budget <= 0:
                break
            c, known = comp[r], known_of[r]
            if c >= known:
                continue                        # its sampled token is in flight
            num_new = known - c
            if 0 < threshold < num_new:
                num_new = threshold
            num_new = max(0, min(num_new, budget, room_cap - c))
            if num_new == 0:
                continue
            if len(plan) == most:
                return None
            total = c + num_new
            table = tables[r]
            fresh: tuple[int, ...] = ()
            if total > len(table) * bs:
                num_fresh = -(-total // bs) - len(table)
                if num_fresh > blocks.num_free(pool):
                    return None
                pool, fresh = blocks.pop_fresh(pool, num_fresh)
            tried: list = []
            if caching and m.cached_of(r, pool) < total // bs:
                pool = self._cache_full_blocks(m, r, table, fresh, total // bs, pool, tried)
            plan.append((r, c, num_new, 0, total >= known, fresh, tried, False))
            budget -= num_new
        if m.waiting:
            pool = self._plan_waiting(m, plan, pool, budget, threshold, most)  # type: ignore[attr-defined]
            if pool is None:
                return None
        return plan, pool

    def _cache_full_blocks(self, m: Mirror, r: int, table: list, fresh: tuple, num_full: int,
                           pool: Any, tried: list) -> Any:
        """`_allocate`'s caching of the full blocks, on those not known cached
        (`tried` gets the (block, label) pairs it offered)."""
        start, q = m.cached_of(r, pool), m.record(r)
        whole = table + list(fresh) if fresh else table
        bs, n_slots, plen = self.cfg.block_size, m.num_slots, q.prompt_len  # type: ignore[attr-defined]
        for i in range(start, num_full):
            b = whole[i]
            if blocks.label_of(pool, b) is None:
                tried.append((b, q.prompt_labels[i] if (i + 1) * bs <= plen else -(1 + r + n_slots * i)))
        if tried:
            pool = blocks.cache_labels(pool, tuple(b for b, _ in tried), [label for _, label in tried],
                                       self.cfg.cache_duplicate_blocks)  # type: ignore[attr-defined]
        return pool

    def _blocks_match(self, plan: list, entries: list[dict[str, Any]]) -> bool:
        """replay.py's `_check_block_ids` on the planned blocks; False where it would fail."""
        if any("block_ids" not in x for x in entries):
            self.unchecked.add(BLOCK_IDS_UNCHECKED)  # type: ignore[attr-defined]
            return True
        try:
            for (_, _, _, _, _, new, _, _), x in zip(plan, entries):
                if new:
                    self._match_blocks(x["req"], list(x["block_ids"]), new)  # type: ignore[attr-defined]
                elif x["block_ids"]:
                    return False                # more blocks than the spec's: its message says so
        except _Violation:
            return False
        return True

    def _commit_schedule(self, m: Mirror, plan: list, pool: Any, event: dict[str, Any]) -> None:
        """The batch is the spec's: advance the mirror and the checker's records."""
        holders, output_labels = self.holders, self.output_labels  # type: ignore[attr-defined]
        batch = []
        for r, start, n, _, samples, new, tried, admitted in plan:
            if admitted:
                self._admit_on_mirror(m, r, start)  # type: ignore[attr-defined]
                m.cached[r] = start // self.cfg.block_size  # type: ignore[attr-defined]  # the hit: cached
            m.comp[r] = start + n
            table = m.table[r]
            if new:
                table.extend(new)
                holders.update(new)
            if tried:
                m.cached[r] = cached_prefix(pool, table, m.cached_of(r, pool))
                for b, label in tried:                  # the output labels it cached (incremental.py)
                    if label < 0 and blocks.label_of(pool, b) == label:
                        output_labels.setdefault(r, {})[b] = label
            batch.append((r, start, n, samples))
        m.pool = pool
        m.in_flight.append(batch)
        self.batch_ids.append(event.get("batch"))  # type: ignore[attr-defined]

    # -- complete ---------------------------------------------------------------

    def _fast_complete(self, event: dict[str, Any]) -> bool:
        """A completion whose every sampling entry returned one token; the
        requests it finishes are finished on the mirror. False: hand it over."""
        m = self._mirror
        assert m is not None
        if not m.in_flight:
            return False
        oldest = self.batch_ids[0]  # type: ignore[attr-defined]
        if event.get("batch") is not None and oldest is not None and event["batch"] != oldest:
            return False
        if len(m.in_flight) == 1 and (m.waiting or m.running):
            return False                        # the FIFO drains: L2 reads `schedule` there (the spec's)
        outcomes = self._outcomes(m, event.get("tokens", {}))
        if outcomes is None:
            return False
        m.in_flight.popleft()
        self.batch_ids.pop(0)  # type: ignore[attr-defined]
        finished = []
        for r, status in outcomes:
            m.known[r] += 1
            if status is not None:
                self._finish_on_mirror(m, r, status)
                finished.append(r)
        for r in finished:                      # as incremental.py and replay.py note them
            self.finished_slots[r] = None  # type: ignore[attr-defined]
        for r in sorted(finished, key=self.arrival_number.__getitem__):  # type: ignore[attr-defined]
            self.finished_now[r] = m.finished[r]  # type: ignore[attr-defined]
        return True

    def _outcomes(self, m: Mirror, tokens: dict[str, Any]) -> list[tuple[int, Status | None]] | None:
        """(request, the status its token finishes it with, or None) for each
        sampling entry of the oldest batch; None where the spec must judge."""
        names, stops, known, cap = self.names, self.stops, m.known, m.cap  # type: ignore[attr-defined]
        stops_first = self.cfg.rules.stop_tokens_before_length  # type: ignore[attr-defined]
        outcomes: list[tuple[int, Status | None]] = []
        for r, _, _, samples in m.in_flight[0]:
            returned = tokens.get(names[r])
            if not samples:
                if returned:
                    return None                     # a partial chunk's tokens: the spec says which property
                continue
            if not returned or len(returned) != 1:
                return None                         # no token, or drafts accepted (there are none)
            stop_ids, stops_known = stops[r]
            if stops_known:
                stop = returned[0] in stop_ids
            else:
                self.unchecked.add(STOPS_UNCHECKED)  # type: ignore[attr-defined]
                stop = getattr(self, "upcoming_finish", {}).get(names[r]) == "stop"
            # actions.py's _stop_reason after one appended token
            status = (Status.FINISHED_STOPPED if stop and stops_first else Status.FINISHED_LENGTH
                      if known[r] + 1 >= cap[r] else Status.FINISHED_STOPPED if stop else None)
            if status is not None and any(e[0] == r for batch in list(m.in_flight)[1:] for e in batch):
                return None                         # entries behind it to supersede: the spec's
            outcomes.append((r, status))
        return outcomes

    def _finish_on_mirror(self, m: Mirror, r: int, status: Status) -> None:
        """actions.py's `_finish` without a connector: the table freed in the
        profile's order, out of `running` (nothing of it left in flight)."""
        cfg = self.cfg  # type: ignore[attr-defined]
        table = m.table[r]
        m.pool = blocks.free_table(m.pool, tuple(table), cfg.release_order, cfg.rules.unhashed_blocks_to_head)
        self.holders.subtract(table)  # type: ignore[attr-defined]
        m.running.remove(r)
        m.finished[r] = status
        m.table[r], m.comp[r] = [], 0
        m.cached.pop(r, None)

    def _fast_finish(self, event: dict[str, Any]) -> bool:
        """The finish event of a request the mirror finished, with its reason."""
        r = self.slot.get(event["req"])  # type: ignore[attr-defined]
        finished_now = self.finished_now  # type: ignore[attr-defined]
        if r is None or finished_now.get(r) is not REASONS.get(event["reason"]):
            return False
        del finished_now[r]
        return True


def _static_domain(cfg: Any) -> bool:
    """Whether the profile and configuration are in the fast path's domain."""
    rules = cfg.rules
    return (cfg.kv_connector is None and cfg.num_spec_tokens == 0 and cfg.continue_prefill
            and not rules.stale_output_counters and not rules.output_placeholders and not cfg.stagger
            and cfg.num_preallocate_tokens == 0 and not cfg.fences_freed_blocks and not rules.empty_batches
            and not (rules.cache_aware_admission and cfg.prefix_caching and cfg.cache_aware_admission_window)
            and cfg.prefill_schedule_interval == 1                  # the prefill cadence (spec/cadence.py)
            # the waiting loop's rules fast_admission.py does not take (vLLM 0.33's)
            and not rules.full_sequence_admission and not rules.defer_resume_while_stale
            and not rules.pads_admitted_decodes
            and (cfg.enable_chunked_prefill or not rules.unchunked_prefill_stops_admission)
            # the priority policy's waiting order and victims (spec/priority.py) are the spec's
            and cfg.scheduling_policy == "fcfs"
            # a session's turn ends where a request would finish; its inputs are the spec's (`SendInput`)
            and not cfg.streaming_sessions)
