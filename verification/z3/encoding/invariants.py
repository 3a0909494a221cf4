"""spec/invariants.py, spec/transitions.py and spec/sometimes.py in Z3.

Every predicate of the spec's INVARIANTS, TRANSITION_PROPERTIES and SOMETIMES
has a formula here of the same name, written clause for clause after the
Python one, over a frame (and, where the predicate calls `schedule`, the
frame's schedule function). `tests/test_z3_invariants.py` checks that each
formula and its predicate agree on sampled states, inside and outside the
invariants.

The formulas assume the frame is well formed (`well_formed`: every code,
index and length in range, padding canonical), which every frame the
transition relation reaches from the initial state is; a few clauses restate
range facts where the Python predicate compares sets, so that the formula
and the predicate agree on every state `decode` can produce.
"""

from __future__ import annotations

from typing import Any, Callable

import z3
from flightcheck.spec import CompleteOldest, Config, State
from flightcheck.spec.schedule import _is_resumption_deferred, is_schedule_enabled
from flightcheck.spec.schedule import schedule as spec_schedule
from flightcheck.spec.sometimes import Sometimes
from flightcheck.verification.z3.encoding.actions import (
    ARRIVE,
    COMPLETE,
    SCHEDULE,
    complete_guard,
    is_active,
)
from flightcheck.verification.z3.encoding.requests import (
    at,
    content_label,
    max_tokens,
    num_tokens,
)
from flightcheck.verification.z3.encoding.schedule import SchedResult
from flightcheck.verification.z3.encoding.state import (
    F_ABORTED,
    F_LENGTH,
    F_STOPPED,
    FATE,
    LIVE,
    NEW,
    ORPHANED,
    PAD,
    PREEMPTED,
    RUNNING,
    STATUS,
    SUPERSEDED,
    WAITING,
    Layout,
    SState,
)
from flightcheck.verification.z3.encoding.terms import (
    V,
    conj,
    count,
    disj,
    div_const,
    eq,
    imax,
    ite,
    le,
    lt,
    member,
    neg,
    pick,
    sum_terms,
)

Formula = Callable[[Layout, SState, SchedResult], Any]


def positions(layout: Layout, s: SState) -> list[tuple[Any, Any]]:
    """Every in-flight entry slot in FIFO order: (entry, slot in use)."""
    return [(e, conj(lt(k, s.num_batches), lt(j, b.length)))
            for k, b in enumerate(s.batches) for j, e in enumerate(b.entries)]


def live(e, used: Any, r: int) -> Any:
    return conj(used, eq(e.req, r), eq(e.fate, LIVE))


def has_live(layout: Layout, s: SState, r: int) -> Any:
    return disj(*[live(e, u, r) for e, u in positions(layout, s)])


def last_live(layout: Layout, s: SState, r: int, field: str, default: Any) -> Any:
    """A field of r's last live entry in flight (`default` without one)."""
    out = default
    for e, u in positions(layout, s):
        out = ite(live(e, u, r), getattr(e, field), out)
    return out


def last_live_samples(layout: Layout, s: SState, r: int) -> Any:
    """r's last live entry samples (False without one)."""
    return last_live(layout, s, r, "samples", z3.BoolVal(False))


def _active(s: SState, r: int) -> Any:
    return is_active(s.reqs[r].status)


def _placeholders(s: SState, r: int) -> Any:
    """r's output placeholders (0 in a frame without them: sync profiles)."""
    return s.asyncs[r].placeholders if s.asyncs else V(0)


def s1_counter_bounds(layout: Layout, s: SState, sch: SchedResult) -> Any:
    out = []
    for r, q in enumerate(s.reqs):
        known = num_tokens(layout, q, r) + _placeholders(s, r) if s.asyncs else num_tokens(layout, q, r)
        ok = conj(le(0, q.num_computed), le(q.num_computed, known + q.num_drafts),
                  disj(eq(q.status, RUNNING), eq(q.num_computed, 0)))
        out.append(z3.Implies(_active(s, r), ok))
    return conj(out)


def s2_length_cap(layout: Layout, s: SState, sch: SchedResult) -> Any:
    L, out = layout.cfg.max_model_len, []
    for r, q in enumerate(s.reqs):
        cap, tokens = max_tokens(layout, q, r), num_tokens(layout, q, r)
        out.append(conj(le(q.num_output, imax(cap, V(0))), le(tokens, L)))
        out.append(z3.Implies(_active(s, r), conj(lt(q.num_output, cap), lt(tokens, L))))
    out += [z3.Implies(u, le(e.start + e.n, L)) for e, u in positions(layout, s)]
    return conj(out)


def s3_contiguous_coverage(layout: Layout, s: SState, sch: SchedResult) -> Any:
    out = []
    for r, q in enumerate(s.reqs):
        seen, end, ok = z3.BoolVal(False), V(0), []
        for e, u in positions(layout, s):
            here = live(e, u, r)
            ok += [z3.Implies(here, le(1, e.n)), z3.Implies(conj(here, seen), eq(e.start, end))]
            end, seen = ite(here, e.start + e.n, end), disj(seen, here)
        ok.append(z3.Implies(seen, eq(end, q.num_computed)))
        out.append(z3.Implies(_active(s, r), conj(ok)))
    return conj(out)


def s5_one_sample_per_prefill(layout: Layout, s: SState, sch: SchedResult) -> Any:
    out = []
    for e, u in positions(layout, s):
        reach = e.start + e.n - e.drafts
        tokens = at(layout, s, e.req, lambda q, k: num_tokens(layout, q, k))
        ok = conj(le(reach, tokens), lt(e.drafts, e.n), e.samples == (reach == tokens),
                  z3.Implies(lt(0, e.drafts), e.samples))
        out.append(z3.Implies(conj(u, eq(e.fate, LIVE)), ok))
    return conj(out)


def s6_decode_gating(layout: Layout, s: SState, sch: SchedResult) -> Any:
    out, pos = [], positions(layout, s)
    for r in range(layout.N):
        for i, (e, u) in enumerate(pos):
            later = disj(*[live(f, v, r) for f, v in pos[i + 1:]])
            out.append(z3.Implies(conj(_active(s, r), live(e, u, r), e.samples), neg(later)))
    return conj(out)


def s7_output_binding(layout: Layout, s: SState, sch: SchedResult) -> Any:
    out = []
    lives = [has_live(layout, s, r) for r in range(layout.N)]
    for k, b in enumerate(s.batches):
        for j, e in enumerate(b.entries):
            u = conj(lt(k, s.num_batches), lt(j, b.length))
            for j2 in range(j + 1, layout.E):
                out.append(z3.Implies(conj(u, lt(j2, b.length)), neg(eq(e.req, b.entries[j2].req))))
            status = at(layout, s, e.req, lambda q, _k: q.status)
            out.append(z3.Implies(conj(u, eq(e.fate, LIVE)), eq(status, RUNNING)))
            out.append(z3.Implies(conj(u, eq(e.fate, ORPHANED)),
                                  conj(eq(status, PREEMPTED), neg(pick(lives, e.req, z3.BoolVal(False))))))
    return conj(out)


def s8_spec_accounting(layout: Layout, s: SState, sch: SchedResult) -> Any:
    k = layout.cfg.num_spec_tokens
    out = [z3.Implies(u, le(e.drafts, k)) for e, u in positions(layout, s)]
    for r, q in enumerate(s.reqs):
        stuck = conj(eq(q.status, RUNNING), neg(has_live(layout, s, r)), q.num_computed >= num_tokens(layout, q, r))
        out.append(z3.Implies(_active(s, r), conj(le(q.num_drafts, k), neg(stuck))))
    return conj(out)


def s9_parts(layout: Layout, s: SState) -> dict[str, Any]:
    """S9 clause by clause, named (the micro-step proofs track each apart)."""
    bs, pool, out = layout.cfg.block_size, s.pool, {}
    for r, q in enumerate(s.reqs):
        used = [lt(t, q.table_len) for t in range(layout.T)]
        out[f"r{r}.held_only_when_running"] = z3.Implies(lt(0, q.table_len), eq(q.status, RUNNING))
        out[f"r{r}.distinct_blocks"] = conj([z3.Implies(conj(used[t], used[t2]), neg(eq(q.table[t], q.table[t2])))
                                             for t in range(layout.T) for t2 in range(t + 1, layout.T)])
        out[f"r{r}.covers_counter"] = z3.Implies(eq(q.status, RUNNING),
                                                 le(div_const(q.num_computed + (bs - 1), bs), q.table_len))
        for t in range(layout.T):
            lab = pick(pool.label, q.table[t], V(layout.none_label))
            out[f"r{r}.t{t}.cached_content"] = z3.Implies(
                used[t], disj(eq(lab, layout.none_label), eq(lab, content_label(layout, q, r, t))))
    for b in range(layout.B):
        holders = count(conj(lt(t, q.table_len), eq(q.table[t], b)) for q in s.reqs for t in range(layout.T))
        out[f"b{b}.ref_is_holders"] = eq(pool.ref[b], holders)
        out[f"b{b}.free_iff_unheld"] = eq(pool.ref[b], 0) == member(b, pool.free, pool.free_len)
    for j in range(layout.B):
        out[f"free[{j}].a_block"] = conj(
            z3.Implies(lt(j, pool.free_len), conj(le(0, pool.free[j]), lt(pool.free[j], layout.B))),
            *[z3.Implies(conj(lt(j, pool.free_len), lt(j2, pool.free_len)), neg(eq(pool.free[j], pool.free[j2])))
              for j2 in range(j + 1, layout.B)])
    if not layout.cfg.cache_duplicate_blocks:
        for b in range(layout.B):
            out[f"b{b}.label_unique"] = conj([z3.Implies(neg(eq(pool.label[b], layout.none_label)),
                                                         neg(eq(pool.label[b], pool.label[b2])))
                                              for b2 in range(b + 1, layout.B)])
        out["copy_ranks_zero"] = conj([eq(x, 0) for x in pool.copy_rank])
        return out
    # duplicate caching: the copies of a label carry the ranks 0 .. copies - 1,
    # each once (so exactly one copy, of rank 0, serves hits); an unlabelled
    # block has rank 0
    for b in range(layout.B):
        lab, rank = pool.label[b], pool.copy_rank[b]
        copies = count(eq(lab, other) for other in pool.label)
        distinct = [z3.Implies(eq(lab, pool.label[b2]), neg(eq(rank, pool.copy_rank[b2])))
                    for b2 in range(b + 1, layout.B)]
        out[f"b{b}.copy_rank"] = ite(eq(lab, layout.none_label), eq(rank, 0),
                                     conj(le(0, rank), lt(rank, copies), *distinct))
    return out


def s9_kv_ownership(layout: Layout, s: SState, sch: SchedResult) -> Any:
    return conj(list(s9_parts(layout, s).values()))


def _queue_is(layout: Layout, xs: list, length: Any, members: list) -> Any:
    out = []
    for j in range(layout.N):
        out.append(z3.Implies(lt(j, length), conj(le(0, xs[j]), lt(xs[j], layout.N))))
        out += [z3.Implies(conj(lt(j, length), lt(j2, length)), neg(eq(xs[j], xs[j2])))
                for j2 in range(j + 1, layout.N)]
    out += [m == member(r, xs, length) for r, m in enumerate(members)]
    return conj(out)


def s10_queues_and_budgets(layout: Layout, s: SState, sch: SchedResult) -> Any:
    cfg = layout.cfg
    out = [_queue_is(layout, s.running, s.running_len, [eq(q.status, RUNNING) for q in s.reqs]),
           _queue_is(layout, s.waiting, s.waiting_len,
                     [disj(eq(q.status, WAITING), eq(q.status, PREEMPTED)) for q in s.reqs]),
           le(s.running_len, cfg.max_num_seqs)]
    for k, b in enumerate(s.batches):
        used = [lt(j, b.length) for j in range(layout.E)]
        total = sum_terms([ite(u, e.n, V(0)) for u, e in zip(used, b.entries)])
        ok = [le(total, cfg.max_num_batched_tokens)]
        if cfg.long_prefill_token_threshold > 0:
            # spec.invariants._threshold_binds: under vLLM 0.33 (`Profile.threshold_needs_company`)
            # only a batch of two entries or more shows that the threshold was in force
            binds = lt(1, b.length) if cfg.rules.threshold_needs_company else z3.BoolVal(True)
            ok += [z3.Implies(conj(u, binds), le(e.n, cfg.long_prefill_token_threshold))
                   for u, e in zip(used, b.entries)]
        out.append(z3.Implies(lt(k, s.num_batches), conj(ok)))
    return conj(out)


def s11_pipeline_depth(layout: Layout, s: SState, sch: SchedResult) -> Any:
    out = [le(s.num_batches, layout.K)]
    if not layout.cfg.rules.empty_batches:     # S11': vLLM 0.33's empty batches take a queue slot
        out += [z3.Implies(lt(k, s.num_batches), le(1, b.length)) for k, b in enumerate(s.batches)]
    if layout.cfg.continue_prefill:
        out += [neg(x) for x in s.scheduled]
    else:
        out += [x == has_live(layout, s, r) for r, x in enumerate(s.scheduled)]
    return conj(out)


def l1_running_request_unblocked(layout: Layout, s: SState, sch: SchedResult) -> Any:
    out = []
    for r, q in enumerate(s.reqs):
        lv = has_live(layout, s, r)
        nnt = num_tokens(layout, q, r) + q.num_drafts - q.num_computed
        if s.asyncs:                      # State.num_new_tokens counts the placeholders
            nnt = nnt + _placeholders(s, r)
        normal = z3.Implies(le(nnt, 0), conj(lv, last_live_samples(layout, s, r)))
        ok = normal if layout.cfg.continue_prefill else ite(s.scheduled[r], lv, normal)
        out.append(z3.Implies(eq(q.status, RUNNING), ok))
    return conj(out)


def l2_no_deadlock(layout: Layout, s: SState, sch: SchedResult) -> Any:
    unfinished = disj(*[_active(s, r) for r in range(layout.N)])
    if not layout.cfg.rules.empty_batches:
        return z3.Implies(conj(eq(s.num_batches, 0), unfinished), sch.result)
    # vLLM 0.33: only empty batches in flight (they change nothing when they
    # complete); the state they drain to forms a batch or preempts. Its
    # schedule is s's own, which reads no batch but through its entries and
    # the queue's room: enabled once drained, so the entries formed decide.
    drained = conj(*[z3.Implies(lt(k, s.num_batches), eq(b.length, 0)) for k, b in enumerate(s.batches)])
    forms = disj(lt(0, sch.count), sch.any_preempted)
    if not layout.cfg.continue_prefill:      # is_schedule_enabled's gate, once drained
        forms = conj(s.waiting_len + s.running_len - count(s.scheduled) > 0, forms)
    return z3.Implies(conj(drained, unfinished), forms)


def l3_drain(layout: Layout, s: SState, sch: SchedResult) -> Any:
    """With a batch in flight, complete_oldest is enabled. (The all-default
    Sample is valid for every entry, so the guard is the whole question; in
    the correct spec it is just "a batch in flight", and L3 is structurally
    true: only a mutant that adds to the guard can break it.)"""
    return z3.Implies(lt(0, s.num_batches), complete_guard(layout, s))


INVARIANT_FORMULAS: dict[str, Formula] = {
    "S1_counter_bounds": s1_counter_bounds,
    "S2_length_cap": s2_length_cap,
    "S3_contiguous_coverage": s3_contiguous_coverage,
    "S5_one_sample_per_prefill": s5_one_sample_per_prefill,
    "S6_decode_gating": s6_decode_gating,
    "S7_output_binding": s7_output_binding,
    "S8_spec_accounting": s8_spec_accounting,
    "S9_kv_ownership": s9_kv_ownership,
    "S10_queues_and_budgets": s10_queues_and_budgets,
    "S11_pipeline_depth": s11_pipeline_depth,
    "L1_running_request_unblocked": l1_running_request_unblocked,
    "L2_no_deadlock": l2_no_deadlock,
    "L3_drain": l3_drain,
}

NEEDS_SCHEDULE = frozenset({"L2_no_deadlock"})


# --- vLLM 0.33's counters (spec.invariants.COUNTER_INVARIANTS) -------------------

def _tokens_in_flight(layout: Layout, s: SState, r: int, fates: tuple[int, ...] | None = None) -> Any:
    """The tokens of r's entries in flight (of those `fates` only, if given)."""
    terms = []
    for e, used in positions(layout, s):
        mine = conj(used, eq(e.req, r))
        if fates is not None:
            mine = conj(mine, disj(*[eq(e.fate, f) for f in fates]))
        terms.append(ite(mine, e.n, V(0)))
    return sum_terms(terms)


def if0_in_flight_never_negative(layout: Layout, s: SState, sch: SchedResult) -> Any:
    return conj([z3.Implies(_active(s, r), le(0, c.in_flight)) for r, c in enumerate(s.counters)])


def if1_in_flight_counter(layout: Layout, s: SState, sch: SchedResult) -> Any:
    return conj([z3.Implies(_active(s, r), eq(c.in_flight, _tokens_in_flight(layout, s, r)))
                 for r, c in enumerate(s.counters)])


def if2_stale_counter(layout: Layout, s: SState, sch: SchedResult) -> Any:
    out = []
    for r, c in enumerate(s.counters):
        ok = conj(le(0, c.stale), le(c.stale, c.in_flight),
                  eq(c.stale, _tokens_in_flight(layout, s, r, (ORPHANED, SUPERSEDED))))
        out.append(z3.Implies(_active(s, r), ok))
    return conj(out)


def if3_no_stale_resumption(layout: Layout, s: SState, sch: SchedResult) -> Any:
    return conj([z3.Implies(eq(q.status, RUNNING), disj(eq(c.stale, 0), c.drop))
                 for q, c in zip(s.reqs, s.counters)])


# The profiles with stale-output counters add these (spec.invariants.invariants_for).
COUNTER_FORMULAS: dict[str, Formula] = {
    "IF1_in_flight_counter": if1_in_flight_counter,
    "IF2_stale_counter": if2_stale_counter,
    "IF3_no_stale_resumption": if3_no_stale_resumption,
    "IF0_in_flight_never_negative": if0_in_flight_never_negative,
}

# --- asynchronous scheduling (spec.invariants.ASYNC_REPLACEMENTS, ASYNC_INVARIANTS) --

def _live_entries(layout: Layout, s: SState, r: int) -> list[tuple[int, Any, Any]]:
    """(batch index, entry, is a live entry of r) over every slot in FIFO order."""
    return [(k, e, conj(lt(k, s.num_batches), lt(j, b.length), eq(e.req, r), eq(e.fate, LIVE)))
            for k, b in enumerate(s.batches) for j, e in enumerate(b.entries)]


def s3a_async_coverage(layout: Layout, s: SState, sch: SchedResult) -> Any:
    """spec.invariants.s3_async_request: without spec decode the sync S3."""
    if layout.cfg.num_spec_tokens == 0:
        return s3_contiguous_coverage(layout, s, sch)
    out = []
    for r, q in enumerate(s.reqs):
        seen, end, samples, ok = z3.BoolVal(False), V(0), z3.BoolVal(False), []
        for _, e, here in _live_entries(layout, s, r):
            ok += [z3.Implies(here, le(1, e.n)),
                   z3.Implies(conj(here, seen), conj(le(e.start, end), disj(samples, eq(e.start, end))))]
            end, samples, seen = ite(here, e.start + e.n, end), ite(here, e.samples, samples), disj(seen, here)
        ok.append(z3.Implies(seen, disj(eq(end, q.num_computed), conj(samples, lt(q.num_computed, end)))))
        out.append(z3.Implies(_active(s, r), conj(ok)))
    return conj(out)


def s5a_async_sampling(layout: Layout, s: SState, sch: SchedResult) -> Any:
    """spec.invariants.s5_async_request, entry by entry with the placeholders
    of the older live sampling entries (`ahead`) carried along."""
    out = []
    for r, q in enumerate(s.reqs):
        tokens, ahead = num_tokens(layout, q, r), V(0)
        for _, e, here in _live_entries(layout, s, r):
            reach = e.start + e.n - e.drafts
            ok = [lt(e.drafts, e.n), z3.Implies(lt(0, e.drafts), e.samples),
                  z3.Implies(neg(e.samples), conj(eq(ahead, 0), lt(reach, tokens)))]
            if layout.cfg.num_spec_tokens == 0:
                ok += [le(reach, tokens + ahead), e.samples == eq(reach, tokens + ahead)]
            out.append(z3.Implies(here, conj(ok)))
            ahead = ite(conj(here, e.samples), ahead + 1 + e.drafts, ahead)
    return conj(out)


def s6p_async_decode_gating(layout: Layout, s: SState, sch: SchedResult) -> Any:
    """spec.invariants.s6_async_request: at most ceil(D / stagger) live
    sampling entries of a request in flight, any two `stagger` batches apart,
    and the countdown the stagger less the batches since its latest sampling
    entry (of any fate)."""
    stagger, depth = layout.cfg.stagger, layout.cfg.queue_depth
    cap = -(-depth // stagger) if stagger else depth
    out = []
    for r in range(layout.N):
        slots = _live_entries(layout, s, r)
        sampling = [(k, conj(here, e.samples)) for k, e, here in slots]
        ok = [le(count(x for _, x in sampling), cap)]
        ok += [neg(conj(x, y))        # two sampling entries fewer than `stagger` batches apart
               for i, (k1, x) in enumerate(sampling) for k2, y in sampling[i + 1:] if k2 - k1 < stagger]
        if stagger:
            latest, any_sampling = V(-1), z3.BoolVal(False)
            for k, b in enumerate(s.batches):
                for j, e in enumerate(b.entries):
                    mine = conj(lt(k, s.num_batches), lt(j, b.length), eq(e.req, r), e.samples)
                    latest, any_sampling = ite(mine, V(k), latest), disj(any_sampling, mine)
            want = imax(V(0), stagger - (s.num_batches - 1 - latest))
            ok.append(z3.Implies(any_sampling, eq(s.asyncs[r].countdown, want)))
        out.append(z3.Implies(_active(s, r), conj(ok)))
    return conj(out)


def ia1_placeholders(layout: Layout, s: SState, sch: SchedResult) -> Any:
    out = []
    for r, q in enumerate(s.reqs):
        ph = s.asyncs[r].placeholders
        total = sum_terms([ite(conj(here, e.samples), 1 + e.drafts, V(0)) for _, e, here in _live_entries(layout, s, r)])
        out.append(conj(eq(ph, total),
                        ite(eq(q.status, RUNNING), disj(eq(ph, 0), eq(q.num_computed, num_tokens(layout, q, r) + ph - 1)),
                            eq(ph, 0))))
    return conj(out)


def ia2_placeholders_within_max_tokens(layout: Layout, s: SState, sch: SchedResult) -> Any:
    out = []
    for r, q in enumerate(s.reqs):
        sampling = count(conj(here, e.samples) for _, e, here in _live_entries(layout, s, r))
        out.append(z3.Implies(_active(s, r), le(q.num_output + sampling, max_tokens(layout, q, r))))
    return conj(out)


# Under async scheduling these replace the sync formulas of the same letter
# (spec.invariants.ASYNC_REPLACEMENTS), and IA1, IA2 join. L2 under async
# (schedule within stagger + 1 calls) is not encoded: it needs schedule() of
# the frame with its countdowns run down, a second schedule per frame; the
# exhaustive search proves it on the profile's models.
ASYNC_REPLACEMENT_FORMULAS: dict[str, tuple[str, Formula] | None] = {
    "S3_contiguous_coverage": ("S3a_async_coverage", s3a_async_coverage),
    "S5_one_sample_per_prefill": ("S5a_async_sampling", s5a_async_sampling),
    "S6_decode_gating": ("S6p_async_decode_gating", s6p_async_decode_gating),
    "L2_no_deadlock": None,
}
ASYNC_FORMULAS: dict[str, Formula] = {
    "IA1_placeholders": ia1_placeholders,
    "IA2_placeholders_within_max_tokens": ia2_placeholders_within_max_tokens,
}
ASYNC_UNENCODED: frozenset[str] = frozenset({"L2_no_deadlock"})

# Every state invariant's formula, whatever the profile (look-up by name; the
# async L2 is not among them).
ALL_INVARIANT_FORMULAS: dict[str, Formula] = {
    **INVARIANT_FORMULAS, **COUNTER_FORMULAS,
    **{name: f for name, f in (x for x in ASYNC_REPLACEMENT_FORMULAS.values() if x is not None)},
    **ASYNC_FORMULAS}


def invariant_formulas_for(cfg: Config) -> dict[str, Formula]:
    """The state invariants of cfg's profile (spec.invariants.invariants_for),
    in its order; under async scheduling less L2 (`ASYNC_UNENCODED`)."""
    chosen = {**INVARIANT_FORMULAS, **COUNTER_FORMULAS} if cfg.rules.stale_output_counters else INVARIANT_FORMULAS
    if not cfg.rules.output_placeholders:
        return chosen
    out: dict[str, Formula] = {}
    for name, f in chosen.items():
        if name not in ASYNC_REPLACEMENT_FORMULAS:
            out[name] = f
        elif ASYNC_REPLACEMENT_FORMULAS[name] is not None:
            new_name, new_f = ASYNC_REPLACEMENT_FORMULAS[name]   # type: ignore[misc]
            out[new_name] = new_f
    return {**out, **ASYNC_FORMULAS}


def spec_properties_for(cfg: Config) -> tuple[str, ...]:
    """Every spec property the engines prove for cfg's profile: its state
    invariants, then the transition properties."""
    return (*invariant_formulas_for(cfg), *TRANSITION_FORMULAS)


# --- well-formedness: what makes a frame a concrete State -----------------------

def well_formed(layout: Layout, s: SState) -> Any:
    """Every code, index and length in range and every unused slot padded."""
    P = V(PAD)
    out = [le(0, s.num_batches), le(s.num_batches, layout.K)]
    for q in s.reqs:
        out += [le(0, q.status), lt(q.status, len(STATUS)), le(0, q.table_len), le(q.table_len, layout.T)]
        out += [ite(lt(t, q.table_len), conj(le(0, x), lt(x, layout.B)), eq(x, P)) for t, x in enumerate(q.table)]
    for xs, n in ((s.waiting, s.waiting_len), (s.running, s.running_len)):
        out += [le(0, n), le(n, layout.N)]
        out += [ite(lt(j, n), conj(le(0, x), lt(x, layout.N)), eq(x, P)) for j, x in enumerate(xs)]
    pool = s.pool
    out += [le(0, pool.free_len), le(pool.free_len, layout.B)]
    out += [ite(lt(j, pool.free_len), conj(le(0, x), lt(x, layout.B)), eq(x, P)) for j, x in enumerate(pool.free)]
    out += [conj(le(0, x), lt(x, layout.B)) for x in pool.copy_rank]
    for k, b in enumerate(s.batches):
        out += [le(0, b.length), le(b.length, layout.E), z3.Implies(le(s.num_batches, k), eq(b.length, 0))]
        for j, e in enumerate(b.entries):
            used = conj(le(0, e.req), lt(e.req, layout.N), le(0, e.fate), lt(e.fate, len(FATE)))
            pad = conj(eq(e.req, P), eq(e.start, 0), eq(e.n, 0), neg(e.samples), eq(e.drafts, 0), eq(e.fate, 0))
            out.append(ite(lt(j, b.length), used, pad))
    return conj(out)


# --- transition properties ------------------------------------------------------

def _kept(st, shift: int):
    return st.before.batches[shift:], st.before.num_batches - shift


def s4_snapshot_immutability(layout: Layout, st) -> Any:
    def holds(shift: int) -> Any:
        kept, n = _kept(st, shift)
        after = st.after
        out = [le(n, after.num_batches)]
        for kk, (x, y) in enumerate(zip(kept, after.batches)):
            both = conj(lt(kk, n), lt(kk, after.num_batches))
            same = [eq(x.length, y.length)]
            for j, (a, b) in enumerate(zip(x.entries, y.entries)):
                snap = conj(eq(a.req, b.req), eq(a.start, b.start), eq(a.n, b.n), a.samples == b.samples,
                            eq(a.drafts, b.drafts))
                same.append(z3.Implies(lt(j, x.length), snap))
            out.append(z3.Implies(both, conj(same)))
        return conj(out)
    return ite(eq(st.choices.act, COMPLETE), holds(1), holds(0))


def s13_fates_only_age(layout: Layout, st) -> Any:
    def holds(shift: int) -> Any:
        kept, n = _kept(st, shift)
        after, out = st.after, []
        for kk, (x, y) in enumerate(zip(kept, after.batches)):
            both = conj(lt(kk, n), lt(kk, after.num_batches))
            for j, (a, b) in enumerate(zip(x.entries, y.entries)):
                out.append(z3.Implies(conj(both, lt(j, x.length), lt(j, y.length)), le(a.fate, b.fate)))
        return conj(out)
    return ite(eq(st.choices.act, COMPLETE), holds(1), holds(0))


def s12_status_monotonicity(layout: Layout, st) -> Any:
    before, after, act, sch = st.before, st.after, st.choices.act, st.sched
    out = []
    for b, a in zip(before.reqs, after.reqs):
        fin = disj(eq(b.status, F_STOPPED), eq(b.status, F_LENGTH), eq(b.status, F_ABORTED))
        out.append(z3.Implies(fin, conj(eq(a.status, b.status), eq(a.num_output, b.num_output))))
        out.append(z3.Implies(conj(eq(b.status, NEW), neg(eq(a.status, NEW))), eq(act, ARRIVE)))
        out.append(z3.Implies(conj(eq(a.status, RUNNING), neg(eq(b.status, RUNNING))), eq(act, SCHEDULE)))
    admitted = [conj(lt(j, sch.count),
                     disj(neg(eq(at(layout, before, e.req, lambda q, k: q.status), RUNNING)),
                          pick(sch.preempted, e.req, z3.BoolVal(False))))
                for j, e in enumerate(sch.entries)]
    out.append(z3.Implies(conj(eq(act, SCHEDULE), sch.result, sch.any_preempted), neg(disj(*admitted))))
    return conj(out)


TRANSITION_FORMULAS: dict[str, Callable[[Layout, Any], Any]] = {
    "S4_snapshot_immutability": s4_snapshot_immutability,
    "S13_fates_only_age": s13_fates_only_age,
    "S12_status_monotonicity": s12_status_monotonicity,
}

# Every spec property the engines prove: the state invariants, then the transition properties.
SPEC_PROPERTIES: tuple[str, ...] = (*INVARIANT_FORMULAS, *TRANSITION_FORMULAS)


# --- "sometimes" targets ----------------------------------------------------------

def _finished_normally(s: SState, r: int) -> Any:
    return disj(eq(s.reqs[r].status, F_STOPPED), eq(s.reqs[r].status, F_LENGTH))


def _two_prefill_chunks(layout: Layout, s: SState, r: int) -> Any:
    lives = [(live(e, u, r), e.samples) for e, u in positions(layout, s)]
    first_samples = z3.BoolVal(False)
    for here, samples in reversed(lives):
        first_samples = ite(here, samples, first_samples)
    return conj(le(2, count(h for h, _ in lives)), neg(first_samples))


def _holds_preallocated_block(layout: Layout, s: SState, r: int) -> Any:
    """spec.sometimes.preallocated_block: more blocks than
    cdiv(num_tokens + k, block_size), taken ahead of need."""
    q, bs = s.reqs[r], layout.cfg.block_size
    need = div_const(num_tokens(layout, q, r) + (layout.cfg.num_spec_tokens + bs - 1), bs)
    return lt(need, q.table_len)


def deferred_resumption(s: State, cfg: Config, r: int) -> bool:
    """The next schedule passes over preempted request r, whose stale output
    (orphaned entries) is still in flight: its resumption is deferred."""
    if r not in s.waiting or not _is_resumption_deferred(s, cfg, r) or not is_schedule_enabled(s, cfg):
        return False
    scheduled = spec_schedule(s, cfg)
    if scheduled is not None and scheduled.preempted:
        return False                        # the waiting loop runs only when nothing was preempted
    entries = () if scheduled is None else scheduled.entries
    before = s.waiting[:s.waiting.index(r)]
    admitted = {e.req for e in entries if e.req in before}
    # the loop reaches r: every request ahead of it admitted or deferred, budget and a seat left
    if any(x not in admitted and not _is_resumption_deferred(s, cfg, x) for x in before):
        return False
    spent = sum(e.n for e in entries if e.req not in s.waiting or e.req in before)
    return spent < cfg.max_num_batched_tokens and len(s.running) + len(admitted) < cfg.max_num_seqs


# "Sometimes" targets of the verification alone: spec/sometimes.py names none
# for vLLM 0.33's deferred resumption yet, so the target lives here, with its
# concrete predicate (BMC's witnesses are checked against it) and its formula
# (SCHEDULE_SOMETIMES_FORMULAS: it reads the frame's schedule).
VERIFICATION_SOMETIMES: tuple[Sometimes, ...] = (
    Sometimes("deferred_resumption", deferred_resumption, needs="defer_resume_while_stale"),
)


def verification_target_applies(target: Sometimes, cfg: Config) -> bool:
    """A verification-only target is meaningful where its profile rule is on
    (with batches to leave a preempted request's output in flight)."""
    return bool(getattr(cfg.rules, target.needs)) and cfg.num_stages >= 2


SCHEDULE_SOMETIMES_FORMULAS: dict[str, Callable[[Layout, SState, SchedResult], Any]] = {
    # the schedule runs (room for a batch) and its waiting loop skips a deferred request
    "deferred_resumption": lambda layout, s, sch: conj(sch.enabled, lt(0, sch.skipped)),
}

def _resumption_deferred(layout: Layout, s: SState, r: int) -> Any:
    """spec.sometimes.resumption_deferred: PREEMPTED, a free seat, and
    spec.schedule._is_resumption_deferred (on 0.33's counters: stale output
    in deliver mode; with the rule but no counters: orphaned entries)."""
    rules, q = layout.cfg.rules, s.reqs[r]
    if not rules.defer_resume_while_stale:
        return z3.BoolVal(False)
    if s.counters:
        c = s.counters[r]
        has_stale = lt(0, c.stale) if rules.stale_test == "positive" else neg(eq(c.stale, 0))
        deferred = conj(has_stale, neg(c.drop))
    else:
        deferred = disj(*[conj(used, eq(e.req, r), eq(e.fate, ORPHANED)) for e, used in positions(layout, s)])
    return conj(eq(q.status, PREEMPTED), lt(s.running_len, layout.cfg.max_num_seqs), deferred)


def _stale_output_delivered(layout: Layout, st) -> Any:
    """spec.sometimes.stale_output_delivered, on a step: a request PREEMPTED
    before it gains an output."""
    return disj(*[conj(eq(b.status, PREEMPTED), lt(b.num_output, a.num_output))
                  for b, a in zip(st.before.reqs, st.after.reqs)])


# "Sometimes" targets reached on a transition (spec Sometimes.on_step): formulas of a step.
STEP_SOMETIMES_FORMULAS: dict[str, Callable[[Layout, Any], Any]] = {
    "stale_output_delivered": _stale_output_delivered,
}

SOMETIMES_FORMULAS: dict[str, Callable[[Layout, SState], Any]] = {
    "request_can_finish": lambda layout, s: disj(*[_finished_normally(s, r) for r in range(layout.N)]),
    "pipeline_can_be_full": lambda layout, s: eq(s.num_batches, layout.K),
    "two_prefill_chunks_in_flight": lambda layout, s: disj(*[_two_prefill_chunks(layout, s, r) for r in range(layout.N)]),
    "preempted_request_resumes_and_finishes":
        lambda layout, s: disj(*[conj(s.was_preempted[r], _finished_normally(s, r)) for r in range(layout.N)]),
    "preallocated_block":
        lambda layout, s: disj(*[_holds_preallocated_block(layout, s, r) for r in range(layout.N)]),
    "duplicate_cached_block": lambda layout, s: disj(*[lt(0, x) for x in s.pool.copy_rank]),
    "resumption_deferred": lambda layout, s: disj(*[_resumption_deferred(layout, s, r) for r in range(layout.N)]),
    # a step's target: no state alone reaches it (STEP_SOMETIMES_FORMULAS has its formula)
    "stale_output_delivered": lambda layout, s: z3.BoolVal(False),
    # the encoding's names are unique (Layout.of refuses allow_name_reuse): never reached here
    "name_reused_in_flight": lambda layout, s: z3.BoolVal(False),
    "empty_batch_in_queue":
        lambda layout, s: disj(*[conj(lt(k, s.num_batches), eq(b.length, 0)) for k, b in enumerate(s.batches)]),
}


# --- async scheduling's targets (spec.sometimes.ASYNC_SOMETIMES) as cover formulas ------

def _decode_behind_decode(layout: Layout, s: SState, r: int) -> Any:
    """spec.sometimes.decode_behind_decode: two live sampling entries of r in flight."""
    return le(2, count(conj(here, e.samples) for _, e, here in _live_entries(layout, s, r)))


def _stopped_with_output_in_flight(layout: Layout, s: SState, r: int) -> Any:
    """spec.sometimes.stopped_with_output_in_flight: r FINISHED_STOPPED with a
    sampling entry of any fate still in flight."""
    mine = disj(*[conj(u, eq(e.req, r), e.samples) for e, u in positions(layout, s)])
    return conj(eq(s.reqs[r].status, F_STOPPED), mine)


# Kept apart from SOMETIMES_FORMULAS (the sync targets every profile's BMC
# covers): BMC covers these only when asked by name (BmcOptions.sometimes);
# verify does not, since on its model both lie deeper than its depth of 4
# (the stagger of K = 3), and the exhaustive search reaches both.
ASYNC_SOMETIMES_FORMULAS: dict[str, Callable[[Layout, SState], Any]] = {
    "decode_behind_decode": lambda layout, s: disj(*[_decode_behind_decode(layout, s, r) for r in range(layout.N)]),
    "stopped_with_output_in_flight":
        lambda layout, s: disj(*[_stopped_with_output_in_flight(layout, s, r) for r in range(layout.N)]),
}

__all__ = ["ASYNC_SOMETIMES_FORMULAS", "STEP_SOMETIMES_FORMULAS", "INVARIANT_FORMULAS", "COUNTER_FORMULAS", "ALL_INVARIANT_FORMULAS", "invariant_formulas_for",
           "spec_properties_for", "TRANSITION_FORMULAS", "SPEC_PROPERTIES", "SOMETIMES_FORMULAS", "NEEDS_SCHEDULE",
           "SCHEDULE_SOMETIMES_FORMULAS", "VERIFICATION_SOMETIMES", "verification_target_applies",
           "well_formed", "positions", "has_live", "CompleteOldest"]
