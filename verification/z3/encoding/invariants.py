"""spec/invariants.py in Z3 (its transition properties are in
transitions.py, its "sometimes" targets in sometimes.py).

Every predicate of the spec's INVARIANTS has a formula here of the same
name, written clause for clause after the Python one, over a frame (and,
where the predicate calls `schedule`, the frame's schedule function).
`tests/test_z3_invariants.py` checks that each formula and its predicate
agree on sampled states, inside and outside the invariants.

The formulas assume the frame is well formed (`well_formed`: every code,
index and length in range, padding canonical), which every frame the
transition relation reaches from the initial state is; a few clauses restate
range facts where the Python predicate compares sets, so that the formula
and the predicate agree on every state `decode` can produce.
"""

from __future__ import annotations

from typing import Any, Callable

import z3
from flightcheck.spec import Config
from flightcheck.verification.z3.encoding.actions import complete_guard, is_active
from flightcheck.verification.z3.encoding.structured_output_state import grammar_well_formed
from flightcheck.verification.z3.encoding.entries import (
    has_live,
    last_live_samples,
    live,
    live_entries,
    positions,
)
from flightcheck.verification.z3.encoding.requests import (
    at,
    content_label,
    max_tokens,
    num_tokens,
)
from flightcheck.verification.z3.encoding.schedule import SchedResult
from flightcheck.verification.z3.encoding.state import (
    FATE,
    G_WAIT,
    LIVE,
    ORPHANED,
    PAD,
    PARKED,
    PREEMPTED,
    RUNNING,
    SUPERSEDED,
    WAITING,
    Layout,
    SState,
    num_statuses,
)
from flightcheck.verification.z3.encoding.kv_state import kv_well_formed
from flightcheck.verification.z3.encoding.cadence_state import cad_well_formed
from flightcheck.verification.z3.encoding.session_state import session_well_formed
from flightcheck.verification.z3.encoding.priority_state import prio_well_formed
from flightcheck.verification.z3.encoding.reset_pause_state import rp_well_formed
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


def _active(s: SState, r: int) -> Any:
    return is_active(s.reqs[r].status, grammar=bool(s.grammar))     # waiting for a grammar: active too


def _grammar_waits(s: SState, q: Any) -> list:
    """[q waits for its grammar] in a frame with structured output, else []."""
    return [eq(q.status, G_WAIT)] if s.grammar else []


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


def kv_ownership_clauses(layout: Layout, s: SState) -> dict[str, Any]:
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
    return conj(list(kv_ownership_clauses(layout, s).values()))


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
                     [disj(eq(q.status, WAITING), eq(q.status, PREEMPTED), *_grammar_waits(s, q)) for q in s.reqs]),
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

def s3a_async_coverage(layout: Layout, s: SState, sch: SchedResult) -> Any:
    """spec.invariants.live_ranges_contiguous_with_placeholders: without spec decode the sync S3."""
    if layout.cfg.num_spec_tokens == 0:
        return s3_contiguous_coverage(layout, s, sch)
    out = []
    for r, q in enumerate(s.reqs):
        seen, end, samples, ok = z3.BoolVal(False), V(0), z3.BoolVal(False), []
        for _, e, here in live_entries(layout, s, r):
            ok += [z3.Implies(here, le(1, e.n)),
                   z3.Implies(conj(here, seen), conj(le(e.start, end), disj(samples, eq(e.start, end))))]
            end, samples, seen = ite(here, e.start + e.n, end), ite(here, e.samples, samples), disj(seen, here)
        ok.append(z3.Implies(seen, disj(eq(end, q.num_computed), conj(samples, lt(q.num_computed, end)))))
        out.append(z3.Implies(_active(s, r), conj(ok)))
    return conj(out)


def s5a_async_sampling(layout: Layout, s: SState, sch: SchedResult) -> Any:
    """spec.invariants.samples_exactly_at_known_tokens_with_placeholders, entry by entry with the placeholders
    of the older live sampling entries (`ahead`) carried along."""
    out = []
    for r, q in enumerate(s.reqs):
        tokens, ahead = num_tokens(layout, q, r), V(0)
        for _, e, here in live_entries(layout, s, r):
            reach = e.start + e.n - e.drafts
            ok = [lt(e.drafts, e.n), z3.Implies(lt(0, e.drafts), e.samples),
                  z3.Implies(neg(e.samples), conj(eq(ahead, 0), lt(reach, tokens)))]
            if layout.cfg.num_spec_tokens == 0:
                ok += [le(reach, tokens + ahead), e.samples == eq(reach, tokens + ahead)]
            out.append(z3.Implies(here, conj(ok)))
            ahead = ite(conj(here, e.samples), ahead + 1 + e.drafts, ahead)
    return conj(out)


def s6p_async_decode_gating(layout: Layout, s: SState, sch: SchedResult) -> Any:
    """spec.invariants.decode_gated_by_stagger: at most ceil(D / stagger) live
    sampling entries of a request in flight, any two `stagger` batches apart,
    and the countdown the stagger less the batches since its latest sampling
    entry (of any fate)."""
    stagger, depth = layout.cfg.stagger, layout.cfg.queue_depth
    cap = -(-depth // stagger) if stagger else depth
    out = []
    for r in range(layout.N):
        slots = live_entries(layout, s, r)
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
        total = sum_terms([ite(conj(here, e.samples), 1 + e.drafts, V(0)) for _, e, here in live_entries(layout, s, r)])
        out.append(conj(eq(ph, total),
                        ite(eq(q.status, RUNNING), disj(eq(ph, 0), eq(q.num_computed, num_tokens(layout, q, r) + ph - 1)),
                            eq(ph, 0))))
    return conj(out)


def ia2_placeholders_within_max_tokens(layout: Layout, s: SState, sch: SchedResult) -> Any:
    out = []
    for r, q in enumerate(s.reqs):
        sampling = count(conj(here, e.samples) for _, e, here in live_entries(layout, s, r))
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


# --- well-formedness: what makes a frame a concrete State -----------------------

def well_formed(layout: Layout, s: SState) -> Any:
    """Every code, index and length in range and every unused slot padded."""
    P = V(PAD)
    out = [le(0, s.num_batches), le(s.num_batches, layout.K)]
    for q in s.reqs:
        out += [le(0, q.status), lt(q.status, num_statuses(layout)), le(0, q.table_len), le(q.table_len, layout.T)]
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
    return conj(*out, kv_well_formed(layout, s), session_well_formed(layout, s, PARKED), rp_well_formed(layout, s),
                grammar_well_formed(layout, s), prio_well_formed(layout, s), cad_well_formed(layout, s))

