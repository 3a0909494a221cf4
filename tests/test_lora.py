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
    with pytest.raises(ValueError, match="without a KV connector"):
        Config(profile="vllm-0.34", prompt_logprobs=True, kv_connector=KvConnector())


@pytest.mark.parametrize("model", [m for ms in LORA_MODELS.values() for m in ms], ids=lambda m: m.name)
def test_the_lora_models_keep_every_property_and_reach_every_target(model):
    result = search(model)
    assert result.violations == []
    if model in (LORA_K2, LORA_K2_ASYNC, PROMPT_LOGPROBS_K2):
        assert result.num_states == {"lora-k2": 294, "lora-k2-async": 525,
                                     "prompt-logprobs-k2": 52}[model.name]


@pytest.mark.parametrize("name", sorted(LORA_MUTANTS))
def test_each_lora_bug_is_killed_by_its_property_at_its_shortest(name):
    mutant = LORA_MUTANTS[name]
    model = PROMPT_LOGPROBS_K2 if name.startswith("prompt_logprobs") else LORA_K2
    result = search(replace(model, mutant=name))
    killed = [v for v in result.violations if v.property == mutant.killed_by]
    assert killed and len(killed[0].path) == mutant.shortest, result.violations
