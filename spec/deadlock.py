"""L2 and L3 in the safety form a solver can prove, for invariants.py: no
deadlock (with nothing in flight and a request unfinished, a schedule call
moves on) and drain (the oldest batch in flight can always complete).

Abstracted away: time. "Moves on" is one schedule call (within the decode
stagger's calls under async scheduling); the environment's own waits (a KV
transfer to report, a grammar compiling, a streaming session's client) make
L2 hold vacuously, since the scheduler may have to wait for them.
"""

from __future__ import annotations

from dataclasses import replace

from .grammar import grammar_compiling
from .kv_invariants import moves_a_load, transfers_in_flight
from .reset_pause import num_unfinished_requests
from .sessions import waiting_for_input
from .config import Config
from .state import State


def l2_no_deadlock(s: State, cfg: Config) -> bool:
    """L2 as safety: with nothing in flight and a request unfinished, schedule is enabled and forms a batch or preempts (with a KV connector: nothing in flight includes no load or send to be reported; with streaming sessions: no session waiting for input; with structured output, no grammar compiling)."""
    from .schedule import is_empty_step, schedule
    if any(s.in_flight) or not num_unfinished_requests(s) or _waits_on_environment(s):
        return True
    if waiting_for_input(s):              # a session waits for its client: so may the scheduler
        return True
    # vLLM 0.33's empty batches change nothing when they complete: the state
    # they drain to must form a batch or preempt (or start or promote a KV load)
    scheduled = schedule(replace(s, in_flight=()), cfg)
    return not is_empty_step(scheduled) or (scheduled is not None and _moves_a_wait(s, scheduled.state))


def _waits_on_environment(s: State) -> bool:
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
    """L2 under async: with nothing in flight and a request unfinished, schedule forms a batch or preempts within stagger + 1 calls, the empty batches between draining at once (with a KV connector: nothing in flight includes no load or send to be reported; with structured output, no grammar compiling)."""
    from .schedule import is_empty_step, schedule
    if any(s.in_flight) or not num_unfinished_requests(s) or _waits_on_environment(s):
        return True
    if waiting_for_input(s):              # a session waits for its client: so may the scheduler
        return True
    state = replace(s, in_flight=())
    for _ in range(cfg.stagger + 1):
        scheduled = schedule(state, cfg)
        if not is_empty_step(scheduled) or (scheduled is not None and _moves_a_wait(state, scheduled.state)):
            return True
        if scheduled is None:
            return False
        state = replace(scheduled.state, in_flight=())   # the empty batch completes: it changes nothing
    return False
