"""L2 and L3 in the safety form a solver can prove, for invariants.py: no
deadlock (with nothing in flight and a request unfinished, a schedule call
moves on) and drain (the oldest batch in flight can always complete).

Abstracted away: time. "Moves on" is one schedule call (within the decode
stagger's calls under async scheduling); the environment's own waits (a KV
transfer to report, a grammar compiling) make L2 hold vacuously, since the
scheduler may have to wait for them.

A streaming session's client is the environment too, but only for what its
parked session holds (`_waits_on_a_client`). An idle with a session parked
in WAITING_FOR_STREAMING_REQ is the client's (not a stall) when
* nothing but parked sessions is unfinished: vLLM's
  `get_num_unfinished_requests` (0.33.0/0.34.0 scheduler.py) leaves them
  out, so the engine does not even step until an input comes; or
* nothing runs and every request waits for admission, and the end of the
  parked sessions would let schedule move on: what stops the waiting loop
  is the seats they hold (`Scheduler.schedule`: `len(self.running) +
  self.num_waiting_for_streaming_input >= max_num_active_reqs`) or their
  KV blocks (`_handle_stopped_request` frees none; the waiting loop's
  `allocate_slots` fails and it breaks), which only their clients give
  back (the next turn runs and parks again; the end frees them).
Any other idle is a stall, a session parked or not: a running request not
scheduled (the running loop reads neither the seat count nor a parked
session's blocks: it preempts when blocks are short), or a waiting request
that the parked sessions' seats and blocks, given back, would still not
admit (blocks held by sessions whose next input already came, a seat
counted for no slot, ...).
"""

from __future__ import annotations

from dataclasses import replace

from .grammar import grammar_compiling
from .kv_invariants import moves_a_load, transfers_in_flight
from .reset_pause import num_unfinished_requests
from .sessions import end_parked_sessions, waiting_for_input
from .config import Config
from .state import State, Status


def l2_no_deadlock(s: State, cfg: Config) -> bool:
    """L2 as safety: with nothing in flight and a request unfinished, schedule is enabled and forms a batch or preempts (with a KV connector: nothing in flight includes no load or send to be reported; with streaming sessions: unless nothing runs and the end of the sessions waiting for input would let it move on; with structured output, no grammar compiling)."""
    if any(s.in_flight) or not _has_unfinished(s) or waits_on_environment(s):
        return True
    return _moves_on(s, cfg) or (_waits_on_a_client(s) and _moves_on(_parked_ended(s, cfg), cfg))


def _moves_on(s: State, cfg: Config) -> bool:
    """One schedule call from s, its empty batches drained, forms a batch or
    preempts, or moves a wait on. (vLLM 0.33's empty batches change nothing
    when they complete: the state they drain to must form a batch or preempt,
    or start or promote a KV load.)"""
    from .schedule import is_empty_step, schedule
    scheduled = schedule(replace(s, in_flight=()), cfg)
    return not is_empty_step(scheduled) or (scheduled is not None and _moves_a_wait(s, scheduled.state))


def _waits_on_a_client(s: State) -> bool:
    """A session waits for its client's input while nothing runs: every
    unfinished request waits for the waiting loop, whose admission the
    parked sessions' seats and blocks can stop (module docstring)."""
    return not s.running and waiting_for_input(s) > 0


def parked_sessions_hold_the_way(s: State, cfg: Config) -> bool:
    """The idle of s is the clients' wait of the module docstring's second
    case: nothing runs, a session is parked, and with the parked sessions
    ended schedule moves on within stagger + 1 calls (trace checker: a run
    that ends so is no stall either)."""
    return _waits_on_a_client(s) and _moves_on_within_stagger(_parked_ended(s, cfg), cfg)


def idles_on_clients(s: State, cfg: Config) -> bool:
    """s idles (schedule neither forms a batch nor preempts nor moves a wait
    on within stagger + 1 calls) and the idle is the clients' of the
    sessions parked for input (the module docstring's two cases). What a
    run that ends in s waits on; an idle from which schedule would move on
    is a stall whatever is parked (trace checker, sessions.py)."""
    if not waiting_for_input(s):
        return False
    s = _past_waits_moved(s, cfg)
    if _moves_on_within_stagger(s, cfg):
        return False
    return not any(q.status.is_active and q.status is not Status.WAITING_FOR_STREAMING_REQ for q in s.requests) \
        or parked_sessions_hold_the_way(s, cfg)


def _past_waits_moved(s: State, cfg: Config) -> State:
    """s after the schedule calls that form nothing and only move a wait on
    (a grammar ready promoted to WAITING: vLLM 0.33.0/0.34.0
    `Scheduler.schedule`'s waiting loop, `_handle_blocked_waiting_request`),
    at most one a request: what the scheduler's next calls reach by
    themselves. A promotion that admits nothing is no moving on (seed 409
    index 106 of the hunt over seeds 403-409, 0.33.0: r2's grammar ready at
    the end, r2 behind the blocks of a session whose client never ends it)."""
    from .schedule import is_empty_step, schedule
    state = replace(s, in_flight=())
    for _ in range(len(s.requests)):
        scheduled = schedule(state, cfg)
        if scheduled is None or not is_empty_step(scheduled) or not _moves_a_wait(state, scheduled.state):
            break
        state = replace(scheduled.state, in_flight=())
    return state


def _parked_ended(s: State, cfg: Config) -> State:
    """s after the clients of the parked sessions ended them (what they hold
    given back), nothing in flight."""
    from .actions import finish_request
    return end_parked_sessions(replace(s, in_flight=()), cfg, finish_request)


def waits_on_environment(s: State) -> bool:
    """A KV transfer is still to be reported, or a grammar still compiles:
    the scheduler alone may have to wait (its report or event ends the wait);
    or a failed grammar is recorded, which the next completion finishes (an
    empty batch's completion then changes something)."""
    return transfers_in_flight(s) or grammar_compiling(s) or bool(s.grammar_errors)


def _moves_a_wait(before: State, after: State) -> bool:
    """An empty step still moves on: it starts or promotes a KV load, or
    meets a failed grammar (which the empty batch's completion finishes)."""
    return moves_a_load(before, after) or bool(after.grammar_errors - before.grammar_errors)


def l3_drain(s: State, cfg: Config) -> bool:
    """L3 as safety: the oldest in-flight batch can always be consumed (complete_oldest is enabled)."""
    from .actions import Sample, can_complete_oldest, sampling_entries
    if not s.in_flight:
        return True
    samples = tuple(Sample() for _ in sampling_entries(s, cfg))
    return can_complete_oldest(s, cfg, samples)   # complete_oldest's guard: is it enabled?


def l2_async_no_deadlock(s: State, cfg: Config) -> bool:
    """L2 under async: with nothing in flight and a request unfinished, schedule forms a batch or preempts within stagger + 1 calls, the empty batches between draining at once (with a KV connector: nothing in flight includes no load or send to be reported; with streaming sessions: unless nothing runs and the end of the sessions waiting for input would let it move on; with structured output, no grammar compiling)."""
    if any(s.in_flight) or not _has_unfinished(s) or waits_on_environment(s):
        return True
    return _moves_on_within_stagger(s, cfg) or parked_sessions_hold_the_way(s, cfg)


def _has_unfinished(s: State) -> bool:
    """vLLM's `has_unfinished_requests()` (0.33.0/0.34.0
    v1/core/sched/interface.py): `get_num_unfinished_requests() > 0`. Under
    PAUSED_NEW the count is the running and KV-holding requests less the
    parked sessions, which sit in `waiting`, so it can go below 0: no
    request unfinished, and the engine has no step to take (the hunt over
    seeds 417-423, seed 419 index 95 of its sixth pass, 0.33.0 async: a
    pause with only a parked session and a new request waiting was taken
    for a stall, -1 read as a count)."""
    return num_unfinished_requests(s) > 0


def _moves_on_within_stagger(s: State, cfg: Config) -> bool:
    """Schedule forms a batch or preempts (or moves a wait on) within
    stagger + 1 calls from s, each call's empty batch completing at once."""
    from .schedule import is_empty_step, schedule
    state = replace(s, in_flight=())
    for _ in range(cfg.stagger + 1):
        scheduled = schedule(state, cfg)
        if not is_empty_step(scheduled) or (scheduled is not None and _moves_a_wait(state, scheduled.state)):
            return True
        if scheduled is None:
            return False
        state = replace(scheduled.state, in_flight=())   # the empty batch completes: it changes nothing
    return False
