"""The refinement machine of the prefill cadence beside the KV connector
(verification/refinement/cadence_kv_machine.py; `flightcheck fuzz --feature
cadence-kv`): the correct reference refines the spec, and the machine sees
the rules of the pair taken out of the reference's connector loop."""

from __future__ import annotations

import importlib

import pytest

from flightcheck.verification.refinement.cadence_kv_machine import CADENCE_KV_FUZZED_PROFILES, cadence_kv_fuzz
from flightcheck.verification.refinement.feature_fuzzers import FEATURE_FUZZERS

pytestmark = pytest.mark.usefixtures("both_checkers")   # a refinement fuzzer: both checkers compared


def test_the_machine_is_the_features_and_passes_on_the_correct_reference() -> None:
    assert FEATURE_FUZZERS["cadence-kv"].fuzz is cadence_kv_fuzz
    assert FEATURE_FUZZERS["cadence-kv"].profiles == CADENCE_KV_FUZZED_PROFILES
    for profile in CADENCE_KV_FUZZED_PROFILES:
        assert cadence_kv_fuzz(60, 1, profile) is None, profile


def test_without_noting_its_skips_the_reference_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    kv_waiting = importlib.import_module("flightcheck.reference.kv_waiting")
    monkeypatch.setattr(kv_waiting.KvWaiting, "_note_skipped", lambda self, request: None, raising=False)
    failure = cadence_kv_fuzz(1500, 1, "vllm-0.34", shrink=False)
    assert failure is not None and "deferred_waiting" in failure, failure


@pytest.mark.slow
def test_without_the_gate_in_the_connectors_loop_the_reference_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    kv_waiting = importlib.import_module("flightcheck.reference.kv_waiting")
    monkeypatch.setattr(kv_waiting.KvWaiting, "_held_at_admission", lambda self, request, computed: False,
                        raising=False)
    failure = cadence_kv_fuzz(1500, 2, "vllm-0.34", shrink=False)
    assert failure is not None and "the reference is not where the spec goes" in failure, failure


@pytest.mark.slow
@pytest.mark.parametrize("profile", CADENCE_KV_FUZZED_PROFILES)
def test_a_longer_run_passes_under_each_profile(profile: str) -> None:
    assert cadence_kv_fuzz(1500, 4, profile, shrink=False) is None
