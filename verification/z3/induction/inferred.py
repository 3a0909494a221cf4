"""Unbounded proofs with no hand-written invariant: candidate facts from a
grammar, and Houdini keeps the inductive ones.

The grammar knows the shape of the state (requests, in-flight entries, the
block pool) and nothing about why the spec is correct. Every candidate is
stated for every request, every entry slot or every block at once (a fact
"for all r", like the parameterised proof's), so the same candidates serve
any number of requests and stages:

    req[G]: A      for every request r with guard G(r), atom A(r)
        G: any | status=S (each of the 7 statuses) | in_flight (an entry of r
           is in flight) | live (a live entry of r is in flight)
        A: f=0 | f>=0 | f>=1 (f: num_output, num_computed, num_drafts,
           table_len) | idle (no entry of r in flight) | no_live |
           f=last.g (f equals r's last live entry's g: start, n, drafts) |
           live<=1 | entries<=1 (entries of r in flight)
    entry: g>=c | g<=c | g<h | g<=h   for every entry in flight (g, h: start,
           n, drafts; c: 0, 1, k)
    block[unlabelled]: ref<=1 | ref=0     block[any]: ref>=0
    held: not_free | ref>=1     (a block in some request's table)
    free: ref=0                  (a block in the free queue)

That is 208 candidates (the number depends only on the statuses and
fields, not on the model's size). `prove_inferred` first drops every
candidate that is false on a state seen on seeded random walks of the
concrete spec (microseconds a candidate and state; Daikon's filter), then
hands the rest, with the spec's invariants, to the k-induction engine's
Houdini loop (`z3.induction.kinduction.prove_by_induction`): a candidate false in the
initial state is dropped, every counterexample to induction drops every
conjunct it breaks, and what is left is inductive. A spec invariant that
survives is proved for every reachable state with an invariant nobody
wrote; one that is dropped is reported unknown with its counterexample to
induction.

Soundness does not depend on the grammar: Houdini's result is an inductive
conjunction that holds initially, whatever the candidates were. Only
completeness does: had the grammar lacked a fact the proof needs, the
invariants resting on it would have been dropped, and said so.
"""

from __future__ import annotations

import random
import time
from typing import Callable, Iterable

import z3
from flightcheck.spec import State, describe
from flightcheck.verification.explicit import search as explicit
from flightcheck.verification.models import Model
from flightcheck.verification.z3.encoding.invariants import INVARIANT_FORMULAS
from flightcheck.verification.z3.encoding.system import System
from flightcheck.verification.z3.induction.grammar import (
    candidates,
    is_candidate,
    predicate,
)
from flightcheck.verification.z3.induction.kinduction import prove_by_induction
from flightcheck.verification.z3.results import EngineResult, EngineVerdict

# -- the proof ------------------------------------------------------------------

def sample_states(model: Model, walks: int, length: int, seed: int = 0) -> list[State]:
    """Distinct states seen on seeded random walks of the concrete spec from
    its initial state (each step to a successor chosen uniformly)."""
    generator = random.Random(seed)
    seen: dict[State, None] = {}
    for _ in range(walks):
        state = explicit.initial(model)
        for _ in range(length):
            successors = [nxt for _, nxt in explicit.successors(model, state)]
            if not successors:
                break
            state = generator.choice(successors)
            seen.setdefault(state, None)
    return list(seen)


def refuted(system: System, names: Iterable[str], states: Iterable[State]) -> dict[str, State]:
    """The candidates false on some of `states` (all reachable, so none of
    these can be an invariant), each with a state it fails on."""
    frame = system.frame("sample")
    formulas = {n: system.build(predicate(n), frame) for n in names}
    out: dict[str, State] = {}
    solver = z3.Solver()
    for state in states:
        solver.push()
        solver.add(system.encode(state, "sample"))
        if solver.check() != z3.sat:
            raise AssertionError(f"a reachable state the encoding cannot represent: {state}")
        values = solver.model()
        solver.pop()
        for n, f in formulas.items():
            if n not in out and z3.is_false(values.eval(f, model_completion=True)):
                out[n] = state
    return out


def prove_inferred(model: Model, invariants: Iterable[str] | None = None, walks: int = 300, length: int = 60,
                   time_budget: float | None = None, jobs: int = 1,
                   progress: Callable[[str], None] | None = None) -> EngineResult:
    """The spec's invariants (default: all) and transition properties by
    1-induction, strengthened by the grammar's candidates that Houdini keeps.

    The candidates false on a state seen on `walks` random walks of `length`
    steps are dropped first (a cheap filter: evaluating a candidate on a
    state takes microseconds, a counterexample to induction seconds); the rest
    go to the Houdini loop. Rows: the spec's properties, then every
    candidate: kept ("proved": an inferred invariant), dropped by Houdini
    ("unknown", with its counterexample to induction) or by a walk
    ("violated", with the state it fails on in the message). `jobs`:
    processes for the Houdini rounds (z3.induction.kinduction)."""
    invariants = list(INVARIANT_FORMULAS if invariants is None else invariants)
    unknown = [n for n in invariants if n not in INVARIANT_FORMULAS]
    if unknown:
        raise ValueError(f"not an invariant of the spec: {', '.join(unknown)}")
    t0 = time.perf_counter()
    tell = progress or (lambda _: None)
    states = sample_states(model, walks, length)
    names = candidates()
    false_on = refuted(System(model), names, states)
    tell(f"{time.perf_counter() - t0:6.1f} s  {len(false_on)} of {len(names)} candidates false on the "
         f"{len(states)} states of {walks} random walks")
    left = [n for n in names if n not in false_on]
    budget = None if time_budget is None else max(1.0, time_budget - (time.perf_counter() - t0))
    result = prove_by_induction(model, 1, invariants,
                                auxiliary=left, time_budget=budget, jobs=jobs,
                                progress=progress)
    rows = result.by_name()
    walked = [EngineVerdict(n, "auxiliary", "violated", "random walks", None, 0.0,
                             message=f"false on {describe(state)}") for n, state in false_on.items()]
    spec = [p for p in result.properties if not is_candidate(p.name)]
    kept = [rows[n] for n in left]
    return EngineResult(result.model, "inferred invariant + " + result.method, time.perf_counter() - t0,
                        result.depth, spec + kept + walked,
                        notes=[f"{len(names)} candidates: {len(false_on)} false on {len(states)} sampled states, "
                               f"{sum(p.status != 'proved' for p in kept)} dropped by Houdini, "
                               f"{sum(p.status == 'proved' for p in kept)} kept"])


__all__ = ["candidates", "is_candidate", "predicate", "prove_inferred", "refuted", "sample_states"]
