"""The fast path's arrivals and waiting loop (fast.py): a request arriving
onto the mirror, and the spec's FCFS admission from the head of `waiting`,
for new requests (a preempted one resuming is the spec's).

An arrival is taken as replay.py's `_on_arrive`, incremental.py's slot
reuse and spec/actions.py's `arrive` take it: the id-reuse check, a slot
(an unused one, or the oldest finished slot with nothing in flight, reset
and its output labels evicted from the pool, every copy), the request's
name, prompt labels (the checker's own `_labels`) and stop tokens, and the
WAITING record at the tail of `waiting`. It is handed to the spec when the
spec's guards could refuse it (a prompt out of range, labels given in the
trace, prompt token ids that are not the prompt) or when no slot is free
(the streaming checker grows its slots there).

The waiting loop is spec/schedule.py's `_schedule_waiting` under the
profiles of fast.py's domain (no padding, no deferred resumption, no
whole-sequence gate, chunked prefill as vLLM 0.8.x does it): while budget
and seats remain, the head's prefix hit (`blocks.lookup_hit` on its prompt
labels), its tokens past the hit clipped by the threshold and the budget,
and an allocation of exactly `_allocate`'s blocks (`touch`, `pop_fresh`,
`cache_labels` on the full blocks); an allocation that cannot be made stops
the loop (head-of-line), as in the spec.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from flightcheck.spec import Status
from flightcheck.spec import blocks
from flightcheck.spec.state import Request, evolve

from .fast_mirror import Mirror


class Queues(NamedTuple):
    """What schedule.py's `_threshold_in_force` reads of a state: the queues' lengths."""

    waiting: list
    running: list
    kv_holding: tuple = ()


class FastAdmission:
    """A mixin of fast.py's FastPath: arrivals and the waiting loop on the mirror."""

    _mirror: Mirror | None

    def _fast_arrive(self, event: dict[str, Any]) -> bool:
        """An arrival onto the mirror (module docstring); False: hand it over."""
        m, cfg = self._mirror, self.cfg  # type: ignore[attr-defined]
        assert m is not None
        if not m.in_flight:
            return False                            # onto an idle engine: L2 reads `schedule` (the spec's)
        name, prompt_len, tokens = event["req"], event["prompt_len"], event.get("prompt_token_ids")
        old = self.slot.get(name)  # type: ignore[attr-defined]
        if old is not None and m.status(old).is_active:
            return False                            # an id reused while active: the spec's message
        if not 1 <= prompt_len < cfg.max_model_len or event["max_tokens"] < 1 or "prompt_block_labels" in event:
            return False
        if tokens is not None and len(tokens) != prompt_len:
            return False
        r = self._free_slot(m)
        if r is None:
            return False
        if r == self.next_unused:  # type: ignore[attr-defined]
            self.next_unused += 1  # type: ignore[attr-defined]
            self.names.append("")  # type: ignore[attr-defined]
        else:
            del self.finished_slots[r]  # type: ignore[attr-defined]
            self._reset_on_mirror(m, r)
        self.arrival_number[r] = self.num_arrivals  # type: ignore[attr-defined]
        self.num_arrivals += 1  # type: ignore[attr-defined]
        self.names[r] = name  # type: ignore[attr-defined]
        self.slot[name] = r  # type: ignore[attr-defined]
        labels = self._labels(event)  # type: ignore[attr-defined]
        stop_ids = set(event.get("stop_token_ids") or ())
        eos = event.get("eos_token_id", self.eos)  # type: ignore[attr-defined]
        if not event.get("ignore_eos", False) and eos is not None:
            stop_ids.add(eos)
        self.stops[r] = (stop_ids, eos is not None or bool(stop_ids))  # type: ignore[attr-defined]
        m.records[r] = evolve(Request(), status=Status.WAITING, prompt_len=prompt_len,
                              max_tokens=event["max_tokens"], prompt_labels=labels if cfg.prefix_caching else (),
                              num_computed=0)
        m.waiting.append(r)
        return True

    def _free_slot(self, m: Mirror) -> int | None:
        """incremental.py's `_reusable_slot`, without changing anything yet."""
        if self.next_unused < m.num_slots:  # type: ignore[attr-defined]
            return self.next_unused  # type: ignore[attr-defined]
        for r in self.finished_slots:  # type: ignore[attr-defined]
            if not any(e[0] == r for batch in m.in_flight for e in batch):
                return r
        return None

    def _reset_on_mirror(self, m: Mirror, r: int) -> None:
        """incremental.py's `_reset_slot` on the mirror."""
        old_name = self.names[r]  # type: ignore[attr-defined]
        if self.slot.get(old_name) == r:  # type: ignore[attr-defined]
            del self.slot[old_name]  # type: ignore[attr-defined]
            self.retired[old_name] = m.status(r)  # type: ignore[attr-defined]
        evicted = [block for block, label in self.output_labels.pop(r, {}).items()  # type: ignore[attr-defined]
                   if blocks.label_of(m.pool, block) == label]
        m.pool = blocks.uncache(m.pool, tuple(evicted))
        m.records[r] = Request()
        m.finished.pop(r, None)
        for counters in (m.known, m.comp, m.table, m.cap, m.cached):
            counters.pop(r, None)

    def _plan_waiting(self, m: Mirror, plan: list, pool: Any, budget: int, threshold: int,
                      most: int) -> Any:
        """schedule.py's waiting loop on the mirror, appending admissions to
        `plan`: the pool after it, or None where the spec must judge (a
        resumption, or more entries than the trace's batch)."""
        cfg = self.cfg  # type: ignore[attr-defined]
        bs, caching = cfg.block_size, cfg.prefix_caching
        seats = cfg.max_num_seqs - len(m.running)
        room_cap = cfg.max_model_len - cfg.rules.sampled_token_slot
        for r in m.waiting:
            if budget <= 0 or seats <= 0:
                break
            q = m.record(r)
            if q.status is not Status.WAITING or q.num_computed or q.block_table:
                return None                         # a resumption: the spec's
            num_tokens = q.num_tokens
            hit = blocks.lookup_hit(pool, list(q.prompt_labels[:num_tokens // bs]), (num_tokens - 1) // bs) \
                if caching else ()
            hit_tokens = len(hit) * bs
            num_new = num_tokens - hit_tokens
            if 0 < threshold < num_new:
                num_new = threshold
            num_new = max(0, min(num_new, budget, room_cap))
            total = hit_tokens + num_new
            num_fresh = max(0, -(-total // bs) - len(hit))
            if num_new == 0 or not blocks.can_allocate(pool, num_fresh, hit):
                break                               # FCFS: head-of-line blocks
            if len(plan) == most:
                return None
            pool = blocks.touch(pool, hit)
            pool, fresh = blocks.pop_fresh(pool, num_fresh)
            table = hit + fresh
            tried: list = []
            if caching:
                # the hit's blocks carry their labels; the fresh ones none (a pop evicts)
                for i in range(len(hit), total // bs):
                    tried.append((table[i], q.prompt_labels[i] if (i + 1) * bs <= q.prompt_len
                                  else -(1 + r + m.num_slots * i)))
                if tried:
                    pool = blocks.cache_labels(pool, tuple(b for b, _ in tried), [label for _, label in tried],
                                               cfg.cache_duplicate_blocks)
            plan.append((r, hit_tokens, num_new, hit_tokens, total >= num_tokens, table, tried, True))
            budget -= num_new
            seats -= 1
        return pool

    def _admit_on_mirror(self, m: Mirror, r: int, hit_tokens: int) -> None:
        """schedule.py's `_admit` for a new request: RUNNING, its hit computed."""
        m.waiting.remove(r)
        m.running.append(r)
        record = m.records[r] = evolve(m.record(r), status=Status.RUNNING, num_computed=hit_tokens)
        m.track(r, record)
