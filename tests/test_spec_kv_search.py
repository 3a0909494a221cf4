"""Exhaustive search of the KV connector's models (`KV_PROFILE_MODELS`):
every property holds (KV1-KV6, KV3 and P_KV_preemption_frees among them),
every applicable target is reached, and the reachable states are pinned,
so a silent change of the connector's semantics breaks a test. vLLM 0.33's
models and 0.34's own in the default suite; the other profiles' copies are
slow (tests/slow_tests.txt)."""

from __future__ import annotations

import pytest

from flightcheck.spec import invariants_for, transition_properties_for
from flightcheck.spec.sometimes import sometimes_for
from flightcheck.verification.explicit import search as explicit
from flightcheck.verification.kv_models import KV_LIMIT_K2, KV_PROFILE_MODELS
from flightcheck.verification.models import Model

# (states, edges, max depth) -- change only with a reviewed change of semantics.
# The load-error models (fail policy): 568/1275 and 1012/2320 before the fail
# policy's table was freed with the update of the batch that carried the
# failed load (vLLM counts that batch processed first) instead of behind
# every batch in flight (spec/kv_reports.py, _fail_past_carrier).
PINNED = {
    "kv-load-fail-k2": (1391, 3448, 16),
    "kv-load-error-k2": (547, 1246, 11),
    "kv-send-k2": (978, 1837, 16),
    "kv-fence-k2": (1371, 2770, 17),
    "kv-limit-k2": (769, 1487, 16),
    "kv-load-fail-k2@vllm-0.33-async": (2978, 7490, 17),
    "kv-load-error-k2@vllm-0.33-async": (952, 2235, 12),
    "kv-send-k2@vllm-0.33-async": (1849, 3561, 22),
    "kv-fence-k2@vllm-0.33-async": (2814, 5837, 23),
    "kv-load-fail-k2@vllm-0.34": (1391, 3448, 16),
    "kv-load-error-k2@vllm-0.34": (547, 1246, 11),
    "kv-send-k2@vllm-0.34": (978, 1837, 16),
    "kv-fence-k2@vllm-0.34": (1371, 2770, 17),
    "kv-load-fail-k2@vllm-0.34-async": (2978, 7490, 17),
    "kv-load-error-k2@vllm-0.34-async": (952, 2235, 12),
    "kv-send-k2@vllm-0.34-async": (1849, 3561, 22),
    "kv-fence-k2@vllm-0.34-async": (2814, 5837, 23),
    "kv-limit-k2@vllm-0.34-async": (1265, 2624, 17),
    # finding 7's fix: 0.34's states (tests/test_kv_invalid_search.py, slow)
    **{f"{name}@vllm-0.34-invalid-kv-fixed": counts for name, counts in (
        ("kv-load-fail-k2", (1391, 3448, 16)), ("kv-load-error-k2", (547, 1246, 11)), ("kv-send-k2", (978, 1837, 16)),
        ("kv-fence-k2", (1371, 2770, 17)), ("kv-limit-k2", (769, 1487, 16)))},
}
KV_NAMES = {"KV1_no_reuse_under_transfer", "KV2_loading_not_scheduled", "KV4_no_leak", "KV5_loaded_not_starved"}


def check(model: Model) -> None:
    r = explicit.search(model)
    assert r.complete
    assert (r.num_states, r.num_edges, r.max_depth) == PINNED[model.name], model.name
    assert r.ok, [(v.property, len(v.path)) for v in r.violations]
    applicable = {s.name for s in sometimes_for(model.cfg)
                  if s.is_applicable(model.cfg, model.shares_prefix) and s.name not in model.skip_targets}
    assert set(r.reached) == applicable
    assert all(r.liveness.values()) and len(r.liveness) == 2
    names = {i.name for i in invariants_for(model.cfg)} | {p.name for p in transition_properties_for(model.cfg)}
    assert KV_NAMES | {"KV3_rollback_restores_counters", "P_KV_preemption_frees"} <= names


@pytest.mark.parametrize("model", KV_PROFILE_MODELS["vllm-0.33"] + (KV_LIMIT_K2,), ids=lambda m: m.name)
def test_connector_model_proves_every_property(model):
    check(model)


@pytest.mark.parametrize("profile", ["vllm-0.33-async", "vllm-0.34", "vllm-0.34-async"])
def test_connector_models_of_the_other_profiles_prove_every_property(profile):
    for model in KV_PROFILE_MODELS[profile]:
        if model is not KV_LIMIT_K2:
            check(model)


def test_every_connector_model_is_pinned_and_the_limit_model_checks_kv6():
    assert {m.name for models in KV_PROFILE_MODELS.values() for m in models} == set(PINNED)
    assert "KV6_load_limit" in {i.name for i in invariants_for(KV_LIMIT_K2.cfg)}
