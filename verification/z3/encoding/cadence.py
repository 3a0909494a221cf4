"""spec/cadence.py in Z3: the prefill cadence's hooks in `schedule`
(schedule.py calls them; each returns what it was given when the layout's
cadence is off, cadence_state.has_cadence).

* `defers_prefills`, once per call on the frame being scheduled (spec
  `_Step.defers_prefills`): the hold lasts, the queue is not backed up, and
  some running request is not a prefill chunk;
* the running loop skips a prefill chunk while deferring (`skips_running`,
  beside async scheduling's skips), and the waiting loop stops at a request
  with more than one token left to compute (`stops_admission`) and marks
  the requests it passes over (`note_skipped`);
* after the waiting loop, a call that did not defer records whether the
  queue stayed backed up (`after_waiting_loop`);
* after `_launch`, every scheduled request's `is_prefill_chunk` (also where
  only the padding rule reads it: cadence_state.has_chunk_flags; its counter
  just advanced, against its tokens and the placeholders before this
  batch's) and the hold: interval - 1 after a batch that carried a prefill,
  else one less after an executed step, floored at 0 (`after_launch`).

The spec accumulates `carried_prefill` entry by entry; here it is read off
the batch once it is formed: an entry of a request admitted in this call
carried a prefill if it started (its prefix hit) more than one token short
of the request's tokens, any other entry (a running request's) if its
request was a prefill chunk. Under FCFS no request is both (the waiting
loop runs only when nobody was preempted), so the two agree. The cadence's
mutants (verification/mutants/cadence.py) are encoded where their spec
edit is, by `Layout.is_mutant`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import z3
from flightcheck.verification.z3.encoding.cadence_state import SCadence, has_cadence, has_chunk_flags
from flightcheck.verification.z3.encoding.requests import at, num_tokens, prompt_len, tokens_at
from flightcheck.verification.z3.encoding.state import Layout, SState
from flightcheck.verification.z3.encoding.terms import (
    V,
    clone,
    conj,
    count,
    disj,
    eq,
    ite,
    lt,
    neg,
    pick,
    put,
)


def defers_prefills(layout: Layout, s: SState) -> Any:
    """spec.cadence.defers_prefills on the frame: False without the cadence."""
    if not has_cadence(layout):
        return z3.BoolVal(False)
    c = s.cad[0]
    guard = lt(0, c.hold)
    if not layout.is_mutant("cadence_holds_backed_up_queue_pr44558"):     # vLLM PR #44558's guard
        guard = conj(guard, neg(c.bound))
    decode = [conj(lt(j, s.running_len), neg(pick(c.chunk, r, z3.BoolVal(True)))) for j, r in enumerate(s.running)]
    return conj(guard, disj(*decode))


def skips_running(layout: Layout, st: SState, r: Any, defers: Any) -> Any:
    """The running loop skips running request r, a prefill chunk, while deferring."""
    if not has_cadence(layout):
        return z3.BoolVal(False)
    return conj(defers, pick(st.cad[0].chunk, r, z3.BoolVal(False)))


def stops_admission(layout: Layout, st: SState, r: Any, computed: Any, defers: Any) -> Any:
    """The waiting loop stops at r, with `computed` tokens (its prefix hit),
    when more than one token is left to compute while deferring."""
    if not has_cadence(layout):
        return z3.BoolVal(False)
    return conj(defers, lt(computed, tokens_at(layout, st, r) - 1))


def note_skipped(layout: Layout, st: SState, r: Any, skipped: Any) -> SState:
    """The waiting loop passed over r (`skipped`): it joins `deferred_waiting`."""
    if not has_cadence(layout):
        return st
    out = clone(st)
    out.cad[0].deferred = put(st.cad[0].deferred, r, z3.BoolVal(True), skipped)
    return out


def after_waiting_loop(layout: Layout, acc: Any, defers: Any) -> Any:
    """A call that did not defer (and whose waiting loop ran: nobody was
    preempted) records whether its waiting queue stayed backed up: more
    waiting requests than the loop passed over. `acc` is the batch in
    progress (schedule.BatchInProgress)."""
    st = clone(acc.state)
    c = st.cad[0]
    deferred = count([conj(lt(j, st.waiting_len), pick(c.deferred, r, z3.BoolVal(False)))
                      for j, r in enumerate(st.waiting)])
    c.bound = ite(conj(neg(defers), neg(acc.any_preempted)), lt(deferred, st.waiting_len), c.bound)
    return replace(acc, state=st)


def carried_prefill(layout: Layout, s: SState, acc: Any) -> Any:
    """Whether the batch `acc` formed from frame s carried a prefill (spec
    cadence.carries_prefill over its entries: an admission more than one
    token short, or a running prefill chunk). Its entries are all the call
    scheduled: the spec's chunks taken back by a priority preemption do not
    arise, the policy being refused beside the cadence (cadence_state.py)."""
    out = []
    for j, e in enumerate(acc.entries):
        admitted = pick(acc.admitted, e.req, z3.BoolVal(False))
        tokens = tokens_at(layout, s, e.req)
        if layout.is_mutant("cadence_stamps_on_prompt_length_pr54627"):    # vLLM PR #54627's stamp
            short = lt(e.start, at(layout, s, e.req, lambda q, k: prompt_len(layout, q, k)))
        else:
            short = lt(e.start, tokens - 1)
        out.append(conj(lt(j, acc.count), ite(admitted, short, pick(s.cad[0].chunk, e.req, z3.BoolVal(False)))))
    return disj(*out)


def after_launch(layout: Layout, s: SState, acc: Any, launched: SState, defers: Any) -> SState:
    """On `launched`, the state `_launch` made of the batch `acc` formed
    from frame s: the capacity bound after the waiting loop
    (`after_waiting_loop`: `_launch` moves no queue), spec
    cadence.mark_prefill_chunk for every scheduled request (on its counter
    after `_launch`, against its tokens and its placeholders before this
    batch) and cadence.after_schedule's hold."""
    if not has_chunk_flags(layout):
        return launched
    out, cfg = clone(launched), layout.cfg
    if has_cadence(layout):
        out.cad[0].bound = after_waiting_loop(layout, replace(acc, state=launched), defers).state.cad[0].bound
    c = out.cad[0]
    for k, q in enumerate(out.reqs):
        mine = disj(*[conj(lt(j, acc.count), eq(e.req, k)) for j, e in enumerate(acc.entries)])
        known = num_tokens(layout, q, k)
        if acc.state.asyncs:
            known = known + acc.state.asyncs[k].placeholders
        c.chunk[k] = ite(mine, lt(q.num_computed, known), c.chunk[k])
        c.deferred[k] = ite(mine, z3.BoolVal(False), c.deferred[k])
    if not has_cadence(layout):
        return out                  # the flags alone (the padding rule's: spec.drafts.keeps_prefill_chunk_flag)
    hold = s.cad[0].hold
    aged = ite(lt(0, acc.count), ite(lt(0, hold), hold - 1, V(0)), hold)
    c.hold = ite(carried_prefill(layout, s, acc), V(cfg.prefill_schedule_interval - 1), aged)
    return out


__all__ = ["SCadence", "defers_prefills", "skips_running", "stops_admission", "note_skipped",
           "after_waiting_loop", "after_launch", "carried_prefill"]
