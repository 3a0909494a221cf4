"""The refinement fuzzer with structured output
(verification/refinement/grammar_machine.py): the reference refines the
spec step by step with grammars that compile or fail at any moment, the
waiting loop's skips, the FSM and (async) the deferred bitmask; each
reference mutant of structured output is caught from a pinned seed."""

from __future__ import annotations

import pytest

from flightcheck.verification.mutants.reference import ALL_MUTANTS, GRAMMAR_MUTANTS, profile_of_mutant
from flightcheck.verification.refinement.grammar_machine import GRAMMAR_FUZZED_PROFILES, grammar_fuzz

pytestmark = pytest.mark.usefixtures("both_checkers")   # a refinement fuzzer: both checkers compared

# mutant -> (seed, steps) of a run that catches it (measured 2026-12-06)
CAUGHT_FROM = {
    "stale_fsm_bitmask_29379": (1, 3000),
    "compiling_grammar_scheduled": (0, 3000),
    "failed_grammar_left_waiting_pr45012": (0, 3000),     # measured 2026-12-08: 0.7 s
}


def test_the_grammar_mutants_are_kept_out_of_the_default_fuzzed_set():
    assert set(GRAMMAR_MUTANTS) == set(CAUGHT_FROM)
    assert not set(GRAMMAR_MUTANTS) & set(ALL_MUTANTS)


@pytest.mark.parametrize("name", list(CAUGHT_FROM))
def test_the_grammar_fuzzer_catches_each_grammar_bug_of_the_reference(name):
    seed, steps = CAUGHT_FROM[name]
    failure = grammar_fuzz(steps, seed, profile_of_mutant(name), mutant=name, shrink=False)
    assert failure is not None, f"{name} survived {steps} steps from seed {seed}"


@pytest.mark.parametrize("profile", GRAMMAR_FUZZED_PROFILES)
def test_the_reference_refines_the_spec_with_structured_output(profile):
    assert grammar_fuzz(300, 1, profile) is None
