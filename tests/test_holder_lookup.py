"""`holder_of` (spec/state.py): the slot that holds a request id now.

A completion under vLLM 0.33/0.34's profiles looks up every entry of its
batch by name (`actions._output_applied`, `_complete_by_name`). The lookup
used to walk every request slot, so checking a realistic trace (hundreds of
requests waiting behind a full engine, a batch of dozens of entries per
step) cost entries x requests per completion: check-trace's seconds per
1,000 events grew with the trace (4.0 at 400 requests, 10.0 at 1,200 on a
vLLM 0.34.0 replay; 2.4 and 2.9 since: flightcheck/vllm/README.md, "At a
deployment's scale"). These tests pin the answer against the plain
definition, on states with reused names, and that a lookup no longer costs
the whole state.
"""

from __future__ import annotations

import random
import time

import pytest

from flightcheck.spec.state import ACTIVE, Request, State, Status, evolve, holder_of

pytestmark = pytest.mark.usefixtures("both_checkers")   # (it names check-trace; it checks no trace itself)

STATUSES = (Status.NEW, Status.WAITING, Status.RUNNING, Status.PREEMPTED, Status.FINISHED_STOPPED,
            Status.FINISHED_ABORTED)


def holder_by_definition(state: State, name: int) -> int | None:
    """The first unfinished slot whose name is `name` (a slot without a name has its own index)."""
    for r, q in enumerate(state.requests):
        if q.status in ACTIVE and (r if q.name is None else q.name) == name:
            return r
    return None


def reachable_names(rng: random.Random, size: int) -> State:
    """Slots as `arrive_as` leaves them: a name is reused only once every
    earlier holder of it finished, so at most one holder is unfinished."""
    requests = [Request()] * size
    for r in range(size):
        status = rng.choice(STATUSES)
        candidates = [n for n in range(size) if n != r and requests[n].name is None
                      and requests[n].status.is_finished
                      and not any(q.status in ACTIVE and q.name == n for q in requests)]
        name = rng.choice(candidates) if candidates and rng.random() < 0.4 else None
        requests[r] = evolve(Request(), status=status, name=name)
    return State(requests=tuple(requests))


def test_holder_matches_its_definition_with_reused_names() -> None:
    rng = random.Random(7)
    for size in (1, 3, 8, 70):            # 70: past request_store's threshold
        for _ in range(60):
            state = reachable_names(rng, size)
            for name in range(-1, size + 1):
                assert holder_of(state, name) == holder_by_definition(state, name), (size, name)


def test_lookup_does_not_walk_the_state() -> None:
    """20,000 unfinished requests, each looked up once, and the finished
    names too: a walk per lookup is 4e8 slot visits (minutes); a lookup in
    constant time (or one index per state) takes milliseconds."""
    size = 20_000
    running = evolve(Request(), status=Status.RUNNING)
    done = evolve(Request(), status=Status.FINISHED_STOPPED)
    state = State(requests=(running,) * (size - 100) + (done,) * 100)
    started = time.process_time()
    found = [holder_of(state, name) for name in range(size)]
    elapsed = time.process_time() - started
    assert found == list(range(size - 100)) + [None] * 100
    assert elapsed < 5.0, f"{size} lookups took {elapsed:.1f} s of CPU: a walk per lookup"
