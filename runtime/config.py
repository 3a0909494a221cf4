"""The model's architecture: a Llama-family decoder described by a handful of
numbers, with the seeded default model the tests and `flightcheck run` use,
and the mapping from a Hugging Face `config.json`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

BYTE_VOCAB = 256          # byte-level tokenizer: ids 0..255 are bytes
BOS_ID = 256
EOS_ID = 257


class ConfigError(ValueError):
    """A model configuration that cannot be built or that does not match."""


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 512
    dim: int = 64                      # hidden size
    n_layers: int = 6
    n_heads: int = 4
    n_kv_heads: int = 2                # grouped-query attention: n_heads % n_kv_heads == 0
    head_dim: int = 16
    intermediate_size: int = 128       # SwiGLU hidden size
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    max_position_embeddings: int = 4096
    bos_token_id: int | None = BOS_ID
    eos_token_id: int | None = EOS_ID

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                     "intermediate_size", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"model config: {name} must be a positive integer, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"model config: n_heads={self.n_heads} is not a multiple of "
                              f"n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            raise ConfigError(f"model config: head_dim must be even for RoPE, got {self.head_dim}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def with_(self, **changes: Any) -> "ModelConfig":
        return replace(self, **changes)


# Named presets. "tiny" is the default seeded model: ~0.2 M parameters, a
# float64 forward of a 64-token batch costs well under a millisecond per layer.
PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(),
    "small": ModelConfig(dim=256, n_layers=8, n_heads=8, n_kv_heads=4, head_dim=32,
                         intermediate_size=688, vocab_size=1024),
}


def from_hf_config(hf: dict[str, Any]) -> ModelConfig:
    """ModelConfig from a Hugging Face Llama `config.json`; refuses what this
    model does not implement (biases, RoPE scaling, other architectures)."""
    archs = hf.get("architectures") or ["LlamaForCausalLM"]
    model_type = hf.get("model_type", "llama")
    if model_type != "llama" and "LlamaForCausalLM" not in archs:
        raise ConfigError(f"config.json: model_type {model_type!r} / architectures {archs} "
                          "is not a Llama model")
    for flag in ("attention_bias", "mlp_bias"):
        if hf.get(flag):
            raise ConfigError(f"config.json: {flag}=true is not supported")
    if hf.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"config.json: hidden_act {hf['hidden_act']!r} is not supported (silu)")
    rope = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ConfigError(f"config.json: rope type {rope_type!r} is not supported (default only)")
    theta = hf.get("rope_theta", rope.get("rope_theta", 10000.0))
    try:
        n_heads = int(hf["num_attention_heads"])
        dim = int(hf["hidden_size"])
        return ModelConfig(
            vocab_size=int(hf["vocab_size"]), dim=dim,
            n_layers=int(hf["num_hidden_layers"]), n_heads=n_heads,
            n_kv_heads=int(hf.get("num_key_value_heads") or n_heads),
            head_dim=int(hf.get("head_dim") or dim // n_heads),
            intermediate_size=int(hf["intermediate_size"]), rope_theta=float(theta),
            norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
            bos_token_id=_first(hf.get("bos_token_id")), eos_token_id=_first(hf.get("eos_token_id")))
    except KeyError as err:
        raise ConfigError(f"config.json lacks {err.args[0]!r}") from None


def to_hf_config(cfg: ModelConfig) -> dict[str, Any]:
    """The Hugging Face `config.json` of this architecture."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.dim,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size, "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings,
        "max_position_embeddings": cfg.max_position_embeddings, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False,
        "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
    }


def _first(value: Any) -> int | None:
    if isinstance(value, list):
        return int(value[0]) if value else None
    return None if value is None else int(value)
