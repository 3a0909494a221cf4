"""Auxiliary (strengthening) invariants: facts about reachable states that the
spec's invariants rest on but do not state, added so that the conjunction is
inductive (k-induction with k = 1 proves it in one step).

Each was found from a counterexample to induction: a state that satisfies
every spec invariant, is not reachable, and steps to a violation. Each is a
predicate over one frame with a one-line statement, and each is itself proved
(it is part of the inductive conjunction); `tests/test_z3_invariants.py`
also checks every one of them on reachable concrete states.
"""

from __future__ import annotations

from typing import Any, Callable

import z3
from flightcheck.verification.z3.encoding.entries import has_live, last_live, positions
from flightcheck.verification.z3.encoding.state import (
    F_ABORTED,
    F_LENGTH,
    F_STOPPED,
    LIVE,
    NEW,
    PREEMPTED,
    RUNNING,
    WAITING,
    Layout,
    SState,
)
from flightcheck.verification.z3.encoding.terms import (
    V,
    conj,
    count,
    disj,
    eq,
    le,
    lt,
    neg,
)

AuxiliaryInvariant = Callable[[Layout, SState], Any]


def a1_new_is_pristine(layout: Layout, s: SState) -> Any:
    """A request that has not arrived has no output, no counters, no blocks and nothing in flight."""
    out = []
    for r, q in enumerate(s.reqs):
        mine = disj(*[conj(u, eq(e.req, r)) for e, u in positions(layout, s)])
        out.append(z3.Implies(eq(q.status, NEW), conj(eq(q.num_output, 0), eq(q.num_computed, 0),
                                                      eq(q.num_drafts, 0), eq(q.table_len, 0), neg(mine))))
    return conj(out)


def a2_waiting_never_ran(layout: Layout, s: SState) -> Any:
    """A WAITING request has no output and nothing in flight; WAITING ones propose no drafts, nor do
    PREEMPTED ones but under vLLM 0.8.x, where a preempted request keeps its drafts
    (`Profile.held_drafts_left_uncached`): at most k there."""
    out = []
    held = layout.cfg.rules.held_drafts_left_uncached
    for r, q in enumerate(s.reqs):
        mine = disj(*[conj(u, eq(e.req, r)) for e, u in positions(layout, s)])
        out.append(z3.Implies(eq(q.status, WAITING), conj(eq(q.num_output, 0), neg(mine))))
        out.append(z3.Implies(eq(q.status, WAITING), eq(q.num_drafts, 0)))
        out.append(z3.Implies(eq(q.status, PREEMPTED),
                              le(q.num_drafts, layout.cfg.num_spec_tokens) if held else eq(q.num_drafts, 0)))
    return conj(out)


def a3_finished_is_released(layout: Layout, s: SState) -> Any:
    """A finished request has its counters reset."""
    out = []
    for q in s.reqs:
        finished = disj(eq(q.status, F_STOPPED), eq(q.status, F_LENGTH), eq(q.status, F_ABORTED))
        out.append(z3.Implies(finished, conj(eq(q.num_computed, 0), eq(q.num_drafts, 0))))
    return conj(out)


def a4_counts_nonnegative(layout: Layout, s: SState) -> Any:
    """Output counts and proposed drafts are never negative."""
    return conj([conj(le(0, q.num_output), le(0, q.num_drafts)) for q in s.reqs])


def a5_snapshots_well_formed(layout: Layout, s: SState) -> Any:
    """Every in-flight snapshot, whatever its fate, starts at >= 0, holds >= 1 token and
    0 <= drafts < tokens (and at most k)."""
    k = layout.cfg.num_spec_tokens
    return conj([z3.Implies(u, conj(le(0, e.start), le(1, e.n), le(0, e.drafts), lt(e.drafts, e.n),
                                    le(e.drafts, k)))
                 for e, u in positions(layout, s)])


def a6_drafts_ride_on_last_live_entry(layout: Layout, s: SState) -> Any:
    """A request with live entries in flight proposes exactly the drafts its last live entry carries.

    Under async scheduling with spec decode (vllm-0.33-async, k > 0) restated as
    A6a: a request proposes 0..k drafts. The sync equality is false there: a
    decode is scheduled behind its request's decode in flight, and when the
    older one's output comes back (spec.actions._apply_sample) it sets the
    request's proposals for its next step while the younger entry still
    carries the drafts it was scheduled with (reachable on async-drafts-k2;
    tests/test_z3_async.py). What is left of it holds because every write of
    num_drafts (schedule: the new entry's drafts, at most k by S8; an output:
    a proposal of 0..k; preemption and finishing: 0) stays within 0..k."""
    if layout.cfg.rules.output_placeholders and layout.cfg.num_spec_tokens:
        return conj([conj(le(0, q.num_drafts), le(q.num_drafts, layout.cfg.num_spec_tokens)) for q in s.reqs])
    return conj([z3.Implies(has_live(layout, s, r), eq(q.num_drafts, last_live(layout, s, r, "drafts", V(0))))
                 for r, q in enumerate(s.reqs)])


def a7_unlabelled_blocks_are_private(layout: Layout, s: SState) -> Any:
    """A block that caches no label is held by at most one table (only prefix hits share blocks)."""
    return conj([z3.Implies(eq(label, layout.none_label), le(ref, 1)) for ref, label in zip(s.pool.ref, s.pool.label)])


def a8_one_live_entry_per_request(layout: Layout, s: SState) -> Any:
    """One batch per request: a request has at most one live entry in flight."""
    if layout.cfg.continue_prefill:
        return z3.BoolVal(True)
    out = []
    for r in range(layout.N):
        out.append(le(count(conj(u, eq(e.req, r), eq(e.fate, LIVE)) for e, u in positions(layout, s)), 1))
    return conj(out)


def a9_held_blocks_are_not_free(layout: Layout, s: SState) -> Any:
    """A block in some table is not in the free queue and has a positive count (the partition of S9, without counting)."""
    out = []
    for q in s.reqs:
        for t, b in enumerate(q.table):
            held = lt(t, q.table_len)
            out += [z3.Implies(conj(held, lt(j, s.pool.free_len)), neg(eq(b, f))) for j, f in enumerate(s.pool.free)]
            out.append(z3.Implies(held, conj(*[z3.Implies(eq(b, k), le(1, ref)) for k, ref in enumerate(s.pool.ref)])))
    return conj(out)


def a10_inactive_has_no_counters(layout: Layout, s: SState) -> Any:
    """vLLM 0.33: a request not yet arrived or finished keeps no stale-output counters (finishing forgets them)."""
    out = []
    for q, c in zip(s.reqs, s.counters):        # no counters (0.8.x): nothing to say
        active = disj(eq(q.status, WAITING), eq(q.status, RUNNING), eq(q.status, PREEMPTED))
        out.append(z3.Implies(neg(active), conj(eq(c.in_flight, 0), eq(c.stale, 0), neg(c.drop))))
    return conj(out)


def a11_stale_entries_come_first(layout: Layout, s: SState) -> Any:
    """vLLM 0.33: an unfinished request's entries scheduled before its last preemption (not LIVE) precede its LIVE ones in the FIFO."""
    if not s.counters:
        return z3.BoolVal(True)
    out, slots = [], positions(layout, s)
    for r, q in enumerate(s.reqs):
        active = disj(eq(q.status, WAITING), eq(q.status, RUNNING), eq(q.status, PREEMPTED))
        for i, (e1, u1) in enumerate(slots):
            for e2, u2 in slots[i + 1:]:
                live_then_stale = conj(u1, u2, eq(e1.req, r), eq(e2.req, r), eq(e1.fate, LIVE), neg(eq(e2.fate, LIVE)))
                out.append(z3.Implies(active, neg(live_then_stale)))
    return conj(out)


# --- asynchronous scheduling (vllm-0.33-async) ------------------------------------

def a12_snapshots_within_the_model_length(layout: Layout, s: SState) -> Any:
    """Every in-flight snapshot, whatever its fate, starts at most at max_model_len and holds at most
    max_model_len tokens.

    S2 bounds start + n by max_model_len, but the encoding's arithmetic is
    bit-vectors, where a start and a length near the top of the range wrap
    round to a small sum: the first counterexample to induction under
    vllm-0.33-async (async-drop-k2, `schedule`) had two orphaned entries of
    1 and 126 tokens, a stale counter of 127 that the resumption's entry
    pushed to -128, breaking IF0 and IF2. Each bound holds because an entry
    is made by schedule with 0 <= start and start + n <= max_model_len (the
    clip to the model length), and no rule changes its start or length
    afterwards (a preemption or a reschedule changes only its fate); with
    A5's 0 <= start and 1 <= n the two bounds keep every sum of a few of them
    far from the top of the range."""
    L = layout.cfg.max_model_len
    return conj([z3.Implies(u, conj(le(e.start, L), le(e.n, L))) for e, u in positions(layout, s)])


AUXILIARY: dict[str, AuxiliaryInvariant] = {
    "A1_new_is_pristine": a1_new_is_pristine,
    "A2_waiting_never_ran": a2_waiting_never_ran,
    "A3_finished_is_released": a3_finished_is_released,
    "A4_counts_nonnegative": a4_counts_nonnegative,
    "A5_snapshots_well_formed": a5_snapshots_well_formed,
    "A6_drafts_ride_on_last_live_entry": a6_drafts_ride_on_last_live_entry,
    "A7_unlabelled_blocks_are_private": a7_unlabelled_blocks_are_private,
    "A8_one_live_entry_per_request": a8_one_live_entry_per_request,
    "A9_held_blocks_are_not_free": a9_held_blocks_are_not_free,
    "A10_inactive_has_no_counters": a10_inactive_has_no_counters,
    "A11_stale_entries_come_first": a11_stale_entries_come_first,
    "A12_snapshots_within_the_model_length": a12_snapshots_within_the_model_length,
}

# The auxiliary invariants only async scheduling's proofs need: the sync
# profiles' k-induction runs without them (their conjunction was inductive
# before they were written, and each conjunct costs every Houdini round).
ASYNC_ONLY_AUXILIARY: frozenset[str] = frozenset({"A12_snapshots_within_the_model_length"})


def auxiliary_for(cfg: Any) -> list[str]:
    """The auxiliary invariants k-induction assumes under cfg's profile, in AUXILIARY's order."""
    return [name for name in AUXILIARY if cfg.rules.output_placeholders or name not in ASYNC_ONLY_AUXILIARY]


__all__ = ["ASYNC_ONLY_AUXILIARY", "AUXILIARY", "RUNNING", "auxiliary_for"]
