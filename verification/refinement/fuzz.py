"""`flightcheck fuzz`: the refinement machine for a fixed number of rule
steps from a fixed seed.

A run is reproducible (same steps, seed and mutant: same run) and owes
nothing to earlier runs: Hypothesis's example database is off and no
explicit examples are given, so a failure is found afresh, never replayed.
The step budget counts rule steps (arrive, schedule, complete, abort) over
all generated programs; when it is spent without a failure the run stops.
After a failure, shrinking runs unbudgeted and the shrunk program is the
report.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, replace
from typing import Any, Iterator

from flightcheck.reference.profiles import PROFILES as VERSION_PROFILES
from flightcheck.reference.profiles import Profile as VersionProfile
from flightcheck.verification.mutants.patching import reference_applied
from flightcheck.verification.mutants.reference import ALL_MUTANTS, MUTANTS, PROFILE_MUTANTS, profile_of_mutant
from flightcheck.verification.refinement.machine import Budget, BudgetSpent, machine_factory
from hypothesis import HealthCheck, Phase, Verbosity
from hypothesis import seed as hypothesis_seed
from hypothesis import settings as hypothesis_settings
from hypothesis.reporting import with_reporter
from hypothesis.stateful import run_state_machine_as_test

# Rule steps per generated program: long enough to fill a pipeline, preempt
# and resume, short enough that many configurations are tried.
STEPS_PER_PROGRAM = 50

# Named step budgets: `ci` for the default test suite, `thorough` for the
# documented long run (python -m pytest -m slow, or flightcheck fuzz --steps).
PROFILES: dict[str, int] = {"ci": 2_000, "thorough": 100_000}


def list_mutants() -> list[str]:
    """The reference's mutant switches, in definition order."""
    return list(MUTANTS)


def list_profile_mutants() -> dict[str, list[str]]:
    """The mutants of one profile's rules, by profile (fuzzed under it only)."""
    return {profile: list(names) for profile, names in PROFILE_MUTANTS.items()}


def list_profiles() -> list[str]:
    """The version profiles `--profile` may pin (the reference's)."""
    return list(VERSION_PROFILES)


@dataclass
class FuzzResult:
    steps: int
    seed: int
    mutant: str | None
    failed: bool
    failure: str | None
    seconds: float
    steps_run: int = 0                        # rule steps until the first failure (or all)
    seconds_to_failure: float | None = None   # before shrinking
    profiles: tuple[str, ...] = ()            # the version profiles driven, in order

    def to_json(self) -> dict[str, Any]:
        return {"steps": self.steps, "seed": self.seed, "mutant": self.mutant,
                "failed": self.failed, "failure": self.failure,
                "seconds": round(self.seconds, 3), "profiles": list(self.profiles)}

    @property
    def exit_code(self) -> int:
        """0 when nothing failed; with a mutant, 0 exactly when it was caught."""
        if self.mutant is not None:
            return 0 if self.failed else 1
        return 1 if self.failed else 0


@contextlib.contextmanager
def _fixed_constant_pool() -> Iterator[None]:
    """Hypothesis now and then draws a number from the constants it finds in
    the source of every *local* module already imported (its "local
    constants": hypothesis.internal.conjecture.providers). The pool then
    depends on what else the process has imported — the runtime's modules in
    a test session, say — and the same seed gives another run. Pin the pool
    to empty for the run, so a seed names one run. (A private hook: if a
    Hypothesis release drops it, runs stay valid but may again depend on the
    process's imports.)"""
    try:
        from hypothesis.internal.conjecture import providers
        original, empty = providers._get_local_constants, providers.Constants()
        cache = providers.CONSTANTS_CACHE.cache        # drawable constants, computed from the pool
    except (ImportError, AttributeError):
        yield
        return
    providers._get_local_constants = lambda: empty
    cache.clear()
    try:
        yield
    finally:
        providers._get_local_constants = original
        cache.clear()


# Hypothesis keeps the result of every test case it has run (its choices,
# spans and events: ~100 KB for one of our 50-step programs) in a cache of
# 10,000 entries, so that a choice sequence asked for again is not re-run.
# Over a long fuzz run that cache was what grew, ~4.7 KB per rule step (509 MB
# at 100,000 steps). Generation seldom asks again for a sequence (its tree of
# tried prefixes steers it away), so a small cache keeps every verdict; where
# it does (a mutation that rebuilds a program already run) the program now
# runs again, which can move a run onto another path: the kill matrix's
# spot-check found one of 20 runs catching its mutant at another step.
EXAMPLE_CACHE_SIZE = 100


@contextlib.contextmanager
def _bounded_example_cache(size: int | None = None) -> Iterator[None]:
    """Bound Hypothesis's cache of test-case results for the run (read when
    its engine is built). A private constant: if a Hypothesis release drops
    it, runs stay valid but their memory again grows with their length."""
    try:
        from hypothesis.internal.conjecture import engine
        original = engine.CACHE_SIZE
    except (ImportError, AttributeError):
        yield
        return
    engine.CACHE_SIZE = EXAMPLE_CACHE_SIZE if size is None else size
    try:
        yield
    finally:
        engine.CACHE_SIZE = original


# A run without a pinned profile drives every profile the reference models
# (reference/profiles.py PROFILES, in their order: vllm-0.8.5, vllm-0.8.4,
# vllm-0.33, vllm-0.33-async, and any added later). The first, the default,
# runs first; each after it gets one ninth of the steps, run in turn, and the
# default the rest. The default profile's part is then the run it was before
# profiles were fuzzed, cut shorter (6/9 of the steps with four profiles):
# every kill the recorded kill matrix has (seeds 0-19, the latest at step
# 10,825 of 20,000) comes at the same step, and at CI's 2,000 steps each
# later profile's part is a run of 222 steps, the start of the run that
# `--profile` pins to it from the same seed.
PROFILE_SHARE = 9


# Constants the fuzzer's configurations never reach: it keeps chunked prefill
# on and the cache-aware admission window closed (`SchedulerConfig`'s
# defaults), where these rules change nothing (tests/test_admission_rules.py
# checks them; the vLLM campaign's families drive them).
# (The fuzzer's machine has no KV connector and no streaming sessions, so
# the connector's rules and 0.34's session input rule are inert too:
# tests/test_reference_kv_refinement.py and the sessions' machine fuzz them.)
# Nor has it lookahead slots (`num_lookahead_tokens` 0, an n-gram drafter's), so
# `skip_drafts` is never marked (`can_skip_drafts`): the vLLM campaign's
# `--lookahead` drives it (tests/test_vllm_lookahead.py).
INERT_UNDER_FUZZ: dict[str, bool] = {"unchunked_prefill_stops_admission": False,
                                     "threshold_needs_chunked_prefill": False, "cache_aware_admission": False,
                                     "kv_async_waiting_queue": False, "session_input_sets_cache_limit": False,
                                     "skips_unused_drafts": False}


def distinct_rule_sets(profiles: dict[str, VersionProfile]) -> tuple[str, ...]:
    """The first profile of each set of rules the fuzzer can tell apart: a
    profile equal to an earlier one but for its name (vllm-0.34 while its
    rules are 0.33's) or for constants inert under the fuzzer
    (`INERT_UNDER_FUZZ`) would only repeat that one's steps. `--profile`
    still pins it."""
    first_of_rules: dict[VersionProfile, str] = {}
    for name, profile in profiles.items():
        first_of_rules.setdefault(replace(profile, name="", **INERT_UNDER_FUZZ), name)
    return tuple(first_of_rules.values())


DEFAULT_RUN_PROFILES: tuple[str, ...] = distinct_rule_sets(VERSION_PROFILES)

# Each part is generated afresh every GENERATION_STEPS steps: a new
# Hypothesis run from the part's seed plus GENERATION_SEED_STRIDE times the
# restart's index. One Hypothesis run left going for 20,000 steps can stay
# away from a state for good: from seeds 3 and 13 it never preempted a
# request with drafts in flight and then rejected them (the mutant
# rejections_subtracted_after_reset survived), where fresh runs reach it
# (docs/fuzzing.md). A fresh run also starts again with Hypothesis's small
# examples (its first 50 valid programs: a novel prefix, then the simplest
# continuation). 7,000 steps: every kill recorded before step 7,000 (seeds
# 0-19, the latest at 6,929) comes at the same step, and so does every run
# of CI's 2,000 steps.
GENERATION_STEPS = 7_000
GENERATION_SEED_STRIDE = 7_919


def generations(steps: int, seed: int) -> list[tuple[int, int]]:
    """A part's fresh Hypothesis runs: (rule steps, seed), in order."""
    return [(min(GENERATION_STEPS, steps - start), seed + GENERATION_SEED_STRIDE * index)
            for index, start in enumerate(range(0, steps, GENERATION_STEPS))]


def profile_steps(steps: int, profile: str | None = None,
                  shared_by: tuple[str, ...] = DEFAULT_RUN_PROFILES) -> list[tuple[str, int]]:
    """The run's parts: (version profile, rule steps), in the order they run:
    the pinned `profile`'s alone, or the profiles `shared_by` in turn."""
    if profile is not None:
        return [(profile, steps)]
    others = [(name, steps // PROFILE_SHARE) for name in shared_by[1:]]
    first = (shared_by[0], steps - sum(n for _, n in others))
    return [part for part in [first, *others] if part[1] > 0]


@dataclass(frozen=True)
class FuzzSettings:
    """How a run explores, besides its budget, seed and mutant.

    `profile` pins every step to one version profile; without it the steps
    are shared by `shared_by` (`profile_steps`). `allow_name_reuse`: under
    vLLM 0.33 a request may arrive under a finished one's name (machine.py's
    module doc). `shrink`: shrink a failure to a short program (off when only
    the steps to the failure matter)."""
    shrink: bool = True
    check_traces: bool = False
    steps_per_program: int = STEPS_PER_PROGRAM
    profile: str | None = None
    allow_name_reuse: bool = False
    shared_by: tuple[str, ...] = DEFAULT_RUN_PROFILES


@dataclass(frozen=True)
class Part:
    """One fresh Hypothesis run of a fuzz run: its profile, steps and seed."""
    profile: str
    steps: int
    seed: int


def fuzz(steps: int, seed: int, mutant: str | None = None, **settings: Any) -> FuzzResult:
    """Run the refinement machine for `steps` rule steps from `seed`: under
    the version `profile`, or (None) under each profile of `shared_by` (every
    profile the reference models) in turn (`profile_steps`), each part from
    the same seed and generated afresh every GENERATION_STEPS steps
    (`generations`), until one fails. A mutant of one profile's rules
    (verification/mutants/reference.py PROFILE_MUTANTS) runs under that
    profile alone; the mutant's edits are in force for the whole run.
    `settings`: the fields of FuzzSettings."""
    return fuzz_with(steps, seed, mutant, FuzzSettings(**settings))


def _checked_profile(mutant: str | None, profile: str | None) -> str | None:
    """The profile the run is pinned to (a profile mutant's own), or a
    ValueError for an unknown mutant or profile, or a mismatched pair."""
    if mutant is not None and mutant not in ALL_MUTANTS:
        raise ValueError(f"unknown mutant {mutant!r}; known: {', '.join(ALL_MUTANTS)}")
    own_profile = None if mutant is None else profile_of_mutant(mutant)
    if own_profile is not None:
        if profile not in (None, own_profile):
            raise ValueError(f"mutant {mutant!r} is of profile {own_profile!r}, not {profile!r}")
        profile = own_profile
    if profile is not None and profile not in VERSION_PROFILES:
        raise ValueError(f"unknown profile {profile!r}; known: {', '.join(VERSION_PROFILES)}")
    return profile


def run_parts(steps: int, seed: int, profile: str | None,
              shared_by: tuple[str, ...] = DEFAULT_RUN_PROFILES) -> list[Part]:
    """Every fresh Hypothesis run of a fuzz run, in order."""
    return [Part(part_profile, generation_steps, generation_seed)
            for part_profile, part_steps in profile_steps(steps, profile, shared_by)
            for generation_steps, generation_seed in generations(part_steps, seed)]


def fuzz_with(steps: int, seed: int, mutant: str | None, settings: FuzzSettings) -> FuzzResult:
    """`fuzz` with its settings bundled."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    profile = _checked_profile(mutant, settings.profile)
    unknown = [name for name in settings.shared_by if name not in VERSION_PROFILES]
    if unknown:
        raise ValueError(f"unknown profiles {unknown!r}; known: {', '.join(VERSION_PROFILES)}")
    if not settings.shared_by:
        raise ValueError("shared_by names no profile")
    t0 = time.perf_counter()
    steps_before = 0
    profiles_run: list[str] = []
    for part in run_parts(steps, seed, profile, settings.shared_by):
        part_t0 = time.perf_counter()
        if part.profile not in profiles_run:
            profiles_run.append(part.profile)
        budget, failure = _run_part(part, mutant, settings)
        if failure is not None:
            return FuzzResult(steps, seed, mutant, True, failure, time.perf_counter() - t0,
                              steps_before + (budget.steps_to_failure or 0),
                              None if budget.seconds_to_failure is None
                              else part_t0 - t0 + budget.seconds_to_failure,
                              tuple(profiles_run))
        steps_before += budget.used
    return FuzzResult(steps, seed, mutant, False, None, time.perf_counter() - t0, steps_before,
                      profiles=tuple(profiles_run))


def _run_part(part: Part, mutant: str | None,
              settings: FuzzSettings) -> tuple[Budget, str | None]:
    """One Hypothesis run under one profile: its budget and its failure, if any."""
    budget = Budget(part.steps)
    factory = hypothesis_seed(part.seed)(machine_factory(mutant, budget, settings.check_traces,
                                                         part.profile, settings.allow_name_reuse))
    phases = (Phase.generate, Phase.shrink) if settings.shrink else (Phase.generate,)
    run_settings = hypothesis_settings(max_examples=10**9,
                                       stateful_step_count=settings.steps_per_program,
                                       database=None, deadline=None, derandomize=False,
                                       phases=phases, suppress_health_check=list(HealthCheck),
                                       print_blob=False, report_multiple_bugs=False,
                                       verbosity=Verbosity.normal)
    report: list[str] = []
    failure: str | None = None
    # The mutant is applied outside the try: one that no longer applies
    # (MutantNoLongerApplies) is an error of the run, never its kill.
    with reference_applied(mutant):
        try:
            with with_reporter(report.append), _fixed_constant_pool(), _bounded_example_cache():
                run_state_machine_as_test(factory, settings=run_settings)
        except BudgetSpent:
            pass
        except Exception as err:
            if not budget.failure_seen and budget.used >= budget.steps:
                # Stopping mid-program can trip Hypothesis's own consistency checks
                # (a program that stopped earlier than an equal prefix did): an
                # artefact of the budget, not a failure.
                pass
            else:
                failure = _failure_text(report, err)
    return budget, failure


def _failure_text(report: list[str], err: BaseException) -> str:
    """The shrunk program (Hypothesis attaches it to the exception as notes)
    and the failure message."""
    program = [n for n in getattr(err, "__notes__", ()) if not n.startswith("Failing test case")]
    return "\n".join([*report, *program, f"{type(err).__name__}: {err}"])


def run_fuzz(steps: int, seed: int, mutant: str | None = None,
             profile: str | None = None) -> dict[str, Any]:
    """`{"steps", "seed", "mutant", "failed", "failure", "seconds", "profiles"}`
    ("profiles": the version profiles the run drove, in order) for the CLI's
    `flightcheck fuzz --steps N --seed S [--mutant NAME] [--profile NAME] [--json]`."""
    return fuzz(steps, seed, mutant, profile=profile).to_json()
