"""The properties the spec must satisfy: safety invariants S1-S12 (notes §5 as
restated in DESIGN.md), the liveness properties L1-L3 in a safety form a
solver can prove, deadlock freedom, transition properties, and "sometimes"
targets that make a spec that can do nothing fail loudly.

Each invariant is a predicate `(state, cfg) -> bool`; its docstring is its
one-line English statement. Transition properties take `(before, after, step)`
where `step` names the action. Liveness proper (every run ends with every
request finished) needs the whole state graph and lives in
`verification/explicit/search.py`; here it appears as the local facts it rests on.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

from .blocks import cdiv
from .config import Config
from .state import Fate, State, Status, content_label


def _active(s: State):
    return [(r, q) for r, q in enumerate(s.requests) if q.status.is_active]


def s1_counter_bounds(s: State, cfg: Config) -> bool:
    """0 <= num_computed <= known tokens + drafts, and 0 outside RUNNING."""
    for r, q in _active(s):
        if not 0 <= q.num_computed <= q.num_tokens + q.num_drafts:
            return False
        if q.status is not Status.RUNNING and q.num_computed != 0:
            return False
    return True


def s2_length_cap(s: State, cfg: Config) -> bool:
    """No request exceeds max_tokens or max_model_len; an unfinished one is below both; no batch reaches past max_model_len."""
    for q in s.requests:
        if q.num_output > max(q.max_tokens, 0) or q.num_tokens > cfg.max_model_len:
            return False
        if q.status.is_active and (q.num_output >= q.max_tokens or q.num_tokens >= cfg.max_model_len):
            return False
    return all(e.end <= cfg.max_model_len for b in s.in_flight for e in b)


def s3_contiguous_coverage(s: State, cfg: Config) -> bool:
    """A running request's live in-flight ranges, in FIFO order, are contiguous, non-empty and end at num_computed."""
    for r, q in _active(s):
        live = s.entries_of(r)
        if not live:
            continue
        if any(e.n < 1 for e in live) or any(a.end != b.start for a, b in zip(live, live[1:])):
            return False
        if live[-1].end != q.num_computed:
            return False
    return True


def s5_one_sample_per_prefill(s: State, cfg: Config) -> bool:
    """A live entry samples exactly when it reaches the request's known tokens, never past them; it holds more tokens than drafts, and drafts only ride on a sampling entry."""
    for b in s.in_flight:
        for e in b:
            if e.fate is not Fate.LIVE:
                continue
            reach = e.end - e.drafts
            T = s.requests[e.req].num_tokens
            if reach > T or e.n <= e.drafts or e.samples != (reach == T) or (e.drafts > 0 and not e.samples):
                return False
    return True


def s6_decode_gating(s: State, cfg: Config) -> bool:
    """A request has at most one live sampling entry in flight, and it is its last live entry."""
    for r, _ in _active(s):
        live = s.entries_of(r)
        if any(e.samples for e in live[:-1]):
            return False
    return True


def s7_output_binding(s: State, cfg: Config) -> bool:
    """Live entries belong to RUNNING requests, orphaned ones to PREEMPTED requests with no live entry; a batch holds a request once."""
    for b in s.in_flight:
        if len({e.req for e in b}) != len(b):
            return False
        for e in b:
            status = s.requests[e.req].status
            if e.fate is Fate.LIVE and status is not Status.RUNNING:
                return False
            if e.fate is Fate.ORPHANED and (status is not Status.PREEMPTED or s.entries_of(e.req)):
                return False
    return True


def s8_spec_accounting(s: State, cfg: Config) -> bool:
    """Drafts never exceed k, and once a running request has nothing in flight its rejected drafts are subtracted (num_computed < known tokens)."""
    for b in s.in_flight:
        if any(e.drafts > cfg.num_spec_tokens for e in b):
            return False
    for r, q in _active(s):
        if q.num_drafts > cfg.num_spec_tokens:
            return False
        if q.status is Status.RUNNING and not s.entries_of(r) and q.num_computed >= q.num_tokens:
            return False
    return True


def s9_kv_ownership(s: State, cfg: Config) -> bool:
    """Reference counts equal the tables holding a block; free queue and held blocks partition the pool; only RUNNING requests hold blocks, enough for num_computed, with correct cached content; a label is cached once, or (duplicate caching) its copies are recorded in caching order."""
    pool, bs = s.pool, cfg.block_size
    holders: Counter[int] = Counter()
    for r, q in enumerate(s.requests):
        if q.block_table and q.status is not Status.RUNNING:
            return False
        if len(set(q.block_table)) != len(q.block_table):
            return False
        holders.update(q.block_table)
        if q.status is Status.RUNNING and len(q.block_table) < cdiv(q.num_computed, bs):
            return False
        for i, b in enumerate(q.block_table):
            if pool.labels[b] is not None and pool.labels[b] != content_label(s, r, i, bs):
                return False
    if any(pool.ref_counts[b] != holders[b] for b in range(len(pool.ref_counts))):
        return False
    free = pool.free_queue
    if len(set(free)) != len(free) or set(free) != {b for b, c in enumerate(pool.ref_counts) if c == 0}:
        return False
    return _cached_copies_recorded(pool, cfg)


def _cached_copies_recorded(pool, cfg: Config) -> bool:
    """S9's caching clause. Without duplicate caching a label is cached once;
    with it (vLLM 0.8.x) a label may be cached by several blocks, and
    `duplicates` lists exactly those blocks, each once, grouped by label, so
    a hit knows which copy to serve."""
    copies = Counter(lab for lab in pool.labels if lab is not None)
    if not cfg.cache_duplicate_blocks:
        return all(c == 1 for c in copies.values()) and not pool.duplicates
    expected = {b for b, lab in enumerate(pool.labels) if lab is not None and copies[lab] >= 2}
    order = [pool.labels[b] for b in pool.duplicates]
    return (len(set(pool.duplicates)) == len(pool.duplicates) == len(expected)
            and set(pool.duplicates) == expected and order == sorted(order))  # type: ignore[type-var]


def s10_queues_and_budgets(s: State, cfg: Config) -> bool:
    """running = the RUNNING requests and waiting = the WAITING/PREEMPTED ones, without repeats; max_num_seqs, the token budget and the long-prefill threshold hold for every batch."""
    if len(set(s.running)) != len(s.running) or len(set(s.waiting)) != len(s.waiting):
        return False
    if set(s.running) != {r for r, q in enumerate(s.requests) if q.status is Status.RUNNING}:
        return False
    if set(s.waiting) != {r for r, q in enumerate(s.requests)
                          if q.status in (Status.WAITING, Status.PREEMPTED)}:
        return False
    if len(s.running) > cfg.max_num_seqs:
        return False
    threshold = cfg.long_prefill_token_threshold
    for b in s.in_flight:
        if sum(e.n for e in b) > cfg.max_num_batched_tokens:
            return False
        if threshold > 0 and any(e.n > threshold for e in b) and _threshold_binds(b, cfg):
            return False
    return True


def _threshold_binds(batch, cfg: Config) -> bool:
    """Whether the long-prefill threshold held when `batch` was scheduled, as
    far as the batch shows: always in 0.8.x; in 0.33 only with more than one
    request eligible (`Profile.threshold_needs_company`), which a batch of two
    entries proves and a batch of one cannot tell (check-trace compares that
    decision with the spec's schedule instead)."""
    return not cfg.rules.threshold_needs_company or len(batch) > 1


def s11_pipeline_depth(s: State, cfg: Config) -> bool:
    """At most K batches in flight, none empty; the in-flight set (one batch per request) is exactly the requests with a live entry."""
    if len(s.in_flight) > cfg.num_stages or any(len(b) == 0 for b in s.in_flight):
        return False
    with_live = {e.req for b in s.in_flight for e in b if e.fate is Fate.LIVE}
    if cfg.continue_prefill:
        return not s.scheduled_ids
    return s.scheduled_ids == with_live


def l1_running_request_unblocked(s: State, cfg: Config) -> bool:
    """L1 as safety: a RUNNING request with nothing to schedule has a live entry in flight whose output unblocks it."""
    for r, q in _active(s):
        if q.status is not Status.RUNNING:
            continue
        live = s.entries_of(r)
        if not cfg.continue_prefill and r in s.scheduled_ids:
            if not live:
                return False
        elif s.num_new_tokens(r) <= 0 and not (live and live[-1].samples):
            return False
    return True


def l2_no_deadlock(s: State, cfg: Config) -> bool:
    """L2 as safety: with nothing in flight and a request unfinished, schedule is enabled and forms a batch or preempts."""
    from .schedule import schedule
    if s.in_flight or not _active(s):
        return True
    return schedule(s, cfg) is not None


def l3_drain(s: State, cfg: Config) -> bool:
    """L3 as safety: the oldest in-flight batch can always be consumed (complete_oldest is enabled)."""
    from .actions import Sample, complete_oldest, sampling_entries
    if not s.in_flight:
        return True
    samples = tuple(Sample() for _ in sampling_entries(s, cfg))
    return complete_oldest(s, cfg, samples) is not None


@dataclass(frozen=True)
class Invariant:
    name: str
    predicate: Callable[[State, Config], bool]
    kind: str = "invariant"          # invariant | liveness (its safety form)

    @property
    def statement(self) -> str:
        return (self.predicate.__doc__ or "").strip()

    def holds(self, s: State, cfg: Config) -> bool:
        return self.predicate(s, cfg)


INVARIANTS: tuple[Invariant, ...] = (
    Invariant("S1_counter_bounds", s1_counter_bounds),
    Invariant("S2_length_cap", s2_length_cap),
    Invariant("S3_contiguous_coverage", s3_contiguous_coverage),
    Invariant("S5_one_sample_per_prefill", s5_one_sample_per_prefill),
    Invariant("S6_decode_gating", s6_decode_gating),
    Invariant("S7_output_binding", s7_output_binding),
    Invariant("S8_spec_accounting", s8_spec_accounting),
    Invariant("S9_kv_ownership", s9_kv_ownership),
    Invariant("S10_queues_and_budgets", s10_queues_and_budgets),
    Invariant("S11_pipeline_depth", s11_pipeline_depth),
    Invariant("L1_running_request_unblocked", l1_running_request_unblocked, "liveness"),
    Invariant("L2_no_deadlock", l2_no_deadlock, "liveness"),
    Invariant("L3_drain", l3_drain, "liveness"),
)


def violated(s: State, cfg: Config) -> list[Invariant]:
    return [inv for inv in INVARIANTS if not inv.holds(s, cfg)]
