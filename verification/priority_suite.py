"""`flightcheck verify --priority` (spec/priority.py): the exhaustive search
of the profile's priority models, every property of each (PR1-PR3 among
them); under PRIORITY_PROFILE the policy's mutants, each on its model, and
the Z3 rows of the priority model (z3/priority_engines.priority_rows). Kept
beside suite.py (at its size limit), whose feature suites it follows; the
verify command calls `run_priority_suite` where it calls `run_suite`."""

from __future__ import annotations

import time

from flightcheck.verification.mutants.priority import PRIORITY_BUGS, PRIORITY_PROFILE
from flightcheck.verification.priority_models import (PRIORITY_PROFILE_MODELS, PRIORITY_UNWRITTEN_MODELS,
                                                       priority_mutant_model)
from flightcheck.verification.suite import Progress, SuiteOptions, SuiteResult, _explicit_feature_suite, counted_suite


def run_priority_suite(options: SuiteOptions, progress: Progress | None = None) -> SuiteResult:
    """The priority suite under `options.profile`, its tasks counted as run_suite counts them."""
    return counted_suite(_priority_suite, options, progress)


# Why `--priority` runs no Z3 engine under a profile other than PRIORITY_PROFILE (z3/priority_models.py).
PRIORITY_EXPLICIT_ONLY = (f"the Z3 encoding of the priority policy covers {PRIORITY_PROFILE} only: this "
                          "profile's priority models are searched exhaustively")


def _priority_suite(options: SuiteOptions, say: Progress) -> SuiteResult:
    """`--priority` (spec/priority.py): the exhaustive search of the profile's
    priority models, every property of each (PR1-PR3 among them), and KV8's
    model where the profile has one (violated under vLLM 0.33's and 0.34's
    rules, with its counterexample; proved under the fix); under
    PRIORITY_PROFILE the policy's mutants, each on its model, and the Z3
    rows of the priority model (z3/priority_engines.priority_rows)."""
    profile = options.profile
    if profile not in PRIORITY_PROFILE_MODELS:
        raise ValueError(f"profile {profile!r} has no priority policy; known: {', '.join(PRIORITY_PROFILE_MODELS)}")
    ours = profile == PRIORITY_PROFILE
    mutants = [(m.name, priority_mutant_model(m.name)) for m in PRIORITY_BUGS] if ours else []
    models = PRIORITY_PROFILE_MODELS[profile] + PRIORITY_UNWRITTEN_MODELS.get(profile, ())   # KV8's rows
    result = _explicit_feature_suite(options, say, "priority", models, mutants, PRIORITY_EXPLICIT_ONLY, priority=True)
    if options.use_z3 and ours:
        from flightcheck.verification.z3.priority_engines import PRIORITY_BMC_DEPTH, priority_rows
        say(f"k-induction and bounded model checking of the Z3 priority model ({profile})")
        t0 = time.perf_counter()
        result.properties += priority_rows(PRIORITY_BMC_DEPTH)
        result.seconds += time.perf_counter() - t0
        result.explicit_only = None
    return result
