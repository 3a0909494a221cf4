"""`run_fuzz`: the refinement machine for a fixed number of steps from a
fixed seed, reproducibly; every reference mutant is caught (one seed here,
the full 10-seed matrix behind `slow`); failures come back as short,
replayable programs."""

from __future__ import annotations

import gc
import json
import os

import pytest

from flightcheck.verification.mutants.reference import MUTANTS
from flightcheck.verification.refinement import machine
from flightcheck.verification.refinement.fuzz import (
    DEFAULT_RUN_PROFILES,
    GENERATION_SEED_STRIDE,
    GENERATION_STEPS,
    PROFILES,
    FuzzResult,
    fuzz,
    generations,
    list_mutants,
    profile_steps,
    run_fuzz,
)
from flightcheck.verification.refinement.machine import FUZZED_PROFILES

from .fixtures import load_benchmark

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

# The default suite catches every mutant within the CI profile's steps from
# one seed; the acceptance matrix (10 seeds, 20,000 steps each) is the slow
# test below and benchmarks/fuzz_kill.py.
KILL_STEPS = 20_000
SEEDS = range(10)


def test_list_mutants_is_the_references_switches():
    assert list_mutants() == list(MUTANTS)


def test_run_fuzz_reports_the_documented_keys():
    out = run_fuzz(50, 3)
    assert set(out) == {"steps", "seed", "mutant", "failed", "failure", "seconds", "profiles"}
    assert (out["steps"], out["seed"], out["mutant"], out["failed"], out["failure"]) == \
        (50, 3, None, False, None)
    assert out["seconds"] >= 0
    assert out["profiles"] == list(DEFAULT_RUN_PROFILES)   # 50 steps: 5 for each after the first
    assert run_fuzz(8, 3)["profiles"] == ["vllm-0.8.5"]    # 8 steps: no ninth for another


def test_the_documented_command_drives_all_four_profiles(capsys):
    """Issue 34's acceptance: `flightcheck fuzz --steps 2000 --seed 0 --json`
    with no --profile runs every profile the reference models, and says so."""
    from flightcheck.cli import main
    assert main(["fuzz", "--steps", "2000", "--seed", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["profiles"] == ["vllm-0.8.5", "vllm-0.8.4", "vllm-0.33", "vllm-0.33-async"]
    assert (out["steps"], out["seed"], out["failed"]) == (2_000, 0, False)


def test_the_default_run_drives_every_set_of_rules_the_reference_models():
    from dataclasses import replace

    from flightcheck.reference.profiles import PROFILES as REFERENCE_PROFILES
    from flightcheck.verification.refinement.fuzz import INERT_UNDER_FUZZ

    def rules(profile):
        """A profile's rules as the fuzzer can see them."""
        return replace(profile, name="", **INERT_UNDER_FUZZ)

    driven = [rules(REFERENCE_PROFILES[name]) for name in DEFAULT_RUN_PROFILES]
    assert all(rules(profile) in driven for profile in REFERENCE_PROFILES.values())
    assert len(driven) == len(set(driven))          # no set of rules driven twice
    assert DEFAULT_RUN_PROFILES[:4] == ("vllm-0.8.5", "vllm-0.8.4", "vllm-0.33", "vllm-0.33-async")


def test_a_failed_run_names_the_profiles_up_to_the_failing_part_and_a_pinned_run_its_own():
    killed = fuzz(KILL_STEPS, 0, "advance_at_completion", shrink=False)
    assert killed.failed and killed.profiles == ("vllm-0.8.5",)
    assert fuzz(50, 0, profile="vllm-0.33").profiles == ("vllm-0.33",)
    async_mutant = fuzz(2_000, 0, "async_stagger_ignored", shrink=False)
    assert async_mutant.failed and async_mutant.profiles == ("vllm-0.33-async",)


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
    with pytest.raises(ValueError, match="unknown profile"):
        fuzz(10, 0, profile="vllm-0.0")


def test_a_run_gives_each_fuzzed_profile_its_share_of_the_steps():
    assert FUZZED_PROFILES[0] == DEFAULT_RUN_PROFILES[0] == "vllm-0.8.5"
    assert profile_steps(2_000) == [("vllm-0.8.5", 1_334), ("vllm-0.8.4", 222),
                                    ("vllm-0.33", 222), ("vllm-0.33-async", 222)]
    assert profile_steps(20_000) == [("vllm-0.8.5", 13_334), ("vllm-0.8.4", 2_222),
                                     ("vllm-0.33", 2_222), ("vllm-0.33-async", 2_222)]
    assert profile_steps(5) == [("vllm-0.8.5", 5)]
    assert profile_steps(300, "vllm-0.8.4") == [("vllm-0.8.4", 300)]
    # the split before vLLM 0.33 was fuzzed by default (benchmarks/fuzz_events.py counts so)
    assert profile_steps(2_000, shared_by=("vllm-0.8.5", "vllm-0.8.4")) == \
        [("vllm-0.8.5", 1_778), ("vllm-0.8.4", 222)]
    with pytest.raises(ValueError, match="unknown profiles"):
        fuzz(10, 0, shared_by=("vllm-0.0",))


def test_a_part_is_generated_afresh_every_seven_thousand_steps_from_derived_seeds():
    assert generations(2_000, 3) == [(2_000, 3)]
    assert generations(17_778, 3) == [(7_000, 3), (7_000, 3 + GENERATION_SEED_STRIDE),
                                      (3_778, 3 + 2 * GENERATION_SEED_STRIDE)]
    assert sum(n for n, _ in generations(20_001, 0)) == 20_001


@pytest.mark.slow
def test_a_kill_after_the_first_generation_counts_every_step_before_it():
    """Seed 8 kills rejections_subtracted_after_reset only in its second
    generation (at step 7,793 under vllm-0.8.5): the steps reported are the
    run's, not the generation's. Seed 3 did until the simplest draws
    (a8da50e) made it kill in its first."""
    result = fuzz(2 * GENERATION_STEPS, 8, "rejections_subtracted_after_reset", shrink=False,
                  profile="vllm-0.8.5")
    assert result.failed and GENERATION_STEPS < result.steps_run <= 2 * GENERATION_STEPS


def _configs_built_during(monkeypatch) -> list:
    """Every SchedulerConfig the machine builds a scheduler from, from now on."""
    from flightcheck.verification.refinement import machine
    built: list = []
    original = machine.make_scheduler

    def make_scheduler(cfg, trace):
        built.append(cfg)
        return original(cfg, trace)

    monkeypatch.setattr(machine, "make_scheduler", make_scheduler)
    return built


def test_a_run_drives_the_default_profile_then_each_other_and_a_pinned_one_only_its_own(monkeypatch):
    """The default profile's part first, then 0.8.4's (its preallocation, the
    profile's 64 tokens or a few blocks' worth), then 0.33's and 0.33 async's,
    each profile's configurations in one stretch; `profile=` pins one."""
    built = _configs_built_during(monkeypatch)
    result = fuzz(900, 0)
    assert not result.failed and result.steps_run == 900
    assert result.profiles == DEFAULT_RUN_PROFILES
    profiles = [cfg.profile for cfg in built]
    starts = [profiles.index(name) for name in DEFAULT_RUN_PROFILES]
    assert starts == sorted(starts) and starts[0] == 0
    for name, start, end in zip(DEFAULT_RUN_PROFILES, starts, [*starts[1:], len(profiles)]):
        assert set(profiles[start:end]) == {name}
    first_0_8_4, first_0_33 = starts[1], starts[2]
    assert {cfg.num_preallocate_tokens for cfg in built[:first_0_8_4]} == {0}
    assert all(cfg.num_preallocate_tokens > 0 for cfg in built[first_0_8_4:first_0_33])
    built.clear()
    assert not fuzz(400, 0, profile="vllm-0.8.4").failed
    assert built and {cfg.profile for cfg in built} == {"vllm-0.8.4"}
    assert {cfg.num_preallocate_tokens for cfg in built} > {64}        # 64 and a few blocks' worth


def test_the_default_profiles_part_is_the_run_from_before_profiles_were_fuzzed():
    """Its steps are those of a run pinned to it with the smaller budget (and
    so those of the runs the recorded figures come from)."""
    whole = fuzz(2_000, 2, "shared_snapshot", shrink=False)
    pinned = fuzz(1_334, 2, "shared_snapshot", shrink=False, profile="vllm-0.8.5")
    assert whole.failed and pinned.failed and whole.steps_run == pinned.steps_run <= 1_334
    assert whole.profiles == ("vllm-0.8.5",)


def test_a_later_profiles_part_is_the_start_of_the_run_pinned_to_it():
    """A mutant caught in vllm-0.8.4's part of the default run is caught at
    the step a run pinned to 0.8.4 from the same seed catches it, counted
    after the default profile's part (the same holds for every later part:
    each is its profile's pinned run, cut to its ninth)."""
    key = "kv_cache_manager.py::KVCacheManager._with_preallocation::Not->drop#1"
    from flightcheck.verification.refinement.mutation import MODULES, applied, mutants_of
    mutant = next(m for path in MODULES for m in mutants_of(path) if m.key == key)
    with applied(mutant):
        whole = fuzz(2_000, 0, shrink=False)
        pinned = fuzz(222, 0, shrink=False, profile="vllm-0.8.4")
    assert whole.failed and pinned.failed
    assert whole.profiles == ("vllm-0.8.5", "vllm-0.8.4")
    assert whole.steps_run == 1_334 + pinned.steps_run


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


# rejections_subtracted_after_reset survived 20,000 steps from seeds 3 and
# 13 while a run was one Hypothesis generation (seed 3 was a strict xfail
# here); with a fresh generation every 7,000 steps (fuzz.py GENERATION_STEPS)
# every seed of 0-13 kills it (docs/fuzzing.md): no known survivor is left.


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_every_mutant_is_caught_from_each_of_ten_seeds(mutant, seed):
    result = fuzz(KILL_STEPS, seed, mutant, shrink=False)
    assert result.failed, f"{mutant} survived {KILL_STEPS} steps from seed {seed}"


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(10, 14))
def test_the_orphaned_rejection_is_reached_from_seeds_ten_to_thirteen_too(seed):
    """rejections_subtracted_after_reset needs a request preempted with
    drafts in flight, then a rejection in that orphaned batch: seed 13 never
    reached it in one 20,000-step Hypothesis run; every seed of 0-13 does now."""
    result = fuzz(KILL_STEPS, seed, "rejections_subtracted_after_reset", shrink=False)
    assert result.failed, f"survived {KILL_STEPS} steps from seed {seed}"


# For each mutant, the seed (of the ten in the slow test) that kills it
# soonest, measured with `python benchmarks/fuzz_kill.py --json`: the default
# suite stays fast, and every seed kills every mutant within 20,000 steps.
FAST_SEEDS: dict[str, int] = {
    "advance_at_completion": 0,
    "shared_snapshot": 5,
    "final_chunk_from_live_counter": 5,
    "snapshot_omits_prefix_hit": 0,
    "rejections_not_subtracted": 0,
    "decode_while_token_in_flight": 0,
    "stale_output_applied_to_resumed": 1,
    "inflight_set_not_cleared_on_preemption": 5,
    "rejections_subtracted_after_reset": 6,
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


# -- memory: a long run does not keep what it ran -----------------------------------

def _runners_built_during(monkeypatch) -> list:
    """Every Hypothesis engine built from now on, so a test can look inside."""
    from hypothesis.internal.conjecture import engine
    runners: list = []
    original_init = engine.ConjectureRunner.__init__

    def init(self, *args, **kwargs) -> None:
        original_init(self, *args, **kwargs)
        runners.append(self)

    monkeypatch.setattr(engine.ConjectureRunner, "__init__", init)
    return runners


def test_a_run_keeps_at_most_the_bounded_number_of_test_case_results(monkeypatch):
    """Hypothesis's cache of test-case results held every program a run tried
    (~100 KB each: 509 MB at 100,000 steps); fuzz bounds it. Fails if a
    Hypothesis release stops reading the bound, instead of growing silently."""
    from flightcheck.verification.refinement import fuzz as fuzz_module
    monkeypatch.setattr(fuzz_module, "EXAMPLE_CACHE_SIZE", 3)
    runners = _runners_built_during(monkeypatch)
    result = fuzz(600, 0)
    assert not result.failed and result.steps_run == 600
    # One Hypothesis run per profile's part of the steps (fuzz.profile_steps):
    # every one bounded; the first (402 steps) runs more programs than are kept.
    assert len(runners) == len(profile_steps(600)) == 4
    assert runners[0].call_count > 3
    for runner in runners:
        assert 0 < len(runner._ConjectureRunner__data_cache) <= 3


def test_the_bound_is_lifted_after_the_run():
    from hypothesis.internal.conjecture import engine
    before = engine.CACHE_SIZE
    fuzz(50, 0)
    assert engine.CACHE_SIZE == before


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads /proc")
def test_memory_stays_flat_over_twenty_thousand_steps(monkeypatch):
    """Resident memory from step 10,000 to step 20,000 grows by less than
    20 MB (before the bound: ~47 MB, ~4.7 KB a step, with no end; with it
    ~0.5 KB a step remains: Hypothesis's tree of the choice sequences tried,
    which steers generation and so stays). The run's steps are counted
    across its budgets: each profile's part and generation has its own."""
    from flightcheck.verification.refinement import machine
    resident: dict[int, int] = {}
    run_steps = [0]
    original_tick = machine.Budget.tick

    def tick(self) -> None:
        used_before = self.used
        original_tick(self)
        run_steps[0] += self.used - used_before
        if run_steps[0] in (10_000, 20_000) and run_steps[0] not in resident:
            gc.collect()
            resident[run_steps[0]] = _resident_bytes()

    monkeypatch.setattr(machine.Budget, "tick", tick)
    assert not fuzz(20_000, 1).failed
    growth = resident[20_000] - resident[10_000]
    assert growth < 20 * 2**20, f"{growth / 2**20:.1f} MB"


# -- benchmarks/fuzz_events.py: the event counts docs/fuzzing.md quotes ------------

def test_the_event_counter_counts_a_run_and_puts_the_machine_back(capsys):
    module = load_benchmark("fuzz_events")
    checked = machine.RefinementMachine._check
    assert module.main(["--steps", "400", "--seeds", "1", "--json"]) == 0
    counts = json.loads(capsys.readouterr().out)
    assert machine.RefinementMachine._check is checked
    assert counts["steps"] >= 400 and 0 < counts["sampled_outcomes"]
    assert counts["no_draft_outcomes"] <= counts["sampled_outcomes"]
    assert counts.get("last_drafting_alone", 0) <= counts.get("last_drafting", 0)
    # the same seed counts the same again
    assert module.main(["--steps", "400", "--seeds", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == counts


def test_the_resume_window_brings_stale_outputs_back_to_resumed_requests(capsys):
    """The machine's resume window (an abort of a running request while a
    preempted one's sampling entry is in flight) is what lets that request
    resume before its stale output returns, the event
    stale_output_applied_to_resumed needs: seed 2, 3,000 steps, 4 such
    outputs with the window and none with it closed. The window is put back."""
    module = load_benchmark("fuzz_events")
    window = machine.RefinementMachine._resume_window

    def counts(*extra: str) -> dict[str, int]:
        assert module.main(["--steps", "3000", "--seeds", "1", "--first-seed", "2", "--json",
                            *extra]) == 0
        return json.loads(capsys.readouterr().out)

    opened, closed = counts(), counts("--without-resume-window")
    assert machine.RefinementMachine._resume_window is window
    assert opened["window_aborts"] > 0 and closed.get("window_aborts", 0) == 0
    assert opened.get("stale_on_running_sampled", 0) > closed.get("stale_on_running_sampled", 0)
    assert opened["stale_on_running_sampled"] <= opened["stale_on_running"]


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--seeds", "-1"], ["--first-seed", "x"]])
def test_the_event_counter_refuses_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        load_benchmark("fuzz_events").main(argv)
    assert exit_.value.code == 2 and argv[0] in capsys.readouterr().err
