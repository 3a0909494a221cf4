"""The campaign's structured-output feature (features.py; docs/request-states.md,
"Structured output"): in a seeded share of the workloads, some requests ask
for structured output, each with its fabricated grammar's compile delay (in
`schedule()` calls) and, one in five, a compile failure
(grammar_workload.py). vLLM 0.33.0 and 0.34.0 only (the releases whose
engine loop the bridge copies with its deferred sampling), beside a KV
connector too (its waiting loop skips a request whose grammar compiles
before it asks the connector: `_handle_blocked_waiting_request`).

Standard library only.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, TypeVar

from .features import Feature
from .versions import BATCH_QUEUE_V033_LOOPS, RELEASES

T = TypeVar("T")


class Picker(Protocol):                        # generate.Picker
    def integer(self, low: int, high: int) -> int: ...

    def choice(self, options: Sequence[T]) -> T: ...


def grammar_versions() -> tuple[str, ...]:
    """The releases the replay drives structured output on."""
    return tuple(r.version for r in RELEASES.values() if r.engine_loop in BATCH_QUEUE_V033_LOOPS)


def with_grammars(pick: Picker, workload: dict[str, Any]) -> None:
    """Each request, one in two (at least one), asks for structured output."""
    requests = workload["requests"]
    chosen = [pick.choice([False, True]) for _ in requests]
    if requests and not any(chosen):
        chosen[pick.integer(0, len(requests) - 1)] = True
    for request, structured in zip(requests, chosen):
        if structured:
            request["grammar"] = {"compile_steps": pick.choice([0, 0, 1, 2, 3, 5]),
                                  "fails": pick.integer(1, 5) == 1}


# Beside a KV connector since the spec's connector loop skips a request
# whose grammar compiles, as vLLM's and the reference's do (docs/request-states.md,
# "Features together"). Beside the priority policy since check-trace
# records a failed grammar at the noted empty schedule() call that met it
# under async scheduling too (campaign --all-features seed 6 index 87: a
# later arrival ranked ahead of it; docs/request-states.md, "Features together").
FEATURE = Feature("grammar", grammar_versions(), 0.5, with_grammars)
