"""The features' refinement machines by name, as `flightcheck fuzz --feature
NAME` runs them (the KV connector's has its own flag, `--kv-connector`):
each name's fuzz function (`bounded_run.fuzz_machine` of its machine), the
profiles it covers and its reference mutants (verification/mutants/reference.py).

A run without a mutant drives each of the feature's profiles in turn, a
share of the steps each (as `--kv-connector` does), or `profile` alone; a run
with a mutant drives the mutant's own profile (or `profile`), every step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from flightcheck.verification.mutants import reference as mutants
from flightcheck.verification.refinement.cadence_kv_machine import CADENCE_KV_FUZZED_PROFILES, cadence_kv_fuzz
from flightcheck.verification.refinement.grammar_machine import GRAMMAR_FUZZED_PROFILES, grammar_fuzz
from flightcheck.verification.refinement.lora_machine import LORA_FUZZED_PROFILES, lora_fuzz
from flightcheck.verification.refinement.priority_machine import PRIORITY_FUZZED_PROFILES, priority_fuzz
from flightcheck.verification.refinement.priority_sessions_machine import (PRIORITY_SESSIONS_FUZZED_PROFILES,
                                                                            priority_sessions_fuzz)
from flightcheck.verification.refinement.reset_pause_machine import RESET_PAUSE_FUZZED_PROFILES, reset_pause_fuzz
from flightcheck.verification.refinement.sessions_machine import SESSIONS_FUZZED_PROFILES, sessions_fuzz


@dataclass(frozen=True)
class FeatureFuzzer:
    fuzz: Callable[..., str | None]     # (steps, seed, profile, mutant=...) -> the failure, or None
    profiles: tuple[str, ...]           # the profiles its machine covers
    mutants: tuple[str, ...]            # its reference mutants (verification/mutants/reference.py)


FEATURE_FUZZERS: dict[str, FeatureFuzzer] = {
    "priority": FeatureFuzzer(priority_fuzz, PRIORITY_FUZZED_PROFILES, tuple(mutants.PRIORITY_MUTANTS)),
    "grammar": FeatureFuzzer(grammar_fuzz, GRAMMAR_FUZZED_PROFILES, tuple(mutants.GRAMMAR_MUTANTS)),
    "streaming-sessions": FeatureFuzzer(sessions_fuzz, SESSIONS_FUZZED_PROFILES, tuple(mutants.SESSION_MUTANTS)),
    "reset-pause": FeatureFuzzer(reset_pause_fuzz, RESET_PAUSE_FUZZED_PROFILES, tuple(mutants.RESET_PAUSE_MUTANTS)),
    "lora": FeatureFuzzer(lora_fuzz, LORA_FUZZED_PROFILES, tuple(mutants.LORA_MUTANTS)),
    "priority-sessions": FeatureFuzzer(priority_sessions_fuzz, PRIORITY_SESSIONS_FUZZED_PROFILES,
                                       tuple(mutants.PRIORITY_SESSION_MUTANTS)),
    # the prefill cadence beside the KV connector: no reference mutant of its own
    "cadence-kv": FeatureFuzzer(cadence_kv_fuzz, CADENCE_KV_FUZZED_PROFILES, ()),
}


def feature_fuzz(feature: str, steps: int, seed: int, mutant: str | None, profile: str | None) -> dict[str, Any]:
    """One run of `feature`'s machine (the module doc); `--json`'s object."""
    fuzzer = FEATURE_FUZZERS[feature]
    if profile is None and mutant is not None:
        profile = mutants.profile_of_mutant(mutant)
    profiles = [profile] if profile else list(fuzzer.profiles)
    started, failure, ran = time.perf_counter(), None, []
    for index, each in enumerate(profiles):
        share = steps // len(profiles) + (index < steps % len(profiles))
        if share == 0:
            continue
        ran.append(each)
        failure = fuzzer.fuzz(share, seed, each, mutant=mutant)
        if failure:
            break
    return {"feature": feature, "mutant": mutant, "steps": steps, "seed": seed,
            "profiles": ran, "failed": failure is not None, "failure": failure,
            "seconds": round(time.perf_counter() - started, 3)}
