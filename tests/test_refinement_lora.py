"""The refinement fuzzer with LoRA's max_loras cap and prompt logprobs
(verification/refinement/lora_machine.py): the reference refines the spec
step by step with requests of several LoRAs under a cap and requests that
ask for prompt logprobs beside cached prefixes; each reference mutant of the
feature is caught from a pinned seed by the property the spec's mutant of
the same name is killed by (verification/mutants/lora.py)."""

from __future__ import annotations

import pytest

from flightcheck import spec
from flightcheck.spec import lora
from flightcheck.verification.mutants.lora import LORA
from flightcheck.verification.mutants.reference import ALL_MUTANTS, LORA_MUTANTS, profile_of_mutant
from flightcheck.verification.refinement import lora_machine
from flightcheck.verification.refinement.lora_machine import LORA1, LORA_FUZZED_PROFILES, STEP_PROPERTIES, lora_fuzz

pytestmark = pytest.mark.usefixtures("both_checkers")   # a refinement fuzzer: both checkers compared

# mutant -> (seed, property that names the kill) of a run that catches it within
# 3,000 steps (measured 2026-12-07: 0.2 to 0.6 s of CPU each)
CAUGHT_FROM = {
    "lora_no_admission_cap_issue14495": (8, "LORA1_loras_within_cap"),
    "lora_cap_stops_admission_pr15422": (4, "LORA2_held_request_is_passed_over"),
    "lora_cap_counts_scheduled_running_v0_8_5": (8, "LORA1_loras_within_cap"),
    "prompt_logprobs_read_prefix_cache_issue3251": (3, "PL1_prompt_logprobs_read_no_cache"),
}


def test_the_lora_mutants_are_the_spec_ones_and_kept_out_of_the_default_fuzzed_set():
    assert set(LORA_MUTANTS) == set(CAUGHT_FROM) == {m.name for m in LORA}
    assert not set(LORA_MUTANTS) & set(ALL_MUTANTS)


def test_each_kill_is_by_the_property_that_kills_the_spec_mutant_of_its_name():
    assert {m.name: m.killed_by for m in LORA} == {name: prop for name, (_, prop) in CAUGHT_FROM.items()}


def test_the_properties_held_to_the_reference_are_the_specs():
    cfg = spec.Config(num_stages=2, max_num_batched_tokens=8, max_num_seqs=2, block_size=2, num_blocks=8,
                      max_model_len=8, profile="vllm-0.34", max_loras=1, prompt_logprobs=True)
    assert LORA1 in {i.name for i in spec.invariants_for(cfg)}
    assert set(STEP_PROPERTIES) <= {p.name for p in spec.transition_properties_for(cfg)}


@pytest.mark.parametrize("name", list(CAUGHT_FROM))
def test_the_lora_fuzzer_catches_each_lora_bug_of_the_reference_by_its_property(name):
    seed, prop = CAUGHT_FROM[name]
    failure = lora_fuzz(3000, seed, profile_of_mutant(name), mutant=name, shrink=False)
    assert failure is not None, f"{name} survived 3000 steps from seed {seed}"
    assert prop in broken_by_the_reference(failure), failure[-2000:]


def broken_by_the_reference(failure: str) -> list[str]:
    """The properties a failure names as broken by the reference's own step."""
    line = next((x for x in failure.splitlines() if " broken by the reference's `" in x), "")
    return line.removeprefix("AssertionError: ").split(" broken by")[0].split(", ") if line else []


def test_the_reference_refines_the_spec_with_a_lora_cap_and_prompt_logprobs(monkeypatch):
    """Each profile's run passes, and between them the cap holds a request
    back and a prompt-logprobs request is admitted with prefix caching on
    (so the properties are not checked vacuously)."""
    seen = {"held": 0, "logprobs_admitted": 0}
    check = lora_machine.LoraRefinementMachine._check_reference_step

    def counting(self, after):
        seen["held"] += bool(lora.held_requests(self.state, self.spec_cfg))
        scheduled = lora_machine.reference_scheduled(self.state, after)
        seen["logprobs_admitted"] += scheduled is not None and any(
            self.state.requests[e.req].prompt_logprobs and e.req in self.state.waiting for e in scheduled.entries)
        check(self, after)

    monkeypatch.setattr(lora_machine.LoraRefinementMachine, "_check_reference_step", counting)
    for profile in LORA_FUZZED_PROFILES:
        assert lora_fuzz(250, 1, profile) is None, profile
    assert seen["held"] and seen["logprobs_admitted"], seen


@pytest.mark.slow
@pytest.mark.parametrize("profile", LORA_FUZZED_PROFILES)
def test_a_longer_lora_run_passes_from_two_seeds(profile):
    for seed in (2, 3):
        assert lora_fuzz(3000, seed, profile) is None, (profile, seed)


# -- `flightcheck fuzz --feature` ---------------------------------------------------

def test_fuzz_feature_names_every_features_machine_and_its_mutants():
    from flightcheck.commands.fuzz import FEATURES
    from flightcheck.verification.mutants import reference
    from flightcheck.verification.refinement.feature_fuzzers import FEATURE_FUZZERS

    assert set(FEATURES) == set(FEATURE_FUZZERS)
    assert FEATURE_FUZZERS["lora"].fuzz is lora_fuzz and FEATURE_FUZZERS["lora"].profiles == LORA_FUZZED_PROFILES
    own = {m for fuzzer in FEATURE_FUZZERS.values() for m in fuzzer.mutants}
    assert own == (set(reference.PRIORITY_MUTANTS) | set(reference.GRAMMAR_MUTANTS) | set(reference.SESSION_MUTANTS)
                   | set(reference.RESET_PAUSE_MUTANTS) | set(LORA_MUTANTS) | set(reference.PRIORITY_SESSION_MUTANTS))


def test_fuzz_feature_lora_drives_each_profile_and_reports_the_feature(capsys):
    import json

    from flightcheck.cli import main

    assert main(["fuzz", "--feature", "lora", "--steps", "40", "--seed", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["feature"] == "lora" and report["profiles"] == list(LORA_FUZZED_PROFILES)
    assert not report["failed"] and report["failure"] is None and report["steps"] == 40


@pytest.mark.parametrize("argv, message", [
    (["--feature", "lora", "--mutant", "shared_snapshot"], "unknown --feature lora --mutant 'shared_snapshot'"),
    (["--feature", "lora", "--profile", "vllm-0.8.5"], "--feature lora runs under vllm-0.34"),
    (["--feature", "lora", "--kv-connector"], "--kv-connector and --feature pick different machines"),
])
def test_fuzz_feature_refuses_what_its_machine_does_not_run(argv, message, capsys):
    from flightcheck.cli import main

    assert main(["fuzz", *argv, "--steps", "10"]) == 2
    assert message in capsys.readouterr().err
