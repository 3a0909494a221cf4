"""The spec state check-trace prints with a violation (`state_before`), in
the trace's own request names.

The spec numbers its requests by slot (spec `describe` writes r0, r1, ...);
a user knows them by the ids their trace gives. This view speaks those ids
(as JSON strings, ASCII only, so that any id prints on one line), lists the
requests that are alive or have entries in flight, in arrival order (a
finished request with nothing in flight can no longer matter, and the
incremental checker may have reused its slot), and marks an older
incarnation of a reused id `(earlier)`. A finished request whose blocks a KV
transfer holds is listed too. Block numbers are the spec's own
(its free queue starts 0, 1, 2, ...), not the trace's `block_ids`.

Layout, as spec `describe`'s: each request `"id":STAT c=computed/tokens
[+drafts d] o=outputs b=[blocks] ...`, then `W=` waiting and `R=` running
(in queue order), with a KV connector `H=` the waiting requests that hold
blocks and `deferred=` the frees behind the step fence, `Q=` the batches in flight, oldest first (an entry
`"id"@start+n`, `*` if it samples, `~o`/`~s` if orphaned or superseded),
and `free=` the free queue.
"""

from __future__ import annotations

from typing import Callable, Iterable

from flightcheck.spec import State
from flightcheck.spec.state import Entry, Fate, Request, describe_request

from .schema import show

Namer = Callable[[int], str]


def describe_named(state: State, slots: Iterable[int], name: Namer) -> str:
    """`state` in one line, listing `slots` (in the order given) and naming
    every request by `name(slot)`."""
    shown = [_request(name(r), q, name) for r in slots if (q := state.requests[r]).status.is_active
             or q.status.is_finished and (state.entries_of(r, fate=None) or transfer_pending(q))]
    batches = ["[" + " ".join(_entry(e, name) for e in batch) + "]" for batch in state.in_flight]
    waiting = ", ".join(name(r) for r in state.waiting)
    running = ", ".join(name(r) for r in state.running)
    return (f"{'; '.join(shown) or '-'} | W=[{waiting}] R=[{running}]{_kv_queues(state, name)}"
            f" | Q={' '.join(batches) or '-'} | free={list(state.pool.free_queue)}")


def _kv_queues(state: State, name: Namer) -> str:
    """A KV connector's queues, as spec `describe` prints them: `H=` the
    waiting requests that hold blocks, `deferred=` the fenced frees,
    `error_frees=` the fail policy's tables waiting for their update's end."""
    held = f" H=[{', '.join(name(r) for r in state.kv_holding)}]" if state.kv_holding else ""
    deferred = f" deferred={[[left, list(table)] for left, table in state.deferred_frees]}" \
        if state.deferred_frees else ""
    failed = f" error_frees={[[left, list(table)] for left, table, _ in state.error_frees]}" \
        if state.error_frees else ""
    return held + deferred + failed


def transfer_pending(q: Request) -> bool:
    """A finished request whose blocks a KV transfer still holds (a send, or
    an aborted load's report): it still matters, and its slot is not reused."""
    return q.held or q.load.in_transfer


def _request(label: str, q: Request, name: Namer) -> str:
    alias = f"(as {name(q.name)})" if q.name is not None else ""
    return f"{label}{alias}:{describe_request(q)}"


def _entry(e: Entry, name: Namer) -> str:
    alias = f"(as {name(e.name)})" if e.name is not None else ""
    return (f"{name(e.req)}{alias}@{e.start}+{e.n}{'*' if e.samples else ''}"
            f"{'' if e.fate is Fate.LIVE else '~' + e.fate.value[0]}")


def quoted(request_id: str) -> str:
    """A request id as messages print it: a JSON string, ASCII only, long ids cut."""
    return show(request_id)
