"""`run_fuzz`: the refinement machine for a fixed number of steps from a
fixed seed, reproducibly; every reference mutant is caught (one seed here,
the full 10-seed matrix behind `slow`); failures come back as short,
replayable programs."""

from __future__ import annotations

import pytest

from flightcheck.reference.mutants import MUTANTS
from flightcheck.verification.refinement.fuzz import PROFILES, FuzzResult, fuzz, list_mutants, run_fuzz

# The default suite catches every mutant within the CI profile's steps from
# one seed; the acceptance matrix (10 seeds, 20,000 steps each) is the slow
# test below and benchmarks/fuzz_kill.py.
KILL_STEPS = 20_000
SEEDS = range(10)


def test_list_mutants_is_the_references_switches():
    assert list_mutants() == list(MUTANTS)


def test_run_fuzz_reports_the_documented_keys():
    out = run_fuzz(50, 3)
    assert set(out) == {"steps", "seed", "mutant", "failed", "failure", "seconds"}
    assert (out["steps"], out["seed"], out["mutant"], out["failed"], out["failure"]) == \
        (50, 3, None, False, None)
    assert out["seconds"] >= 0


def test_the_same_seed_gives_the_same_run():
    a, b = fuzz(400, 7), fuzz(400, 7)
    assert (a.failed, a.steps_run) == (b.failed, b.steps_run) == (False, 400)
    m1 = fuzz(KILL_STEPS, 2, "output_bound_by_name", shrink=False)
    m2 = fuzz(KILL_STEPS, 2, "output_bound_by_name", shrink=False)
    assert m1.failed and (m1.steps_run, m1.failure) == (m2.steps_run, m2.failure)


def test_exit_code_is_zero_without_failure_and_one_with_it():
    assert FuzzResult(10, 0, None, False, None, 0.0).exit_code == 0
    assert FuzzResult(10, 0, None, True, "x", 0.0).exit_code == 1


def test_with_a_mutant_exit_code_is_zero_exactly_when_it_was_caught():
    assert FuzzResult(10, 0, "shared_snapshot", True, "x", 0.0).exit_code == 0
    assert FuzzResult(10, 0, "shared_snapshot", False, None, 0.0).exit_code == 1


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="unknown mutant"):
        fuzz(10, 0, "no_such_mutant")
    with pytest.raises(ValueError, match="at least 1"):
        fuzz(0, 0)


def test_a_caught_mutant_shrinks_to_a_short_replayable_program():
    result = fuzz(KILL_STEPS, 0, "advance_at_completion")
    assert result.failed and result.exit_code == 0
    lines = result.failure.splitlines()
    calls = [line for line in lines if line.startswith("state.") and "teardown" not in line]
    assert calls[0].startswith("state.setup(") and len(calls) <= 4
    assert any(line.startswith("AssertionError: refinement") for line in lines)
    assert "spec actions and abstract states" in result.failure


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_every_mutant_is_caught_within_the_ci_profile(mutant):
    steps = PROFILES["ci"]
    result = fuzz(steps, FAST_SEEDS[mutant], mutant, shrink=False)
    assert result.failed, f"{mutant} survived {steps} steps from seed {FAST_SEEDS[mutant]}"
    assert result.steps_run <= steps


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_every_mutant_is_caught_from_each_of_ten_seeds(mutant, seed):
    result = fuzz(KILL_STEPS, seed, mutant, shrink=False)
    assert result.failed, f"{mutant} survived {KILL_STEPS} steps from seed {seed}"


# For each mutant, the seed (of the ten in the slow test) that kills it
# soonest, measured with `python benchmarks/fuzz_kill.py --json`: the default
# suite stays fast, and every seed kills every mutant within 20,000 steps.
FAST_SEEDS: dict[str, int] = {
    "advance_at_completion": 0,
    "shared_snapshot": 2,
    "final_chunk_from_live_counter": 8,
    "snapshot_omits_prefix_hit": 2,
    "rejections_not_subtracted": 8,
    "decode_while_token_in_flight": 0,
    "stale_output_applied_to_resumed": 1,
    "inflight_set_not_cleared_on_preemption": 6,
    "rejections_subtracted_after_reset": 5,
    "output_bound_by_name": 4,
}


def test_every_mutant_has_a_fast_seed():
    assert set(FAST_SEEDS) == set(MUTANTS)


def test_a_run_does_not_depend_on_what_the_process_imported(tmp_path, monkeypatch):
    """Hypothesis draws now and then from constants in the source of local
    modules already imported; fuzz pins that pool, so importing a module full
    of new constants (as a test session importing the runtime does) changes
    nothing about a seeded run."""
    before = fuzz(3_000, 1, "output_bound_by_name", shrink=False)
    (tmp_path / "constants_galore.py").write_text(
        "TABLE = [" + ", ".join(str(7 + 13 * i) for i in range(200)) + "]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import constants_galore  # noqa: F401  (imported for its constants)
    after = fuzz(3_000, 1, "output_bound_by_name", shrink=False)
    assert (before.failed, before.steps_run) == (after.failed, after.steps_run)
