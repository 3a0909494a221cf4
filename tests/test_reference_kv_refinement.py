"""Refinement fuzzing with a KV connector (verification/refinement/kv_machine.py):
the reference's connector takes the spec's steps under every profile that
has one, and a reference with vLLM 0.34's rollback (#49250: the valid
prefix's counter alone, no drop share, the placeholders left) is caught.
Longer runs: `python -c "from flightcheck.verification.refinement.kv_machine
import kv_fuzz; print(kv_fuzz(3000, 0, 'vllm-0.34-async'))"`."""

from __future__ import annotations

import pytest

from flightcheck.reference import kv_transfer
from flightcheck.verification.refinement.kv_machine import KV_FUZZED_PROFILES, kv_fuzz, kv_machine

pytestmark = pytest.mark.usefixtures("both_checkers")


@pytest.mark.parametrize("profile", KV_FUZZED_PROFILES)
def test_the_reference_connector_refines_the_spec(profile):
    assert kv_fuzz(400, 0, profile) is None


def test_vllms_rollback_is_caught(monkeypatch):
    def vllm_rollback(self, request, valid_tokens):
        request.num_computed_tokens = valid_tokens   # 0.34's `_update_requests_with_invalid_blocks`
    monkeypatch.setattr(kv_transfer.KvTransfers, "_roll_back", vllm_rollback)
    failure = kv_fuzz(600, 0, "vllm-0.34-async", shrink=False)
    assert failure is not None and "kv load failed" in failure


def test_only_profiles_with_a_connector_are_fuzzed_with_one():
    with pytest.raises(ValueError, match="no KV connector refinement"):
        kv_machine("vllm-0.8.5")
