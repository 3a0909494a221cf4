"""spec/sometimes.py in Z3: each "sometimes" target a cover formula of a
frame (or of a step, or of a frame and its schedule), for BMC to reach; and
the targets of the verification alone (`VERIFICATION_SOMETIMES`), with their
concrete predicates."""

from __future__ import annotations

from typing import Any, Callable

import z3
from flightcheck.spec import Config, State
from flightcheck.spec.schedule import _is_resumption_deferred, is_schedule_enabled
from flightcheck.spec.schedule import schedule as spec_schedule
from flightcheck.spec.sometimes import Sometimes
from flightcheck.verification.z3.encoding.entries import live, live_entries, positions
from flightcheck.verification.z3.encoding.requests import num_tokens
from flightcheck.verification.z3.encoding.schedule import SchedResult
from flightcheck.verification.z3.encoding.state import (
    F_LENGTH,
    F_STOPPED,
    ORPHANED,
    PREEMPTED,
    Layout,
    SState,
)
from flightcheck.verification.z3.encoding.terms import conj, count, disj, div_const, eq, ite, le, lt, neg


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
    return le(2, count(conj(here, e.samples) for _, e, here in live_entries(layout, s, r)))


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
