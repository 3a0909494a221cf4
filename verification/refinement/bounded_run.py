"""One bounded, seeded refinement run of a feature's state machine (the KV
connector's, the priority policy's, structured output's, reset and pause's,
streaming sessions'): `steps` rule steps from `seed`, the reference's mutant
in force if given, the failure as text or None; and the one way each feature
makes its machine for a profile.

The plain fuzzer (fuzz.py) has its own loop, which also reports progress and
bounds Hypothesis' example cache; the features' machines share this one.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

from hypothesis import HealthCheck, Phase, Verbosity
from hypothesis import seed as hypothesis_seed
from hypothesis import settings as hypothesis_settings
from hypothesis.stateful import run_state_machine_as_test

from flightcheck.verification.mutants.patching import reference_applied
from flightcheck.verification.refinement.budget import Budget, BudgetSpent
from flightcheck.verification.refinement.fuzz import _fixed_constant_pool

M = TypeVar("M")


def bounded_run(make_factory: Callable[[Budget], Callable[[], Any]], steps: int, seed: int,
                steps_per_program: int, shrink: bool, mutant: str | None) -> str | None:
    """Run the machine `make_factory(budget)` builds until a failure or
    `steps` rule steps; the failure (the program, shrunk unless `shrink` is
    off, and its message), or None."""
    budget = Budget(steps)
    factory = hypothesis_seed(seed)(make_factory(budget))
    run_settings = hypothesis_settings(max_examples=10**9, stateful_step_count=steps_per_program,
                                       database=None, deadline=None,
                                       phases=(Phase.generate, Phase.shrink) if shrink else (Phase.generate,),
                                       suppress_health_check=list(HealthCheck), print_blob=False,
                                       report_multiple_bugs=False, verbosity=Verbosity.quiet)
    try:
        with _fixed_constant_pool(), reference_applied(mutant):   # a seed names one run
            run_state_machine_as_test(factory, settings=run_settings)
    except BudgetSpent:
        return None
    except Exception as err:
        if not budget.failure_seen and budget.used >= budget.steps:
            return None                       # stopped mid-program by the budget
        notes = [n for n in getattr(err, "__notes__", ()) if not n.startswith("Failing test case")]
        return "\n".join([*notes, f"{type(err).__name__}: {err}"])
    return None


def machine_per_profile(base: type[M], feature: str, profiles: tuple[str, ...]) -> Callable[[str], type[M]]:
    """The feature's machine under a profile, one class per profile (Hypothesis
    keys its rules on the class), refused for a profile the feature's
    fuzzer does not cover, naming the feature and the profiles it does."""
    @functools.cache
    def machine(profile: str) -> type[M]:
        if profile not in profiles:
            raise ValueError(f"no {feature} refinement under {profile}; known: {profiles}")
        return type(f"{base.__name__}[{profile}]", (base,), {"profile": profile})
    return machine


def fuzz_machine(machine: Callable[..., Any], steps: int, seed: int, steps_per_program: int,
                 shrink: bool, mutant: str | None) -> str | None:
    """`bounded_run` of a feature's machine class: each program a fresh
    machine with `mutant` in force, sharing the run's budget, without trace
    checks or tracing."""
    return bounded_run(lambda budget: lambda: machine(mutant, budget, False, False), steps, seed,
                       steps_per_program, shrink, mutant)
