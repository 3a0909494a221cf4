"""LoRA's `max_loras` cap and the prompt-logprobs limit on the prefix cache
(spec/lora.py, reference/lora.py): off by default and refused where not
modelled; the explicit search of the LoRA models (LORA1, LORA2, PL1 hold,
every target reached); each bug a killed mutant at its shortest."""

from __future__ import annotations

from dataclasses import replace

import pytest

from flightcheck.spec import Config, KvConnector
from flightcheck.spec.invariants import invariants_for
from flightcheck.spec.transitions import transition_properties_for
from flightcheck.verification.explicit.search import search
from flightcheck.verification.lora_models import LORA_K2, LORA_K2_ASYNC, LORA_MODELS, PROMPT_LOGPROBS_K2
from flightcheck.verification.mutants.registry import LORA_MUTANTS

LORA = ("LORA1_loras_within_cap", "LORA2_held_request_is_passed_over", "PL1_prompt_logprobs_read_no_cache")


def _names(cfg: Config) -> set[str]:
    return {i.name for i in invariants_for(cfg)} | {p.name for p in transition_properties_for(cfg)}


def test_off_by_default_and_refused_where_not_modelled():
    plain = Config(profile="vllm-0.34", prefix_caching=True)
    assert plain.max_loras == 0 and not plain.prompt_logprobs
    assert not _names(plain) & set(LORA)
    assert _names(LORA_K2.cfg) & set(LORA) == {"LORA1_loras_within_cap", "LORA2_held_request_is_passed_over"}
    assert _names(PROMPT_LOGPROBS_K2.cfg) & set(LORA) == {"PL1_prompt_logprobs_read_no_cache"}
    with pytest.raises(ValueError, match="max_loras must be >= 0"):
        Config(profile="vllm-0.34", max_loras=-1)
    with pytest.raises(ValueError, match="only under the vLLM 0.33 and 0.34"):
        Config(profile="vllm-0.8.5", max_loras=1)
    Config(profile="vllm-0.34", prompt_logprobs=True, max_loras=1, kv_connector=KvConnector())   # the pairs meet


# The default suite searches vLLM 0.34's two models; the other profiles' are slow.
_DEFAULT_MODELS = (LORA_K2, PROMPT_LOGPROBS_K2)
_MODELS = [pytest.param(m, id=f"{m.name}@{m.cfg.profile}",
                        marks=() if m in _DEFAULT_MODELS else pytest.mark.slow)
           for ms in LORA_MODELS.values() for m in ms]
# The default suite kills one mutant per property's kind (LORA2, PL1); LORA1's are slow.
_MUTANTS = [pytest.param(name, marks=() if LORA_MUTANTS[name].killed_by != "LORA1_loras_within_cap"
                         else pytest.mark.slow) for name in sorted(LORA_MUTANTS)]


@pytest.mark.parametrize("model", _MODELS)
def test_the_lora_models_keep_every_property_and_reach_every_target(model):
    result = search(model)
    assert result.violations == []
    if model in (LORA_K2, LORA_K2_ASYNC, PROMPT_LOGPROBS_K2):
        assert result.num_states == {"lora-k2": 294, "lora-k2-async": 525,
                                     "prompt-logprobs-k2": 52}[model.name]


@pytest.mark.parametrize("name", _MUTANTS)
def test_each_lora_bug_is_killed_by_its_property_at_its_shortest(name):
    mutant = LORA_MUTANTS[name]
    model = PROMPT_LOGPROBS_K2 if name.startswith("prompt_logprobs") else LORA_K2
    result = search(replace(model, mutant=name))
    killed = [v for v in result.violations if v.property == mutant.killed_by]
    assert killed and len(killed[0].path) == mutant.shortest, result.violations


# --- the bridge: workload keys, the reference's traces, vLLM's real scheduler


def test_the_workload_keys_are_read_and_checked():
    from flightcheck.vllm.workload import WorkloadError, workload_from_json

    base = {"config": {"max_num_batched_tokens": 16, "num_blocks": 16, "max_model_len": 64, "num_stages": 2},
            "requests": [{"prompt_len": 4}]}
    plain = workload_from_json(base)
    assert plain.config.max_loras == 0 and plain.requests[0].lora == 0 and not plain.requests[0].prompt_logprobs
    capped = workload_from_json({**base, "config": {**base["config"], "max_loras": 2},
                                 "requests": [{"prompt_len": 4, "lora": 3, "prompt_logprobs": True}]})
    assert capped.config.max_loras == 2 and capped.requests[0].lora == 3 and capped.requests[0].prompt_logprobs
    with pytest.raises(WorkloadError, match="config.max_loras is 0"):
        workload_from_json({**base, "requests": [{"prompt_len": 4, "lora": 1}]})
    with pytest.raises(WorkloadError, match=r"requests\[0\].lora: must be an integer"):
        workload_from_json({**base, "config": {**base["config"], "max_loras": 1},
                            "requests": [{"prompt_len": 4, "lora": "a"}]})
    with pytest.raises(WorkloadError, match=r"requests\[0\].prompt_logprobs: must be true or false"):
        workload_from_json({**base, "requests": [{"prompt_len": 4, "prompt_logprobs": 1}]})


def test_the_features_are_registered_for_033_and_034():
    from flightcheck.vllm.features import features_of

    for version in ("0.33.0", "0.34.0"):
        names = {f.name for f in features_of(version)}
        assert {"lora", "prompt-logprobs"} <= names
    assert not {"lora", "prompt-logprobs"} & {f.name for f in features_of("0.8.5")}


@pytest.mark.usefixtures("both_checkers")
@pytest.mark.parametrize("profile", ["vllm-0.34", pytest.param("vllm-0.33-async", marks=pytest.mark.slow)])
def test_the_references_lora_traces_are_legal_and_the_cap_binds(profile):
    from flightcheck.verification.traces.check import check_events
    from flightcheck.vllm.differential import run_reference
    from flightcheck.vllm.lora_workload import lora_workloads

    changed = 0
    for workload in lora_workloads(1, 4):
        run = run_reference(workload, profile)
        assert run.events[0]["max_loras"] >= 1 and check_events(run.events).ok, workload["name"]
        uncapped = {**workload, "config": {**workload["config"], "max_loras": 64}}
        plain = run_reference(uncapped, profile)
        changed += [e for e in run.events if e["ev"] == "schedule"] != [e for e in plain.events if e["ev"] == "schedule"]
    assert changed >= 1                     # the cap changed the batches of one at least (1 of 4, seed 1)


def test_a_cap_beside_a_connector_is_checked_and_before_0_33_malformed():
    """The pair meets (tests/test_lora_kv.py); the 0.8.x profiles have no cap."""
    from flightcheck.verification.traces.check import MalformedTrace, check_events

    events = [{"ev": "config", "num_stages": 2, "max_num_batched_tokens": 8, "block_size": 2, "num_blocks": 8,
               "max_model_len": 16, "vllm_version": "0.34.0", "max_loras": 1,
               "kv_connector": {"consumer": True, "producer": False}}, {"ev": "end"}]
    assert check_events(events).ok
    with pytest.raises(MalformedTrace, match="^line 1: config event: max_loras and prompt_logprobs are modelled"):
        check_events([{**events[0], "vllm_version": "0.8.5"}, events[1]])


def _agree_with_vllm(version: str, async_scheduling: bool, count: int) -> None:
    import os

    if os.environ.get("FLIGHTCHECK_SKIP_VLLM"):
        pytest.skip("FLIGHTCHECK_SKIP_VLLM")
    from flightcheck.vllm.campaign import run_version
    from flightcheck.vllm.lora_workload import lora_workloads

    workloads = lora_workloads(1, count)
    report = run_version(version, workloads, 1, False, lambda line: None, async_scheduling)
    assert report.workloads == len(workloads) and report.unexplained == []
    assert report.identical == len(workloads)
    assert set(report.verdicts) == {"accepted, correct run"}


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_lora_workloads_agree_with_vllm(version: str, async_scheduling: bool) -> None:
    """Eight LoRA / prompt-logprobs workloads, each release and mode:
    identical to the reference, check-trace's verdict its ground truth."""
    _agree_with_vllm(version, async_scheduling, 8)


def test_without_the_lora_features_a_seeds_workloads_are_as_before_them(monkeypatch):
    """Both features are drawn last, so leaving their keys out gives the
    workloads the generator made before they were registered (the other
    features' tests replay those)."""
    from flightcheck.vllm import features
    from flightcheck.vllm.generate import campaign_workloads
    from flightcheck.vllm.lora_workload import without_lora_features

    now = [without_lora_features(w) for w in campaign_workloads(5, 40, features_of="0.34.0")]
    assert sum("max_loras" in w["config"] for w in campaign_workloads(5, 40, features_of="0.34.0")) >= 5
    monkeypatch.setattr(features, "FEATURE_MODULES",
                        tuple(m for m in features.FEATURE_MODULES if m != "flightcheck.vllm.lora_workload"))
    assert now == campaign_workloads(5, 40, features_of="0.34.0")


def test_a_reset_that_uncaches_duplicate_copies_is_checked_as_the_full_replay_checks_it():
    """vLLM 0.34.0 async, `--all-features` seed 23 index 70 (prompt logprobs,
    LoRA, reset and pause): a prompt-logprobs request caches its own copies
    of a prefix another request cached (it read none of them), then
    `reset_prefix_cache` uncaches every copy. The incremental checker looked
    at the caching clause only on the touched requests' blocks (none, at a
    reset), saw the duplicates list emptied and rejected a correct run (a
    false S9_kv_ownership); a reset is now checked on the whole pool."""
    from pathlib import Path

    from flightcheck.verification.traces.check import check_events
    from flightcheck.verification.traces.reading import read_trace_file

    trace = read_trace_file(Path(__file__).parent / "data" / "vllm" / "lora" / "034_async_reset_with_duplicate_copies.jsonl")
    for full in (False, True):
        result = check_events(trace, None, full=full)
        assert result.ok, (full, result.property, result.message)


def test_the_z3_encoding_takes_the_cap_and_the_limit_and_refuses_what_it_leaves_out():
    """The encoding has the cap and the limit (verification/z3/encoding/lora.py;
    tests/test_z3_lora.py checks it against the spec); a model that needs
    what it leaves out, here the prefill cadence, is refused rather than
    checked as a different scheduler (the explicit search checks it)."""
    from flightcheck.verification.z3.encoding.state import Layout

    for model in (LORA_K2, PROMPT_LOGPROBS_K2):
        assert Layout.of(model).N == len(model.prompts)
    cadence = replace(LORA_K2, cfg=replace(LORA_K2.cfg, prefill_schedule_interval=2))
    with pytest.raises(ValueError, match="LoRA cap and of prompt logprobs leaves out the prefill cadence"):
        Layout.of(cadence)
