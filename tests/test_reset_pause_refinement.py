"""The refinement fuzzer with resets and pauses
(verification/refinement/reset_pause_machine.py): the reference refines the
spec step by step with `reset_prefix_cache` (with and without the running
requests) and every pause state between any two steps; each reference
mutant of reset and pause is caught from a pinned seed."""

from __future__ import annotations

import pytest

from flightcheck.verification.mutants.reference import ALL_MUTANTS, RESET_PAUSE_MUTANTS, profile_of_mutant
from flightcheck.verification.refinement.reset_pause_machine import RESET_PAUSE_FUZZED_PROFILES, reset_pause_fuzz

pytestmark = pytest.mark.usefixtures("both_checkers")   # a refinement fuzzer: both checkers compared

# mutant -> (seed, steps) of a run that catches it (measured 2026-12-06: 0.5 to 2 s each)
CAUGHT_FROM = {
    "reset_delivers_stale_output": (2, 3000),
    "paused_all_runs_running_loop": (1, 3000),
    "paused_new_admits_waiting": (2, 3000),
}


def test_the_reset_pause_mutants_are_kept_out_of_the_default_fuzzed_set():
    assert set(RESET_PAUSE_MUTANTS) == set(CAUGHT_FROM)
    assert not set(RESET_PAUSE_MUTANTS) & set(ALL_MUTANTS)


@pytest.mark.parametrize("name", list(CAUGHT_FROM))
def test_the_reset_pause_fuzzer_catches_each_bug_of_the_reference(name):
    seed, steps = CAUGHT_FROM[name]
    failure = reset_pause_fuzz(steps, seed, profile_of_mutant(name), mutant=name, shrink=False)
    assert failure is not None, f"{name} survived {steps} steps from seed {seed}"


@pytest.mark.parametrize("profile", RESET_PAUSE_FUZZED_PROFILES)
def test_the_reference_refines_the_spec_with_resets_and_pauses(profile):
    assert reset_pause_fuzz(300, 1, profile) is None
