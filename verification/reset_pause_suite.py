"""`flightcheck verify --profile P --reset-pause`: reset and pause's part of
the suite (spec/reset_pause.py, docs/request-states.md): the exhaustive
search of the profile's reset-and-pause model, every invariant, transition
property (RP1-RP4 among them), liveness property and target of it, and,
under `vllm-0.34-async`, every reset-and-pause mutant hunted on its model.
The Z3 encoding has no reset and pause: the explicit search alone checks them."""

from __future__ import annotations

import time
from typing import Callable

from flightcheck.verification.mutants.registry import RESET_PAUSE_MUTANTS
from flightcheck.verification.reset_pause_models import RESET_PAUSE_MODELS, reset_pause_mutant_model

RESET_PAUSE_EXPLICIT_ONLY = "the Z3 encoding has no reset and pause: their models are searched exhaustively"


def reset_pause_suite(options, say: Callable[[str], None]):
    """The suite's rows and mutants for `options.profile` (suite.SuiteOptions)."""
    from flightcheck.verification.suite import SuiteResult, exhaustive_rows, hunt_mutant

    profile = options.profile
    if profile not in RESET_PAUSE_MODELS:
        raise ValueError(f"profile {profile!r} has no reset-and-pause model; known: {', '.join(RESET_PAUSE_MODELS)}")
    t0 = time.perf_counter()
    rows = []
    for small in RESET_PAUSE_MODELS[profile]:
        say(f"exhaustive search of {small.name} ({profile}, reset and pause)")
        rows += exhaustive_rows(small)
    hunted = []
    for name, mutant in RESET_PAUSE_MUTANTS.items():
        if mutant.profile != profile or (options.mutants is not None and name not in options.mutants):
            continue
        say(f"hunting mutant {name} ({profile}, reset and pause)")
        hunted.append(hunt_mutant(name, model=reset_pause_mutant_model(name)))
    return SuiteResult(time.perf_counter() - t0, rows, hunted, profile, reset_pause=True,
                       explicit_only=RESET_PAUSE_EXPLICIT_ONLY if options.use_z3 else None)
