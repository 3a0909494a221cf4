"""The roofline cost model against the hand-computed limits of docs/pipeline-facts.md §"Llama-3.1-8B on two L4s"."""

from __future__ import annotations

import pytest

from flightcheck.bench.cost_model import CostParams, StageCostModel
from flightcheck.bench.gpus import get_gpu
from flightcheck.bench.models import get_model, layers_per_stage
from flightcheck.bench.workload import WorkloadError

PEAK = CostParams(compute_efficiency=1.0, memory_efficiency=1.0, stage_overhead_s=0.0,
                  link_latency_s=0.0)


def model_at_peak(pp: int = 2) -> StageCostModel:
    return StageCostModel(get_model("llama-3.1-8b"), get_gpu("L4"), pp, PEAK)


def test_llama_8b_shapes_match_the_published_counts():
    m = get_model("Llama-3.1-8B")
    assert m.params_per_layer == pytest.approx(218.1e6, rel=1e-3)
    assert m.total_params == pytest.approx(8.03e9, rel=1e-3)
    assert m.kv_bytes_per_token_per_layer * m.num_layers == 128 * 1024


def test_a_2048_token_chunk_takes_about_118_ms_per_stage_at_peak():
    cost = model_at_peak()
    terms = cost.batch_terms([(0, 2048, False)])
    linear_only = 2 * 16 * get_model("llama-3.1-8b").params_per_layer * 2048 / 121e12
    assert linear_only == pytest.approx(0.118, rel=0.01)
    # The attention of a 2048-token chunk from position 0 adds a few percent.
    assert cost.stage_time(0, terms) == pytest.approx(linear_only, rel=0.05)
    assert cost.stage_time(0, terms) > linear_only


def test_a_decode_step_is_bound_by_streaming_the_weights():
    cost = model_at_peak()
    terms = cost.batch_terms([(850, 1, True)] * 32)
    t0, t1 = cost.stage_time(0, terms), cost.stage_time(1, terms)
    assert 0.0233 < t0 < 0.0233 + 0.0065               # 7.0 GB of layers + 32 x 850 x 64 KiB of KV
    assert t1 > t0                                     # the last stage also streams lm_head
    assert t0 + t1 > 0.0535                            # docs/pipeline-facts.md: >= 53.5 ms through both stages


def test_kv_read_grows_decode_time_with_context():
    cost = model_at_peak()
    short = cost.stage_time(0, cost.batch_terms([(100, 1, True)] * 32))
    long = cost.stage_time(0, cost.batch_terms([(8000, 1, True)] * 32))
    assert long - short == pytest.approx(32 * 7900 * 64 * 1024 / 300e9, rel=0.01)


def test_efficiency_factors_scale_the_two_regimes_separately():
    slow_compute = StageCostModel(get_model("llama-3.1-8b"), get_gpu("L4"), 2,
                                  PEAK.with_efficiency(0.5, 1.0))
    prefill = [(0, 2048, False)]
    decode = [(100, 1, True)] * 8
    base = model_at_peak()
    assert slow_compute.stage_time(0, slow_compute.batch_terms(prefill)) == pytest.approx(
        2 * base.stage_time(0, base.batch_terms(prefill)), rel=1e-6)
    assert slow_compute.stage_time(0, slow_compute.batch_terms(decode)) == pytest.approx(
        base.stage_time(0, base.batch_terms(decode)), rel=1e-6)


def test_link_moves_hidden_state_and_residual():
    cost = model_at_peak()
    assert cost.link_time(2048) == pytest.approx(2048 * 4096 * 2 * 2 / 20e9)


def test_layers_split_like_vllm():
    assert layers_per_stage(32, 2) == [16, 16]
    assert layers_per_stage(80, 3) == [27, 27, 26]
    assert layers_per_stage(32, 1) == [32]


@pytest.mark.parametrize("call, fragment", [
    (lambda: get_gpu("V100"), "known: L4, A100, H100, H200"),
    (lambda: get_model("gpt-5"), "known: llama-3.1-8b"),
    (lambda: layers_per_stage(4, 8), "exceeds the model's 4 layers"),
])
def test_unknown_names_list_the_accepted_values(call, fragment):
    with pytest.raises(WorkloadError, match=fragment):
        call()
