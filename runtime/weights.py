"""Where a model's (or one stage's) weights come from: seeded random values or
a Hugging Face Llama checkpoint in a local directory.

Both fill parameters by their canonical names in `Transformer` (a stage's
parameters keep the full model's names), so a stage process can build only
its own layers and still get exactly the weights the whole model would have.
"""

from __future__ import annotations

import json
import math
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .config import ConfigError, ModelConfig, PRESETS, from_hf_config, to_hf_config


@dataclass(frozen=True)
class WeightSource:
    """What a stage process needs to build its weights (picklable, small)."""

    checkpoint: str | None = None       # a local HF directory; None: seeded weights
    preset: str = "tiny"
    seed: int = 0
    config_overrides: tuple[tuple[str, object], ...] = ()

    def model_config(self) -> ModelConfig:
        if self.checkpoint is not None:
            cfg = from_hf_config(read_hf_config(self.checkpoint))
        elif self.preset in PRESETS:
            cfg = PRESETS[self.preset]
        else:
            raise ConfigError(f"unknown model preset {self.preset!r}; known: {', '.join(PRESETS)}")
        return cfg.with_(**dict(self.config_overrides)) if self.config_overrides else cfg

    def load_into(self, module: nn.Module, cfg: ModelConfig) -> None:
        if self.checkpoint is None:
            init_seeded(module, cfg, self.seed)
        else:
            load_hf_weights(module, cfg, self.checkpoint)


def canonical_name(name: str, cfg: ModelConfig) -> str:
    """A tied output projection is the embedding."""
    return "tok_embeddings.weight" if cfg.tie_embeddings and name == "output.weight" else name


@torch.no_grad()
def init_seeded(module: nn.Module, cfg: ModelConfig, seed: int) -> None:
    """Per-parameter seeded values (as vLLM's dummy loader): each parameter's
    generator is seeded from `seed` and its canonical name, so the values do
    not depend on which other parameters a module holds. Drawn in float64 and
    cast, so models of different dtypes share their weights."""
    for name, param in module.named_parameters(remove_duplicate=False):
        key = canonical_name(name, cfg)
        gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(key.encode()))
        if key.endswith("norm.weight"):
            values = 1.0 + 0.1 * torch.randn(param.shape, generator=gen, dtype=torch.float64)
        elif key == "tok_embeddings.weight":
            values = torch.randn(param.shape, generator=gen, dtype=torch.float64)
        else:                                        # a Linear: [out, in]
            std = 1.0 / math.sqrt(param.shape[1])
            values = std * torch.randn(param.shape, generator=gen, dtype=torch.float64)
        param.copy_(values.to(param.dtype))


# -- Hugging Face checkpoints ----------------------------------------------------

_HF_LAYER = {
    "self_attn.q_proj": "attention.wq", "self_attn.k_proj": "attention.wk",
    "self_attn.v_proj": "attention.wv", "self_attn.o_proj": "attention.wo",
    "mlp.gate_proj": "feed_forward.w1", "mlp.up_proj": "feed_forward.w3",
    "mlp.down_proj": "feed_forward.w2",
    "input_layernorm": "attention_norm", "post_attention_layernorm": "ffn_norm",
}
_HF_TOP = {"model.embed_tokens.weight": "tok_embeddings.weight",
           "model.norm.weight": "norm.weight", "lm_head.weight": "output.weight"}
_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)\.weight$")


def hf_to_ours(name: str) -> str | None:
    if name in _HF_TOP:
        return _HF_TOP[name]
    m = _LAYER_RE.match(name)
    if m and m.group(2) in _HF_LAYER:
        return f"layers.{m.group(1)}.{_HF_LAYER[m.group(2)]}.weight"
    return None


def ours_to_hf(name: str) -> str:
    for hf, ours in _HF_TOP.items():
        if ours == name:
            return hf
    for hf, ours in _HF_LAYER.items():
        m = re.match(rf"layers\.(\d+)\.{re.escape(ours)}\.weight$", name)
        if m:
            return f"model.layers.{m.group(1)}.{hf}.weight"
    raise KeyError(name)


def read_hf_config(path: str | Path) -> dict:
    directory = Path(path)
    if not directory.is_dir():
        raise ConfigError(f"checkpoint {path}: not a directory")
    config = directory / "config.json"
    if not config.is_file():
        raise ConfigError(f"checkpoint {path}: no config.json")
    try:
        return json.loads(config.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"checkpoint {path}: config.json is not JSON ({err.msg})") from None


def _safetensors_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        return sorted({directory / f for f in weight_map.values()})
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"checkpoint {directory}: no *.safetensors files")
    return files


@torch.no_grad()
def load_hf_weights(module: nn.Module, cfg: ModelConfig, path: str | Path) -> None:
    """Fill `module`'s parameters (a whole model or one stage) from a local
    HF Llama checkpoint, reading only the tensors it needs."""
    from safetensors import safe_open

    wanted: dict[str, list[torch.Tensor]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        wanted.setdefault(canonical_name(name, cfg), []).append(param)
    found: set[str] = set()
    for file in _safetensors_files(Path(path)):
        with safe_open(str(file), framework="pt") as f:
            for hf_name in f.keys():
                ours = hf_to_ours(hf_name)
                if ours is None or ours not in wanted or ours in found:
                    continue
                tensor = f.get_tensor(hf_name)
                for param in wanted[ours]:
                    if tuple(tensor.shape) != tuple(param.shape):
                        raise ConfigError(f"checkpoint {path}: {hf_name} has shape "
                                          f"{tuple(tensor.shape)}, config.json implies "
                                          f"{tuple(param.shape)}")
                    param.copy_(tensor.to(param.dtype))
                found.add(ours)
    missing = sorted(set(wanted) - found)
    if missing:
        raise ConfigError(f"checkpoint {path}: missing {len(missing)} tensors, e.g. "
                          f"{ours_to_hf(missing[0])}")


def save_hf_checkpoint(model: nn.Module, cfg: ModelConfig, path: str | Path,
                       max_shard_tensors: int | None = None) -> None:
    """Write `model` as an HF Llama checkpoint (config.json + safetensors;
    sharded with an index when `max_shard_tensors` is given)."""
    from safetensors.torch import save_file

    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(to_hf_config(cfg), indent=1))
    tensors = {ours_to_hf(n): p.detach().contiguous().clone()
               for n, p in model.named_parameters()}
    if max_shard_tensors is None:
        save_file(tensors, str(directory / "model.safetensors"))
        return
    names = sorted(tensors)
    shards = [names[i:i + max_shard_tensors] for i in range(0, len(names), max_shard_tensors)]
    weight_map = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n] for n in shard}, str(directory / file))
        weight_map.update({n: file for n in shard})
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
