"""The model, its stages, its weights and its paged attention, against
independent references: a dense full recompute and transformers' Llama."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from flightcheck.reference import Engine, Request, SamplingParams, Scheduler, SchedulerConfig
from flightcheck.runtime import (ConfigError, LocalExecutor, ModelConfig, WeightSource, build_model,
                                 build_stage, partition_layers, save_hf_checkpoint, split_into_stages)
from flightcheck.runtime.attention import DenseCausalAttention
from flightcheck.runtime.dense import dense_logits
from flightcheck.runtime.worker import LogitsRecord
from flightcheck.runtime.workload import mixed_workload

torch.set_num_threads(1)

GQA_UNTIED = ModelConfig(n_layers=3, tie_embeddings=False)
MHA_TIED = ModelConfig(n_layers=2, n_heads=4, n_kv_heads=4, tie_embeddings=True, vocab_size=300)


def test_layers_split_into_consecutive_near_equal_ranges():
    assert partition_layers(6, 3) == [range(0, 2), range(2, 4), range(4, 6)]
    assert partition_layers(7, 3) == [range(0, 3), range(3, 5), range(5, 7)]
    with pytest.raises(ValueError):
        partition_layers(2, 3)


@pytest.mark.parametrize("num_stages", [2, 3])
def test_stages_chained_compute_the_whole_models_logits(num_stages):
    src = WeightSource(seed=3)
    cfg = src.model_config()
    model = build_model(cfg, src, torch.float64)
    tokens = torch.tensor([5, 9, 300, 7, 7, 1])
    positions = torch.arange(6)
    attend = DenseCausalAttention([6])
    with torch.no_grad():
        want = model(tokens, positions, attend)
        x = tokens
        for stage in split_into_stages(model, num_stages):
            x = stage(x, positions, attend)
        got = stage.logits(x)
    assert torch.equal(got, want)


@pytest.mark.parametrize("cfg", [GQA_UNTIED, MHA_TIED], ids=["gqa-untied", "mha-tied"])
def test_a_stage_built_alone_gets_the_whole_models_weights(cfg):
    src = WeightSource(seed=5, config_overrides=tuple(cfg.to_dict().items()))
    model = build_model(cfg, src, torch.float32)
    full = dict(model.named_parameters(remove_duplicate=False))
    for s in range(cfg.n_layers):
        stage = build_stage(cfg, src, s, cfg.n_layers, torch.float32)
        for name, p in stage.named_parameters(remove_duplicate=False):
            assert torch.equal(p, full[name]), name


def _paged_logits_run(dtype):
    """Run a mixed workload (chunked prefills, prefix hits, preemption) through
    the PP = 1 paged runtime, recording the logits of every sampled row."""
    src = WeightSource(seed=1)
    ex = LocalExecutor(src, 1, 30, 4, dtype=dtype)
    ex.workers[0].record = record = LogitsRecord()
    cfg = SchedulerConfig(max_num_batched_tokens=24, max_num_seqs=6, max_model_len=96,
                          block_size=4, num_blocks=30)
    engine = Engine(Scheduler(cfg), ex)
    requests = [Request(g.req_id, list(g.prompt_token_ids), SamplingParams(max_tokens=g.max_tokens))
                for g in mixed_workload(1, 10, max_tokens=(4, 12))]
    for r in requests:
        engine.add_request(r)
    engine.run()
    return src, requests, record


def test_paged_runtime_matches_dense_full_recompute_to_1e_8_in_float64():
    src, requests, record = _paged_logits_run(torch.float64)
    model = build_model(src.model_config(), src, torch.float64)
    by_id = {r.request_id: r for r in requests}
    cache: dict[str, torch.Tensor] = {}
    worst = 0.0
    for req_id, position, row in record.rows:
        if req_id not in cache:
            cache[req_id] = dense_logits(model, by_id[req_id].all_token_ids)
        worst = max(worst, (cache[req_id][position] - row).abs().max().item())
    assert len(record.rows) >= 40
    assert worst <= 1e-8, worst


# -- Hugging Face checkpoints ----------------------------------------------------

@pytest.mark.parametrize("cfg,shards", [(GQA_UNTIED, None), (MHA_TIED, 5)],
                         ids=["gqa-untied-single-file", "mha-tied-sharded"])
def test_our_model_matches_transformers_llama_on_the_same_checkpoint(tmp_path, cfg, shards):
    """float32, max abs logit difference <= 1e-4 (logits are O(1))."""
    transformers = pytest.importorskip("transformers")
    src = WeightSource(seed=11, config_overrides=tuple(cfg.to_dict().items()))
    ours = build_model(cfg, src, torch.float32)
    save_hf_checkpoint(ours, cfg, tmp_path, max_shard_tensors=shards)
    loaded = build_model(cfg, WeightSource(checkpoint=str(tmp_path)), torch.float32)
    hf = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path), torch_dtype=torch.float32)
    hf.eval()
    tokens = [3, 17, 99, 250, 4, 4, 8, 120, 42, 7, 1, 2]
    with torch.no_grad():
        want = hf(torch.tensor([tokens])).logits[0]
    got = dense_logits(loaded, tokens)
    assert torch.equal(dense_logits(ours, tokens), got)          # the round trip is exact
    assert (got - want).abs().max().item() <= 1e-4


def test_checkpoint_errors_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="not a directory"):
        WeightSource(checkpoint=str(tmp_path / "nope")).model_config()
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(ConfigError, match="not JSON"):
        WeightSource(checkpoint=str(tmp_path)).model_config()
    cfg = GQA_UNTIED
    model = build_model(cfg, WeightSource(seed=1, config_overrides=tuple(cfg.to_dict().items())),
                        torch.float32)
    save_hf_checkpoint(model, cfg, tmp_path)
    hf_cfg = json.loads((tmp_path / "config.json").read_text())
    hf_cfg["hidden_size"] = 128                                   # weights say 64
    (tmp_path / "config.json").write_text(json.dumps(hf_cfg))
    bad = WeightSource(checkpoint=str(tmp_path))
    with pytest.raises(ConfigError, match="shape"):
        build_model(bad.model_config(), bad, torch.float32)
    hf_cfg.update(hidden_size=64, num_hidden_layers=5)            # two layers missing
    (tmp_path / "config.json").write_text(json.dumps(hf_cfg))
    with pytest.raises(ConfigError, match="missing"):
        build_model(bad.model_config(), bad, torch.float32)
    hf_cfg.update(num_hidden_layers=3, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    (tmp_path / "config.json").write_text(json.dumps(hf_cfg))
    with pytest.raises(ConfigError, match="rope type"):
        bad.model_config()
