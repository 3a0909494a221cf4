"""`flightcheck verify --prefill-cadence` (spec/cadence.py): the exhaustive
search of the profile's cadence models, every property of them (CAD1-CAD3
among them); under CADENCE_PROFILE the cadence's mutants, each on its
model (cadence-k2, or cadence-prio-k2: `cadence_mutant_model`); and the Z3
rows of cadence-k2 (z3/cadence_engines.cadence_rows: CAD1-CAD3 by
k-induction and one step, and by BMC). Kept beside suite.py (at its size
limit), whose feature suites it follows, as priority_suite.py is; the
verify command calls `run_cadence_suite` where it calls `run_suite`."""

from __future__ import annotations

import time

from flightcheck.verification.cadence_models import CADENCE_MODELS, cadence_mutant_model
from flightcheck.verification.mutants.cadence import CADENCE, CADENCE_PROFILE
from flightcheck.verification.suite import Progress, SuiteOptions, SuiteResult, _explicit_feature_suite, counted_suite


def run_cadence_suite(options: SuiteOptions, progress: Progress | None = None) -> SuiteResult:
    """The cadence suite under `options.profile`, its tasks counted as run_suite counts them."""
    return counted_suite(_cadence_suite, options, progress)


# Why `--prefill-cadence` runs no Z3 engine under a profile the Z3 model does not cover (none of the four today).
CADENCE_EXPLICIT_ONLY = "the Z3 model of the prefill cadence does not cover this profile: its model is searched exhaustively"


def _cadence_suite(options: SuiteOptions, say: Progress) -> SuiteResult:
    """`--prefill-cadence`: the exhaustive search of the profile's cadence
    models; under CADENCE_PROFILE the cadence's mutants, each hunted on its
    model; unless --no-z3, CAD1-CAD3 by k-induction and BMC on
    cadence-k2 under the profile's synchronous rules."""
    from flightcheck.verification.z3.cadence_engines import CAD_ENCODED_PROFILE, cadence_rows
    profile = options.profile
    if profile not in CADENCE_MODELS:
        raise ValueError(f"profile {profile!r} has no prefill cadence; known: {', '.join(CADENCE_MODELS)}")
    mutants = [(m.name, cadence_mutant_model(m.name)) for m in CADENCE] if profile == CADENCE_PROFILE else []
    result = _explicit_feature_suite(options, say, "prefill cadence", CADENCE_MODELS[profile], mutants,
                                     CADENCE_EXPLICIT_ONLY, prefill_cadence=True)
    if options.use_z3 and profile in CAD_ENCODED_PROFILE:
        say(f"k-induction and bounded model checking of the Z3 cadence model ({profile})")
        t0 = time.perf_counter()
        result.properties += cadence_rows(profile)
        result.seconds += time.perf_counter() - t0
        result.explicit_only = None
    return result
