"""The KV connector's contract: what a connector may promise the scheduler
and when it must report, as named properties of the environment
(docs/kv-connector.md, "Named properties").

The connector is the environment here: its offers (`connector_offer`, read
at schedule time) and its reports (`ReceiveKv`, `FailKvLoad`, `SendKv`)
are the choices the checkers explore. Each clause is a transition property:
it looks at one step, the state before it and the state after, and says
whether the step keeps the clause. A correct connector keeps every clause
in every run; a fabricated connector that breaks one (a report it must not
make, a promise it must not give) is caught by that clause, and a
scheduler that solicits a broken promise (asks again after a load) by the
clause the promise breaks.

* C1_load_promised_once: a request is offered a load at most once. The
  spec's connector serves a request once (`Load.DONE` outlives a
  preemption): a remote (P/D) producer's KV is consumed by its one transfer,
  so a re-admitted request is offered nothing (vLLM #53250, #18232).
* C2_reports_own_blocks: a failure names blocks the connector was given for
  the request's load in flight (`update_state_after_alloc`), within that
  load (block 0 also stands for a request-level `failed_recving`).
* C3_report_once: `finished_recving` once per started load (an aborted or
  failed one too), a failure once per load, `finished_sending` once per
  finished request a producer holds for a send (one that finished by a
  stop or its length), never for a table held for another reason.
* C4_new_incarnation_new_state: a preempted request admitted again is a new
  incarnation for the connector, and what it kept of the old one is never
  reported against the request: while the request waits preempted the
  connector reports nothing of it (under the step fence a victim has no
  batch in flight, so none of its transfers is pending), and a sync load's
  failure is reported only while the entry that carries it is live
  (vLLM #46014).
* C5_send_after_finish: `finished_sending` only for a request that has
  finished: a producer's send (and its timeout) starts at
  `request_finished` (vLLM #26929).

The clauses restate what they check from the state alone: they share no
code with the actions whose guards they restate, so an edit of a guard is
seen by the clause, not hidden by it.

Abstracted away: the connector's worker side and metadata (what it reports
is all the scheduler sees), its statistics and events, the HMA groups and
the encoder connector.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

from .blocks import cdiv
from .config import Config
from .state import Entry, Fate, Load, State, Status


@dataclass(frozen=True)
class Labels:
    """The action labels the clauses look at: transitions.py's classes,
    handed in by it (this module sits below transitions, which registers
    the clauses)."""

    schedule: type
    receive: type
    fail: type
    send: type


Clause = Callable[[Labels, State, State, object, Config], bool]
Property = Callable[[State, State, object, Config], bool]


def _new_batch(before: State, after: State) -> tuple[Entry, ...]:
    """The batch a schedule step queued, if it queued one."""
    return after.in_flight[-1] if len(after.in_flight) > len(before.in_flight) else ()


def _async_load_in_flight(state: State, r: int) -> bool:
    q = state.requests[r]
    return q.status is Status.WAITING_FOR_REMOTE_KVS and q.load is Load.IN_FLIGHT


def _sync_load_entries(state: State, r: int) -> list[Entry]:
    """r's in-flight entries, whatever their fate, that carry a sync load."""
    return [e for batch in state.in_flight for e in batch if e.req == r and e.external > 0]


def _is_report(labels: Labels, action: object) -> bool:
    return isinstance(action, (labels.receive, labels.fail, labels.send))


def _current_load_blocks(state: State, cfg: Config, r: int) -> range:
    """The block indexes of r's table given for its current load: a parked
    async load's `[local hit, num_computed)`, or the sync load of r's live
    entry `[start - external, start)`; empty when r has no current load."""
    q, bs = state.requests[r], cfg.block_size
    if _async_load_in_flight(state, r):
        return range((q.num_computed - q.external) // bs, cdiv(q.num_computed, bs))
    live = [e for e in _sync_load_entries(state, r) if e.fate is Fate.LIVE]
    if q.status is not Status.RUNNING or not live:
        return range(0)
    return range((live[0].start - live[0].external) // bs, cdiv(live[0].start, bs))


def c1_load_promised_once(labels: Labels, before: State, after: State, action: object, cfg: Config) -> bool:
    """C1: a request is offered a load at most once: a schedule step starts a load (an async load parked, a sync load's tokens in the batch it queues) only for a request the connector has not yet served (its load NONE)."""
    if not isinstance(action, labels.schedule) or cfg.kv_connector is None:
        return True
    sync = {e.req for e in _new_batch(before, after) if e.external > 0}
    for r, (b, a) in enumerate(zip(before.requests, after.requests)):
        parked = a.load is Load.IN_FLIGHT and b.load is not Load.IN_FLIGHT
        if (parked or r in sync) and b.load is not Load.NONE:
            return False
    return True


def c2_reports_own_blocks(labels: Labels, before: State, after: State, action: object, cfg: Config) -> bool:
    """C2: a failure names blocks the connector was given for the request's current load, within that load (block 0 of a parked async load is also the request-level failed_recving)."""
    if not isinstance(action, labels.fail):
        return True
    r = action.req
    given = _current_load_blocks(before, cfg, r)
    if not given:
        return True                     # no current load: C3 or C4 speaks
    return action.from_block in given or (action.from_block == 0 and _async_load_in_flight(before, r))


def c3_report_once(labels: Labels, before: State, after: State, action: object, cfg: Config) -> bool:
    """C3: finished_recving once per started load (aborted and failed ones too), a failure once per load, and finished_sending once per finished request a producer holds for a send, never for another."""
    if _is_report(labels, action) and before.requests[action.req].status is Status.PREEMPTED:
        return True                     # C4 speaks
    if isinstance(action, labels.receive):
        return before.requests[action.req].load in (Load.IN_FLIGHT, Load.FAILED)
    if isinstance(action, labels.fail):
        return _async_load_in_flight(before, action.req) or bool(_sync_load_entries(before, action.req))
    if isinstance(action, labels.send):
        q, kv = before.requests[action.req], cfg.kv_connector
        held_for_send = (kv is not None and kv.producer and q.held and q.load not in (Load.IN_FLIGHT, Load.FAILED)
                         and q.status in (Status.FINISHED_STOPPED, Status.FINISHED_LENGTH))
        return not q.status.is_finished or held_for_send
    return True


def c4_new_incarnation_new_state(labels: Labels, before: State, after: State, action: object, cfg: Config) -> bool:
    """C4: what the connector kept of a preempted incarnation is never reported against the request: no report for a request waiting preempted, and a sync load's failure only while the entry that carries it is live (or its request finished)."""
    if not _is_report(labels, action):
        return True
    if before.requests[action.req].status is Status.PREEMPTED:
        return False
    if not isinstance(action, labels.fail) or _async_load_in_flight(before, action.req):
        return True
    loads = _sync_load_entries(before, action.req)
    # a request finished (aborted) since its load's batch was queued has no
    # later incarnation: the connector reports what it knew of that batch
    finished = before.requests[action.req].status.is_finished
    return not loads or finished or any(e.fate is Fate.LIVE for e in loads)


def c5_send_after_finish(labels: Labels, before: State, after: State, action: object, cfg: Config) -> bool:
    """C5: finished_sending only for a request that has finished (a producer's send, and its timeout, start at request_finished)."""
    return not isinstance(action, labels.send) or before.requests[action.req].status.is_finished


# The clauses, by name, in the order they are checked (a step that broke
# two is reported under the first).
_CLAUSES: tuple[tuple[str, Clause], ...] = (
    ("C1_load_promised_once", c1_load_promised_once),
    ("C2_reports_own_blocks", c2_reports_own_blocks),
    ("C3_report_once", c3_report_once),
    ("C4_new_incarnation_new_state", c4_new_incarnation_new_state),
    ("C5_send_after_finish", c5_send_after_finish),
)


def contract_clauses(labels: Labels) -> tuple[tuple[str, Property], ...]:
    """Each clause by name, as a property of one step (before, after,
    action, cfg) over `labels`; its docstring is its statement."""
    def bound(clause: Clause) -> Property:
        return functools.update_wrapper(functools.partial(clause, labels), clause)
    return tuple((name, bound(clause)) for name, clause in _CLAUSES)
