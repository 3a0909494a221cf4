"""spec/schedule.py in Z3: `schedule` as a deterministic function of a frame.

The concrete loops are unrolled into micro-steps, each a small function of
the previous one's auxiliary variables (`Builder.snap` names them):

* the running loop takes at most N micro-steps. Each one either skips
  running[i] (nothing to schedule), allocates for it (i += 1) or preempts the
  last running request (i stays). Both i and the number of preemptions only
  grow and i + preemptions < the initial len(running) while the loop runs,
  so N micro-steps always reach the loop's end;
* the waiting loop admits at most one request per micro-step and stops at the
  first that does not fit (FCFS), so N micro-steps suffice again;
* `_launch` then advances the counters and appends the batch.

Fates of in-flight entries change only for requests preempted or admitted in
this step, and nothing reads them before `_launch`, so the micro-steps record
per-request flags (`pre`, `admpre`) and `_launch` applies the fate changes
at once; that keeps the in-flight FIFO out of every micro-step.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Any

import z3
from flightcheck.verification.z3.encoding import blocks as zb, cadence as cad, drafts as zd, lora
from flightcheck.verification.z3.encoding import priority as prio, unwritten as unw
from flightcheck.verification.z3.encoding import structured_output as grammar
from flightcheck.verification.z3.encoding.drafts import PadContext, pad_context, padded, placeholder_drafts
from flightcheck.verification.z3.encoding.allocation import (
    Candidate,
    blocks_for,
    cache_full_blocks,
    candidate,
    concat,
    snapshot_entry,
    with_preallocation,
)
from flightcheck.verification.z3.encoding.kv_schedule import (
    LoopParts,
    kv_launch,
    kv_waiting_step,
    unfinished_or_held,
    victim_is_fenced,
)
from flightcheck.verification.z3.encoding.session_schedule import session_waiting_step
from flightcheck.verification.z3.encoding.sessions import session_launch
from flightcheck.verification.z3.encoding.reset_pause import has_requests, running_budget, waiting_gate
from flightcheck.verification.z3.encoding.requests import (
    async_at,
    at,
    counters_at,
    empty_table,
    label_at,
    put_flag,
    req_at,
    tokens_at,
    with_async,
    with_counters,
    with_req,
)
from flightcheck.verification.z3.encoding.requests import max_tokens as max_tokens_of
from flightcheck.verification.z3.encoding.requests import prompt_len as prompt_len_of
from flightcheck.verification.z3.encoding.state import (
    G_WAIT,
    LIVE,
    ORPHANED,
    PAD,
    PREEMPTED,
    RUNNING,
    SUPERSEDED,
    WAITING,
    Layout,
    SBatch,
    SEntry,
    SReq,
    SState,
    pad_entry,
)
from flightcheck.verification.z3.encoding.terms import (
    Builder,
    V,
    clone,
    conj,
    count,
    disj,
    div_const,
    eq,
    imax,
    imin,
    ite,
    le,
    lt,
    merge,
    neg,
    num,
    pick,
    put,
    sum_terms,
)


@dataclass
class BatchInProgress:
    """The batch under construction: spec.schedule._Step, plus loop control."""

    state: SState
    budget: Any
    count: Any                      # entries so far
    entries: list                   # E slots of SEntry
    preempted: list                 # Bool per request: preempted in this step
    admitted_from_preempted: list   # Bool per request: admitted while PREEMPTED
    admitted: list                  # Bool per request: admitted in this step
    any_preempted: Any
    position: Any                   # the running loop's position
    done: Any                       # the running loop returned / the waiting loop broke
    skipped: Any                    # the waiting loop's position: requests it passed over (vLLM 0.33's
                                    # deferred resumptions, `Profile.defer_resume_while_stale`); 0 in 0.8.x
    held_skipped: Any = 0           # with a KV connector, the requests of `kv_holding` passed over (kv_schedule.py)
    pending: Any = 0                # under the priority policy, a retry's num_new (priority.py)
    retried: Any = -1               # and its request


@dataclass
class SchedResult:
    """What one `schedule` call does from a frame (spec.schedule.Scheduled)."""

    state: SState              # the state after launch
    enabled: Any               # is_schedule_enabled
    nonempty: Any              # it scheduled or preempted something (else None)
    preempted: list
    admitted: list
    any_preempted: Any
    count: Any
    entries: list
    trail: list                # the batch under construction after each micro-step
    micro: list = field(default_factory=list)   # MicroStep per micro-step, in order
    launch_defs: list = field(default_factory=list)
    skipped: Any = None        # requests the waiting loop passed over (vLLM 0.33's deferred resumptions)

    @property
    def result(self) -> Any:
        """spec.schedule returns a Scheduled (not None)."""
        return conj(self.enabled, self.nonempty)


def is_enabled(layout: Layout, s: SState) -> Any:
    """Room in the pipeline, and (one-batch-per-request) vLLM 0.8.4's engine gate."""
    room = lt(s.num_batches, layout.K)
    if layout.is_mutant("schedule_blocked_when_idle"):
        room = conj(room, lt(0, s.num_batches))
    if layout.cfg.continue_prefill:
        return room
    return conj(room, s.waiting_len + s.running_len - count(s.scheduled) > 0)


def schedule(layout: Layout, builder: Builder, s: SState) -> SchedResult:
    """Form the next batch from s (spec.schedule.schedule)."""
    cfg = layout.cfg
    budget = running_budget(layout, s, V(cfg.max_num_batched_tokens))     # PAUSED_ALL: 0 (reset_pause.py)
    acc = BatchInProgress(_count_down(layout, clone(s)), budget, V(0), [pad_entry() for _ in range(layout.E)],
              [z3.BoolVal(False)] * layout.N, [z3.BoolVal(False)] * layout.N, [z3.BoolVal(False)] * layout.N,
              z3.BoolVal(False), V(0), z3.BoolVal(False), V(0))
    trail, micro = [acc], []
    threshold_on, defers = threshold_in_force(layout, s), cad.defers_prefills(layout, s)   # (cadence.py)

    def advance(acc: BatchInProgress, step, name: str) -> BatchInProgress:
        trail.append(after := builder.step(acc, step, name, micro))
        return after

    for m in range(prio.running_micro_steps(layout)):
        acc = advance(acc, lambda a: _running_step(layout, builder, a, threshold_on, defers), f"run{m}")
    phase = z3.BoolVal(True) if layout.is_mutant("admit_after_preemption") else neg(acc.any_preempted)
    phase = waiting_gate(layout, s, phase)      # paused: no admission (reset_pause.py)
    acc = BatchInProgress(acc.state, acc.budget, acc.count, acc.entries, acc.preempted, acc.admitted_from_preempted, acc.admitted, acc.any_preempted,
              acc.position, z3.BoolVal(False), V(0))
    pads = pad_context(layout, s, acc.count, acc.entries)
    waiting_step = functools.partial(_waiting_step, defers=defers)
    if s.kv or s.sess:      # the connector's path (kv_schedule.py) or sessions' (session_schedule.py)
        waiting_step = functools.partial(kv_waiting_step if s.kv else session_waiting_step,
                                         parts=LoopParts(BatchInProgress, _add, _clip, _is_resumption_deferred))
    for m in range(layout.N):
        acc = advance(acc, lambda a: waiting_step(layout, builder, a, phase, threshold_on, pads), f"wait{m}")
    first = len(builder.defs)
    state = builder.snap(cad.after_launch(layout, s, acc, _launch(layout, acc), defers), "launch")
    return SchedResult(state, is_enabled(layout, s), _forms_a_batch(layout, s, acc),
                       acc.preempted, acc.admitted, acc.any_preempted, acc.count, acc.entries, trail, micro,
                       builder.defs[first:], acc.skipped)


def _count_down(layout: Layout, s: SState) -> SState:
    """spec.schedule._count_down (async scheduling, vLLM 0.33 `current_step +=
    1`): every request's decode countdown one call nearer 0, floored at 0, at
    the start of every call that forms a batch, an empty one included (the
    call's result is its state after `_launch`, so the idle batch gets it too)."""
    if not s.asyncs or not layout.cfg.stagger:
        return s
    out = clone(s)
    for a in out.asyncs:
        a.countdown = ite(lt(0, a.countdown), a.countdown - 1, a.countdown)
    return out


def _held_back(layout: Layout, builder: Builder, st: SState, r: Any, q: Any) -> Any:
    """spec.schedule._is_held_back (async scheduling): the max_tokens guard
    (placeholders > 0 and num_computed + 2 - placeholders >= prompt +
    max_tokens), then the decode stagger (the countdown not yet 0). False
    without placeholders (sync profiles)."""
    if not st.asyncs:
        return z3.BoolVal(False)
    a = builder.snap(async_at(st, r), "ph")
    limit = at(layout, st, r, lambda q_, k: prompt_len_of(layout, q_, k) + max_tokens_of(layout, q_, k))
    guard = conj(lt(0, a.placeholders), q.num_computed + 2 - a.placeholders >= limit)
    return builder.let("held", disj(guard, lt(0, a.countdown)))


def _forms_a_batch(layout: Layout, s: SState, acc: BatchInProgress) -> Any:
    """spec.schedule returns a Scheduled: something scheduled or preempted, or
    (vLLM 0.33 `Profile.empty_batches`, spec.schedule._idle) an empty batch
    while some request is unfinished."""
    formed = disj(lt(0, acc.count), acc.any_preempted)
    if not layout.cfg.rules.empty_batches:
        return formed
    if s.rp:        # the pause's count of unfinished requests (reset_pause.py), a connector's held ones
        return disj(formed, has_requests(s))
    if s.kv:
        return disj(formed, *[unfinished_or_held(layout, s, r) for r in range(layout.N)])
    return disj(formed, *[_unfinished(q.status, bool(s.grammar)) for q in s.reqs])


def _unfinished(status: Any, grammar: bool = False) -> Any:
    """Arrived and not finished (spec Status.is_active; waiting for a grammar too with structured output)."""
    if grammar:
        return disj(eq(status, WAITING), eq(status, RUNNING), eq(status, PREEMPTED), eq(status, G_WAIT))
    return disj(eq(status, WAITING), eq(status, RUNNING), eq(status, PREEMPTED))


def threshold_in_force(layout: Layout, s: SState) -> Any:
    """spec.schedule._threshold_in_force: whether the long-prefill threshold
    applies in this call. vLLM 0.33 (`Profile.threshold_needs_company`) counts
    running + waiting once, at the start (`s` is the frame being scheduled),
    and drops the threshold for a lone request; 0.8.x always applies it."""
    if layout.cfg.long_prefill_token_threshold <= 0:
        return z3.BoolVal(False)
    if not layout.cfg.rules.threshold_needs_company:
        return z3.BoolVal(True)
    if s.sess:          # spec.schedule: waiting counts kv_holding too
        return lt(1, s.running_len + s.waiting_len + s.sess[0].holding_len)
    return lt(1, s.running_len + s.waiting_len)


def _clip(layout: Layout, budget: Any, num_computed: Any, num_new: Any, is_admission: bool,
          threshold_on: Any = True) -> Any:
    """spec.schedule._clip: the threshold (where `threshold_on`), the budget, and
    room below max_model_len less the sampled token's slot (vLLM 0.33
    `Profile.sampled_token_slot`; the spec applies one clip to both loops)."""
    cfg = layout.cfg
    threshold = cfg.long_prefill_token_threshold
    if threshold > 0 and not (is_admission and layout.is_mutant("threshold_ignored_on_admission")):
        num_new = ite(conj(threshold_on, lt(threshold, num_new)), V(threshold), num_new)
    if not (layout.is_mutant("budget_ignored") and not is_admission):
        num_new = imin(num_new, budget)
    return imax(V(0), imin(num_new, cfg.max_model_len - cfg.rules.sampled_token_slot - num_computed))


def _add(layout: Layout, acc: BatchInProgress, entry: SEntry, when: Any) -> tuple[list, Any, Any]:
    entries = [merge(conj(when, eq(acc.count, j)), entry, e) for j, e in enumerate(acc.entries)]
    budget = acc.budget if layout.is_mutant("budget_ignored") else ite(when, acc.budget - entry.n, acc.budget)
    return entries, ite(when, acc.count + 1, acc.count), budget


def _running_step(layout: Layout, builder: Builder, acc: BatchInProgress, threshold_on: Any, defers: Any) -> BatchInProgress:
    """One iteration of _schedule_running's loops (skip, allocate or preempt)."""
    cfg, st = layout.cfg, acc.state
    # (priority.py: a retry goes on with its request, wherever the position is)
    active = builder.let("active", prio.retry_or(layout, acc, conj(neg(acc.done), lt(acc.position, st.running_len),
                                                                   lt(0, acc.budget))))
    r = builder.let("r", prio.retry_or(layout, acc, pick(st.running, acc.position, V(PAD)), acc.retried))
    q = builder.snap(req_at(st, r), "q")
    c = candidate(st, r, q, builder.let("tokens", tokens_at(layout, st, r)))
    skip_sid = z3.BoolVal(False) if cfg.continue_prefill else pick(st.scheduled, r, z3.BoolVal(False))
    skip_sid = disj(skip_sid, _held_back(layout, builder, st, r, q), cad.skips_running(layout, st, r, defers))
    num_new0 = builder.let("num_new0", _clip(layout, acc.budget, q.num_computed,
                                         c.known + q.num_drafts - q.num_computed, False, threshold_on))
    zero = eq(num_new0, 0)
    anyway = z3.BoolVal(False)
    if layout.is_mutant("decode_while_token_in_flight"):
        anyway = conj(q.num_computed >= c.tokens, q.num_computed < cfg.max_model_len)
    skip = disj(skip_sid, conj(zero, neg(anyway)))
    num_new = prio.retried_num_new(layout, acc, builder.let("num_new", ite(zero, V(1), num_new0)))
    num_fresh = builder.let("num_fresh", imax(V(0), blocks_for(layout, q.num_computed + num_new) - q.table_len))
    fits = le(num_fresh, st.pool.free_len)
    do_skip = builder.let("skip", conj(active, skip))
    do_alloc = builder.let("alloc", conj(active, neg(skip), fits))
    do_pre = builder.let("preempt", conj(active, neg(skip), neg(fits)))
    a, entry = _allocate_running(layout, builder, c, num_new, num_fresh, acc.budget)
    entries, cnt, budget = _add(layout, acc, entry, do_alloc)
    tail, victim_index = prio.victim_to_tail(layout, builder, st, acc)    # FCFS: st, its last slot
    p, victim = _preempt_last(layout, builder, tail)
    p = prio.requeue(layout, st, p, victim)
    fenced = z3.BoolVal(False)
    if st.kv:       # under the step fence a victim with a batch in flight stops the loop instead
        fenced = builder.let("fenced", conj(do_pre, _victim_is_fenced(layout, st, victim)))
        do_pre = builder.let("preempt_unfenced", conj(do_pre, neg(fenced)))
    out = BatchInProgress(merge(do_alloc, a, merge(do_pre, p, st)), budget, cnt, entries,
              put_flag(acc.preempted, victim, z3.BoolVal(True), do_pre), acc.admitted_from_preempted, acc.admitted,
              disj(acc.any_preempted, do_pre), ite(disj(do_skip, do_alloc), acc.position + 1, acc.position),
              disj(acc.done, conj(do_pre, eq(victim, r)), fenced), acc.skipped)
    return prio.running_result(layout, builder, acc, out, dict(preempt=do_pre, victim=victim, index=victim_index,
                                                                 r=r, num_new=num_new, fenced=fenced))


def _victim_is_fenced(layout: Layout, st: SState, victim: Any) -> Any:
    """spec.schedule._victim_frees_at_once, negated (kv_schedule.py; False without a connector)."""
    if not st.kv:
        return z3.BoolVal(False)
    return victim_is_fenced(layout, st, victim)


def _allocate_running(layout: Layout, builder: Builder, c: Candidate, num_new: Any, num_fresh: Any,
                      budget: Any) -> tuple[SState, SEntry]:
    """The running loop's allocation: fresh blocks from the free queue's head,
    labels cached; the state after it and the entry it adds."""
    st, q, r = c.st, c.q, c.r
    total = q.num_computed + num_new
    num_popped = builder.let("num_popped", with_preallocation(layout, num_fresh, st.pool.free_len, q.table_len))
    pool, fresh = zb.pop_fresh(layout, st.pool, num_popped, layout.T)
    table, table_len = zb.append_blocks(layout, q.table, q.table_len, fresh, num_popped)
    pool = cache_full_blocks(layout, c, pool, table, table_len, total)
    entry, drafts = snapshot_entry(layout, c, q.num_computed, num_new, V(0), budget)
    a = clone(st)
    a.pool = pool
    return with_req(a, r, num_drafts=drafts, table_len=table_len, table=table), entry


def _preempt_last(layout: Layout, builder: Builder, st: SState) -> tuple[SState, Any]:
    """The running loop's preemption of the last running request: the state
    after it, and the victim."""
    cfg = layout.cfg
    victim = builder.let("victim", pick(st.running, st.running_len - 1, V(PAD)))
    v = builder.snap(req_at(st, victim), "v")
    p = clone(st)
    p.pool = zb.free_table(layout, st.pool, v.table, v.table_len)
    p.running = put(st.running, st.running_len - 1, V(PAD))
    p.running_len = st.running_len - 1
    p.waiting, p.waiting_len = [victim] + st.waiting[:-1], st.waiting_len + 1
    if not layout.is_mutant("inflight_set_not_cleared_on_preemption"):
        p.scheduled = put_flag(st.scheduled, victim, z3.BoolVal(False))
    keep = v.num_computed if layout.is_mutant("preempt_keeps_counter") else V(0)
    p = with_req(p, victim, status=V(PREEMPTED), num_computed=keep,
                 num_drafts=zd.drafts_after_preemption(layout, v.num_drafts), table_len=V(0),
                 table=empty_table(layout))
    if p.counters:
        # spec.schedule._mark_stale_output (vLLM 0.33 `_preempt_request`): the victim's
        # tokens in flight become its stale output; drop mode by the configuration,
        # or kept while an earlier drop share is undrained
        c = builder.snap(counters_at(st, victim), "vc")
        drops = cfg.stale_mode == "drop" or (p.kv and _requires_kv_delivery(cfg))
        drop = z3.BoolVal(True) if drops else conj(c.drop, lt(0, c.stale))
        p = with_counters(p, victim, stale=c.in_flight, drop=drop)
    # spec.schedule._reset_placeholders (vLLM 0.33 `_preempt_request`); the countdown is kept
    if layout.is_mutant("placeholders_kept_on_preemption_pr38624"):    # vLLM #38624 (mutants/reset_pause.py)
        return p, victim
    return with_async(p, victim, placeholders=V(0)), victim


def _requires_kv_delivery(cfg) -> bool:
    """spec.kv_fence.requires_kv_delivery: a producer's preemption drops its in-flight output."""
    return cfg.kv_connector.producer and cfg.rules.kv_producer_drops_stale_output


def _remove_at(layout: Layout, xs: list, i: Any) -> list:
    """xs without its slot i (a symbolic position), PAD-padded: the waiting
    queue once the request at the loop's position is admitted."""
    if num(i) == 0:
        return xs[1:] + [V(PAD)]
    return [ite(lt(j, i), xs[j], xs[j + 1] if j + 1 < len(xs) else V(PAD)) for j in range(len(xs))]


def _has_orphans(layout: Layout, st: SState, r: Any) -> Any:
    """Some entry of r in flight is ORPHANED (spec.schedule._is_resumption_deferred's
    test; the fates are the frame's while the waiting loop runs: it runs only
    when nothing was preempted, and `_launch` settles the fates afterwards)."""
    return disj(*[conj(lt(k, st.num_batches), lt(j, b.length), eq(e.req, r), eq(e.fate, ORPHANED))
                  for k, b in enumerate(st.batches) for j, e in enumerate(b.entries)])


def _waiting_step(layout: Layout, builder: Builder, acc: BatchInProgress, phase: Any,
                  threshold_on: Any = True, pads: PadContext | None = None, defers: Any = False) -> BatchInProgress:
    """One iteration of _schedule_waiting: admit the request at the loop's
    position, skip it (vLLM 0.33: a deferred resumption, which keeps its
    place), or break. In 0.8.x the position is always the head."""
    cfg, st, bs = layout.cfg, acc.state, layout.cfg.block_size
    seats = z3.BoolVal(True) if layout.is_mutant("max_num_seqs_ignored") else lt(st.running_len, cfg.max_num_seqs)
    active = builder.let("active", conj(phase, neg(acc.done), lt(acc.skipped, st.waiting_len), lt(0, acc.budget),
                                        seats))
    r = builder.let("r", pick(st.waiting, acc.skipped, V(PAD)))
    blocked = z3.BoolVal(False)
    if st.grammar:      # structured output: a request waiting for its grammar (structured_output.py)
        st, blocked = grammar.blocked_on_grammar(layout, st, r, active)
        blocked = builder.let("blocked", blocked)
    q = builder.snap(req_at(st, r), "q")
    deferred = disj(blocked, _is_resumption_deferred(layout, builder, st, r, q), lora.passed_over(layout, acc, r))
    c = candidate(st, r, q, builder.let("tokens", tokens_at(layout, st, r)))
    if cfg.prefix_caching:
        labels = [label_at(layout, st, r, i) for i in range(layout.T)]
        num_hit, hit = zb.lookup_hit(layout, builder, st.pool, labels, div_const(c.tokens, bs),
                                     lora.cache_read_limit(layout, st, r, div_const(c.tokens - 1, bs)))
        num_hit = builder.let("num_hit", num_hit)
    else:
        num_hit, hit = V(0), []
    hit_tokens = num_hit * bs
    pad, over = z3.BoolVal(False), z3.BoolVal(False)
    if pads is not None:
        # spec.drafts.padded_admission: 1 + k tokens, k placeholder drafts (held from here on)
        pad, over = (builder.let(name, x) for name, x in zip(("pad", "pad_over"),
                                                             padded(layout, pads, c.tokens, hit_tokens, acc.budget)))
        c = candidate(st, r, replace(q, num_drafts=ite(pad, V(cfg.num_spec_tokens), q.num_drafts)), c.tokens)
    wanted = ite(pad, V(1 + cfg.num_spec_tokens), c.tokens - hit_tokens) if pads is not None else c.tokens - hit_tokens
    num_new = builder.let("num_new", _clip(layout, acc.budget, q.num_computed, wanted, True, threshold_on))
    num_fresh = builder.let("num_fresh", imax(V(0), blocks_for(layout, q.num_computed + hit_tokens + num_new)
                                              - q.table_len - num_hit))
    fits = zb.can_allocate(st.pool, num_fresh, hit, num_hit)
    if cfg.rules.full_sequence_admission:
        # _fits_whole (vLLM 0.33 `allocate_slots(full_sequence_must_fit=True)`): blocks for the
        # whole current sequence, less the hit, fit among the free blocks not being hit
        whole = blocks_for(layout, imin(c.tokens, V(cfg.max_model_len)))
        fits = conj(zb.can_allocate(st.pool, imax(V(0), whole - num_hit), hit, num_hit), fits)
    skip = builder.let("defer", conj(active, deferred))
    held = disj(cad.stops_admission(layout, st, r, hit_tokens, defers), lora.stops_admission(layout, acc, r))
    ok = builder.let("admit", conj(active, neg(deferred), neg(over), neg(eq(num_new, 0)), fits, neg(held)))
    a, entry = _admit(layout, builder, c, _Hit(hit, num_hit), num_new, num_fresh, acc)
    entries, cnt, budget = _add(layout, acc, entry, ok)
    return BatchInProgress(merge(ok, a, cad.note_skipped(layout, st, r, skip)), budget, cnt, entries, acc.preempted,
               put_flag(acc.admitted_from_preempted, r, eq(q.status, PREEMPTED), ok),
               put_flag(acc.admitted, r, z3.BoolVal(True), ok), acc.any_preempted, acc.position,
               disj(acc.done, conj(active, neg(ok), neg(skip))), ite(skip, acc.skipped + 1, acc.skipped))


def _is_resumption_deferred(layout: Layout, builder: Builder, st: SState, r: Any, q: SReq) -> Any:
    """spec.schedule._is_resumption_deferred for the waiting loop's request
    (False without the profile's rule)."""
    rules = layout.cfg.rules
    if rules.defer_resume_while_stale and st.counters:
        # _is_resumption_deferred on vLLM 0.33's counters: stale output (the counter's
        # truthiness, or > 0 under the hardened variant's Profile.stale_test) in deliver mode
        c = counters_at(st, r)
        has_stale = lt(0, c.stale) if rules.stale_test == "positive" else neg(eq(c.stale, 0))
        return builder.let("deferred", conj(has_stale, neg(c.drop)))
    if rules.defer_resume_while_stale:
        # _is_resumption_deferred: PREEMPTED with orphaned entries in flight
        return builder.let("deferred", conj(eq(q.status, PREEMPTED), _has_orphans(layout, st, r)))
    return z3.BoolVal(False)


@dataclass(frozen=True)
class _Hit:
    """A prefix-cache hit: the blocks hit (T slots, PAD past `num_hit`) and how many."""

    blocks: list
    num_hit: Any


def _admit(layout: Layout, builder: Builder, c: Candidate, hit: _Hit, num_new: Any, num_fresh: Any,
           acc: BatchInProgress) -> tuple[SState, SEntry]:
    """The waiting loop's admission: the hit blocks touched, fresh blocks
    popped after them, labels cached, the request moved to running; the state
    after it and the entry it adds."""
    st, q, r, num_hit = c.st, c.q, c.r, hit.num_hit
    hit_tokens = num_hit * layout.cfg.block_size
    total = q.num_computed + hit_tokens + num_new
    pool = zb.touch(layout, builder, st.pool, hit.blocks, num_hit) if hit.blocks else st.pool
    num_popped = builder.let("num_popped", with_preallocation(layout, num_fresh, pool.free_len,
                                                               q.table_len + num_hit))
    pool, fresh = zb.pop_fresh(layout, pool, num_popped, layout.T)
    new_blocks = concat(layout, hit.blocks, num_hit, fresh, num_popped)
    table, table_len = zb.append_blocks(layout, q.table, q.table_len, new_blocks, num_hit + num_popped)
    pool = cache_full_blocks(layout, c, pool, table, table_len, total)
    entry, drafts = snapshot_entry(layout, c, hit_tokens, num_new, hit_tokens, acc.budget)
    a = clone(st)
    a.pool = pool
    a.waiting = _remove_at(layout, st.waiting, acc.skipped)
    a.waiting_len = st.waiting_len - 1
    a.running = put(st.running, st.running_len, r)
    a.running_len = st.running_len + 1
    a = with_req(a, r, status=V(RUNNING), num_computed=hit_tokens, num_drafts=drafts, table_len=table_len,
                 table=table)
    return a, entry


def _launch(layout: Layout, acc: BatchInProgress) -> SState:
    """Advance every scheduled request's counter, settle fates, put the batch in flight."""
    cfg, st = layout.cfg, clone(acc.state)
    new = acc.entries
    valid = [lt(j, acc.count) for j in range(layout.E)]
    for k, q in enumerate(st.reqs):
        mine = [conj(valid[j], eq(e.req, k)) for j, e in enumerate(new)]
        if not layout.is_mutant("advance_at_completion"):
            # An overlapping chunk (mutant) records one token more than it
            # advances: its end, start + n, is where the counter goes.
            advance = (lambda e: e.start + e.n - q.num_computed) if layout.is_mutant("overlapping_chunks") \
                else (lambda e: e.n)
            added = sum_terms([ite(c, advance(e), V(0)) for c, e in zip(mine, new)]) if new else 0
            q.num_computed = q.num_computed + added
        if not cfg.continue_prefill:
            st.scheduled[k] = disj(st.scheduled[k], *mine)
        if st.counters:
            # spec.schedule._count_in_flight (vLLM 0.33 `_update_after_schedule`)
            c = st.counters[k]
            added = sum_terms([ite(m, e.n, V(0)) for m, e in zip(mine, new)]) if new else 0
            c.in_flight = c.in_flight + added
        if st.asyncs:
            # spec.schedule._add_placeholders (`AsyncScheduler._update_after_schedule`): a
            # sampling entry adds 1 + its drafts and starts the stagger
            a, sampling = st.asyncs[k], [conj(m, e.samples) for m, e in zip(mine, new)]
            a.placeholders = a.placeholders + sum_terms([ite(c, 1 + e.drafts, V(0)) for c, e in zip(sampling, new)])
            a.countdown = ite(disj(*sampling), V(cfg.stagger), a.countdown)
            if placeholder_drafts(cfg) is not None:      # k placeholder drafts (spec.drafts)
                q.num_drafts = ite(disj(*sampling), V(cfg.num_spec_tokens), q.num_drafts)
    stale_to = LIVE if layout.is_mutant("stale_output_applied_to_resumed") else SUPERSEDED
    for b in st.batches:
        for e in b.entries:
            pre = pick(acc.preempted, e.req, z3.BoolVal(False))
            fate = ite(conj(eq(e.fate, LIVE), pre), V(ORPHANED), e.fate)
            if not layout.is_mutant("orphan_kept_after_reschedule"):
                admpre = pick(acc.admitted_from_preempted, e.req, z3.BoolVal(False))
                fate = ite(conj(eq(fate, ORPHANED), admpre), V(stale_to), fate)
            e.fate = fate
            if layout.is_mutant("preemption_clears_inflight_drafts"):
                e.drafts = ite(pre, V(0), e.drafts)
            if layout.is_mutant("shared_snapshot"):
                for j, n in enumerate(new):
                    alias = conj(valid[j], eq(n.req, e.req), eq(e.fate, LIVE))
                    e.start, e.n = ite(alias, n.start, e.start), ite(alias, n.n, e.n)
                    e.samples, e.drafts = ite(alias, n.samples, e.samples), ite(alias, n.drafts, e.drafts)
    # vLLM 0.33 queues every step's batch, empty ones included (the mutant: only
    # reached when something was scheduled or preempted)
    put_batch = z3.BoolVal(True) if cfg.rules.empty_batches or layout.is_mutant("empty_batch_submitted") \
        else lt(0, acc.count)
    batch = SBatch(acc.count, [SEntry(e.req, e.start, e.n, e.samples, e.drafts, e.fate) for e in new])
    if st.kv:
        st = kv_launch(layout, st, acc, put_batch)
    if st.grammar:      # each entry's bitmask position (structured_output.py)
        st = grammar.launch_masks(layout, st, acc, put_batch)
    st = unw.forget_written(layout, session_launch(layout, st, acc, put_batch), acc)     # KV8's history
    st.batches = [merge(conj(put_batch, eq(st.num_batches, k)), batch, b) for k, b in enumerate(st.batches)]
    st.num_batches = ite(put_batch, st.num_batches + 1, st.num_batches)
    return st
