"""The LoRA cap and prompt logprobs beside the KV connector
(docs/request-states.md, "Features together"; vLLM 0.33.0 and 0.34.0 read
alike): the waiting loop tests `max_loras` after
`_handle_blocked_waiting_request` (so after a landed load's promotion) and
before it asks the connector; a prompt-logprobs request asks the connector
and drops its offer (0.33 `skip_reading_prefix_cache`, 0.34
`skip_reading_external_kv`). The pairs' explicit models, each rule's need,
and (vLLM, slow) the campaign's workloads."""

from __future__ import annotations

import importlib
import os
from dataclasses import replace

import pytest

from flightcheck.spec import (Arrive, Config, KvConnector, Prompt, ReceiveKv, Schedule, invariants_for, step,
                              transition_properties_for)
from flightcheck.spec.state import Load, Status, initial_state
from flightcheck.verification.explicit.search import search
from flightcheck.verification.lora_models import LORA_KV_K2, PROMPT_LOGPROBS_KV_K2
from flightcheck.vllm.features import registered
from flightcheck.vllm.generate import campaign_workloads

from .fixtures import run_checked
from .vllm_support import drawn_apart, found_workload

pytestmark = pytest.mark.usefixtures("both_checkers")   # the campaign's check-trace runs (slow test)

# (states, edges, max depth) -- change only with a reviewed change of semantics.
PINNED = {"lora-kv-k2": (144, 271, 11), "prompt-logprobs-kv-k2": (148, 270, 10)}
PROPERTIES = {"KV1_no_reuse_under_transfer", "KV2_loading_not_scheduled", "KV4_no_leak", "KV5_loaded_not_starved",
              "S9_kv_ownership", "L2_no_deadlock"}
OWN = {"lora-kv-k2": {"LORA1_loras_within_cap", "LORA2_held_request_is_passed_over"},
       "prompt-logprobs-kv-k2": {"PL1_prompt_logprobs_read_no_cache"}}


def _run(cfg: Config, n: int, actions: list):
    return run_checked(cfg, n, actions)


@pytest.mark.parametrize("feature", ["lora", "prompt-logprobs"])
def test_the_pair_is_no_longer_excluded_and_meets(feature: str) -> None:
    features = {f.name: f for f in registered()}
    assert "kv-connector" not in features[feature].excludes and feature not in features["kv-connector"].excludes
    for version in ("0.34.0", "0.33.0"):
        met = sum({feature, "kv-connector"} <= set(w["features"])
                  for w in campaign_workloads(1, 40, features_of=version))
        assert met >= 3, (feature, version, met)


def test_a_landed_load_is_promoted_then_passed_over_by_the_cap() -> None:
    cfg = LORA_KV_K2.cfg
    plain, load = LORA_KV_K2.prompts
    state = _run(cfg, 2, [Arrive(1, load), Arrive(0, plain), Schedule(), ReceiveKv(1), Schedule()])
    q = state.requests[1]
    assert q.status is Status.WAITING and q.load is Load.RECEIVED and q.num_computed == 1   # promoted, not run
    assert state.kv_holding == (1,) and state.running == (0,)


def test_a_prompt_logprobs_request_drops_the_connectors_offer() -> None:
    cfg = PROMPT_LOGPROBS_KV_K2.cfg
    state = _run(cfg, 1, [Arrive(0, PROMPT_LOGPROBS_KV_K2.prompts[1]), Schedule()])
    q = state.requests[0]
    assert q.status is Status.RUNNING and q.load is Load.DONE and not state.kv_holding
    assert [(e.start, e.external) for e in state.in_flight[-1]] == [(0, 0)]
    off = replace(cfg, prompt_logprobs=False)
    state = step(step(initial_state(1, off.num_blocks), off, Arrive(0, PROMPT_LOGPROBS_KV_K2.prompts[1])), off,
                 Schedule())
    assert state.requests[0].status is Status.WAITING_FOR_REMOTE_KVS      # without the flag it loads


@pytest.mark.parametrize("model", [LORA_KV_K2, PROMPT_LOGPROBS_KV_K2], ids=lambda m: m.name)
def test_the_pairs_models_prove_every_property_of_both_features(model) -> None:
    names = {i.name for i in invariants_for(model.cfg)} | {p.name for p in transition_properties_for(model.cfg)}
    assert PROPERTIES | OWN[model.name] <= names, (PROPERTIES | OWN[model.name]) - names
    r = search(model)
    assert r.complete and not r.violations, [(v.property, len(v.path)) for v in r.violations]
    assert (r.num_states, r.num_edges, r.max_depth) == PINNED[model.name]


def test_without_the_cap_after_promotion_lora1_breaks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.import_module("flightcheck.spec.lora"), "held_by_lora_cap", lambda *a: False)
    r = search(LORA_KV_K2, stop_at_first=True)
    first = r.violations[0]
    assert (first.property, [type(a).__name__ for a, _ in first.path]) == (
        "LORA1_loras_within_cap", ["Arrive", "Arrive", "Schedule", "ReceiveKv", "Schedule"])


def test_without_the_dropped_offer_pl1_breaks(monkeypatch: pytest.MonkeyPatch) -> None:
    kv_loads = importlib.import_module("flightcheck.spec.kv_loads")
    offer = kv_loads.connector_offer

    def offered_anyway(state, cfg, r, local_tokens):
        q = state.requests[r]
        state = state.with_request(r, prompt_logprobs=False) if q.prompt_logprobs else state
        return offer(state, cfg, r, local_tokens)

    monkeypatch.setattr(kv_loads, "connector_offer", offered_anyway)
    r = search(PROMPT_LOGPROBS_KV_K2, stop_at_first=True)
    first = r.violations[0]
    assert (first.property, [type(a).__name__ for a, _ in first.path]) == (
        "PL1_prompt_logprobs_read_no_cache", ["Arrive", "Schedule"])


# campaign --all-features --versions 0.34.0,0.33.0 seed 1 (80 workloads): the first
# workloads with each pair on each release; and those where the cap passed a promoted
# load over (seeds 5 to 7: the only ones of 150 per seed)
PROMOTED_LOAD_CAPPED = {"0.34.0": [(5, 117), (6, 138), (7, 40)], "0.33.0": [(6, 138), (7, 40)]}


def _found(version: str, feature: str, count: int = 3) -> list[dict]:
    return [w for w in drawn_apart(1, 80, features_of=version)
            if {feature, "kv-connector"} <= set(w["features"])][:count]


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_the_pairs_campaign_workloads_agree_with_vllm(version: str, async_scheduling: bool) -> None:
    if os.environ.get("FLIGHTCHECK_SKIP_VLLM"):
        pytest.skip("FLIGHTCHECK_SKIP_VLLM")
    from flightcheck.vllm.campaign import DISAGREEMENTS, run_version

    workloads = _found(version, "lora") + _found(version, "prompt-logprobs") + [
        found_workload(version, seed, index)
        for seed, index in PROMOTED_LOAD_CAPPED[version]]
    report = run_version(version, workloads, 0, False, lambda line: None, async_scheduling)
    assert report.workloads == len(workloads) and report.unexplained == []
    assert not set(report.verdicts) & DISAGREEMENTS, dict(report.verdict_details)
