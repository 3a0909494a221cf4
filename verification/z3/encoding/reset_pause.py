"""spec/reset_pause.py in Z3: the environment's two actions, `reset(running)`
(`Scheduler.reset_prefix_cache(reset_running_requests=running)`) and
`set_pause(pause)` (`Scheduler.set_pause_state`), as guard + effect on a
symbolic state, and the scheduler's hooks (schedule.py calls them, only in
a frame with reset and pause): the running loop's budget, the waiting
loop's gate and `has_requests` for the empty batch.

Five action codes after the four of actions.py: reset without and with the
running requests, then a pause state each; beside a KV connector, after its
three reports, seven: the two resets, the two with the connector's cache
(`_forget_offers`: spec Request.offer_reset, RP5), then the pauses. The reset of the running
requests is unrolled over N micro-steps, each preempting the tail of
`running` while it is not empty (spec `while state.running`); each names
its result (`Builder.snap`) so the solver sees N small circuits. A reset's
mutants (verification/mutants/reset_pause.py) are encoded where their
spec edit is, by `Layout.is_mutant`.
"""

from __future__ import annotations

from typing import Any

import z3
from flightcheck.spec import Action, Reset, SetPause
from flightcheck.verification.z3.encoding import blocks as zb
from flightcheck.verification.z3.encoding.requests import (
    counters_at,
    empty_table,
    put_flag,
    req_at,
    with_async,
    with_counters,
    with_req,
)
from flightcheck.verification.z3.encoding.reset_pause_state import (
    PAUSE,
    PAUSED_ALL,
    PAUSED_NEW,
    UNPAUSED,
    is_paused,
)
from flightcheck.verification.z3.encoding.actions import is_active
from flightcheck.verification.z3.encoding.connector import load_at, release_table
from flightcheck.verification.z3.encoding.kv_state import L_NONE, has_kv, kv_offer
from flightcheck.verification.z3.encoding.state import (LIVE, ORPHANED, PAD, PREEMPTED, REMOTE_KVS, RUNNING, WAITING,
                                                        Layout, SState)
from flightcheck.verification.z3.encoding.terms import V, Builder, clone, conj, disj, eq, ite, lt, merge, neg, pick, put

# The action codes (`Choices.act`) after arrive, schedule, complete_oldest,
# abort, and beside a connector its three reports (connector.py).
FIRST_CODE = 4
KV_REPORTS = 3


def rp_actions(layout: Layout | None = None) -> tuple[Action, ...]:
    """The resets (beside a connector each with and without the connector's
    cache, as the explicit search offers them), then a pause state each."""
    connector = (False, True) if layout is not None and has_kv(layout) else (False,)
    return (*(Reset(running, c) for c in connector for running in (False, True)), *(SetPause(p) for p in PAUSE))


def first_code(layout: Layout | None = None) -> int:
    return FIRST_CODE + (KV_REPORTS if layout is not None and has_kv(layout) else 0)


def rp_action(code: int, layout: Layout | None = None) -> Action:
    """The spec action of a reset-and-pause action code."""
    return rp_actions(layout)[code - first_code(layout)]


def rp_code(action: Action, layout: Layout | None = None) -> int:
    return first_code(layout) + rp_actions(layout).index(action)


def is_reset(layout: Layout, act: Any, running: bool) -> Any:
    """The step is a reset with (or without) the running requests, the connector's cache or not."""
    return disj(*[eq(act, rp_code(a, layout)) for a in rp_actions(layout)
                  if isinstance(a, Reset) and a.running == running])


def rp_transitions(layout: Layout, builder: Builder, s: SState, ch) -> tuple[list, list, list]:
    """Guards, effects (one per code from `first_code`) and the choices'
    canonical form: a reset or pause names no request."""
    guards, effects = [], []
    for action in rp_actions(layout):
        if isinstance(action, Reset):
            guards.append(z3.BoolVal(True))
            effects.append(builder.snap(reset(layout, builder, s, action.running, action.connector),
                                        f"reset{int(action.running)}{int(action.connector)}"))
        else:
            code = PAUSE.index(action.pause)
            guards.append(neg(is_paused(s, code)))
            effects.append(set_pause(s, code))
    legal = [z3.Implies(neg(lt(ch.act, first_code(layout))), eq(ch.req, 0))]
    return guards, effects, legal


# --- the actions


def reset(layout: Layout, builder: Builder, s: SState, running: bool, connector: bool = False) -> SState:
    """spec reset_pause.reset: with `running`, every running request
    preempted from the tail, dropping its output; then the prefix cache;
    with `connector` (beside one) the connector's cache, unless a block is
    still held after the preemptions (vLLM raises before it)."""
    if layout.is_mutant("pause_clear_cache_keeps_running_pr34382"):
        running = False
    st = s
    if running:
        for i in range(layout.N):
            st = builder.snap(merge(lt(0, st.running_len), _preempt_dropping_output(layout, st), st), f"pop{i}")
    after = _reset_prefix_cache(layout, st)
    if not connector or not st.kv:
        return after
    raised = disj(*[lt(0, c) for c in st.pool.ref]) if running else z3.BoolVal(False)
    return merge(raised, after, _forget_offers(layout, after))


def _preempt_dropping_output(layout: Layout, st: SState) -> SState:
    """spec reset_pause._preempt_dropping_output of the tail of `running`:
    its table freed, to the head of `waiting`, its entries in flight marked
    (a live one orphaned), its tokens in flight stale output in drop mode,
    no placeholders (the countdown kept)."""
    cfg = layout.cfg
    victim = pick(st.running, st.running_len - 1, V(PAD))
    v = req_at(st, victim)
    p = clone(st)       # `_free_request_blocks` (kv_fence.release_table beside a connector)
    p.pool = release_table(layout, st, victim, v.table, v.table_len).pool if st.kv else \
        zb.free_table(layout, st.pool, v.table, v.table_len)
    p.running = put(st.running, st.running_len - 1, V(PAD))
    p.running_len = st.running_len - 1
    p.waiting = [victim] + st.waiting[:-1]
    p.waiting_len = st.waiting_len + 1
    p.scheduled = put_flag(st.scheduled, victim, z3.BoolVal(False))
    flags = p.rp[0].reset
    for k, b in enumerate(p.batches):
        for j, e in enumerate(b.entries):
            mine = conj(lt(k, st.num_batches), lt(j, b.length), eq(e.req, victim))
            e.fate = ite(conj(mine, eq(e.fate, LIVE)), V(ORPHANED), e.fate)
            flags[k][j] = z3.Or(flags[k][j], mine)
    p = with_req(p, victim, status=V(PREEMPTED), num_computed=V(0), num_drafts=V(0), table_len=V(0),
                 table=empty_table(layout))
    c = counters_at(st, victim)
    stale = c.in_flight
    if layout.is_mutant("reset_discards_drained_output_pr42117"):
        stale = ite(lt(c.in_flight, 1), V(1), c.in_flight)
    drop = z3.BoolVal(not layout.is_mutant("reset_delivers_stale_output"))
    p = with_counters(p, victim, stale=stale, drop=drop)
    return with_async(p, victim, placeholders=V(0)) if cfg.rules.output_placeholders else p


def _reset_prefix_cache(layout: Layout, st: SState) -> SState:
    """spec reset_pause._reset_prefix_cache (`BlockPool.reset_prefix_cache`):
    every label dropped (and so every copy rank 0) when no block is held;
    otherwise nothing changes."""
    none_held = conj(*[eq(c, 0) for c in st.pool.ref])
    out = clone(st)
    out.pool.label = [ite(none_held, V(layout.none_label), x) for x in st.pool.label]
    out.pool.copy_rank = [ite(none_held, V(0), x) for x in st.pool.copy_rank]
    return out


def _forget_offers(layout: Layout, st: SState) -> SState:
    """spec reset_pause._forget_offers (`reset_connector_cache`): every
    arrived, unfinished request whose offer is not taken (its load NONE)
    and still > 0 is offered 0 from then on, the ghost `offer_reset` set."""
    out = clone(st)
    rp = out.rp[0]
    for r, q in enumerate(st.reqs):
        if kv_offer(layout, r, True)["external_hit"] <= 0:
            continue
        taken = conj(is_active(q.status, kv=True), eq(load_at(st, r), L_NONE), neg(st.rp[0].forgotten[r]))
        rp.offer_reset[r] = z3.Or(rp.offer_reset[r], taken)
        rp.forgotten[r] = z3.Or(rp.forgotten[r], taken)
    return out


def set_pause(s: SState, code: int) -> SState:
    """spec reset_pause.set_pause (guarded by a change: `rp_transitions`)."""
    out = clone(s)
    out.rp[0].pause = V(code)
    return out


# --- the scheduler's hooks (schedule.py; only in a frame with reset and pause)


def running_budget(layout: Layout, s: SState, budget: Any) -> Any:
    """spec reset_pause.runs_running_loop: under PAUSED_ALL `schedule()`
    starts with a token budget of 0, so the running loop schedules nothing
    and preempts nobody."""
    if not s.rp or layout.is_mutant("paused_all_runs_running_loop"):
        return budget
    return ite(is_paused(s, PAUSED_ALL), V(0), budget)


def waiting_gate(layout: Layout, s: SState, phase: Any) -> Any:
    """spec reset_pause.runs_waiting_loop: the waiting loop admits only when
    UNPAUSED (PAUSED_NEW looks only at `kv_holding_waiting`, empty here)."""
    if not s.rp:
        return phase
    if s.kv:        # PAUSED_NEW: `kv_holding` alone (kv_schedule.py, reset_pause_state.takes_waiting_queue)
        return conj(phase, neg(is_paused(s, PAUSED_ALL)))
    if layout.is_mutant("paused_new_admits_waiting"):
        return conj(phase, neg(is_paused(s, PAUSED_ALL)))
    return conj(phase, is_paused(s, UNPAUSED))


def has_requests(s: SState) -> Any:
    """spec reset_pause.has_requests without sessions: `get_num_unfinished_requests()
    > 0` as the pause counts it (none under PAUSED_ALL, the running ones and,
    beside a connector, `kv_holding`'s under PAUSED_NEW), or a connector's
    finished request held for a transfer."""
    statuses = (WAITING, RUNNING, PREEMPTED, REMOTE_KVS) if s.kv else (WAITING, RUNNING, PREEMPTED)
    active = disj(*[disj(*[eq(q.status, c) for c in statuses]) for q in s.reqs])
    paused_new = disj(lt(0, s.running_len), *([lt(0, s.kv[0].holding_len)] if s.kv else []))
    held = disj(*s.kv[0].held) if s.kv else z3.BoolVal(False)
    counted = ite(is_paused(s, PAUSED_NEW), paused_new, active)
    return disj(held, ite(is_paused(s, PAUSED_ALL), z3.BoolVal(False), counted))
