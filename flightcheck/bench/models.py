"""Model shapes the cost model needs, as data (from the models' Hugging Face
`config.json`), and how vLLM splits the layers over pipeline stages.

Dense decoder-only transformers with grouped-query attention and a gated MLP
(Llama, Mistral, Qwen2); bf16 weights and KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from .workload import WorkloadError

BYTES_PER_PARAM = 2        # bf16


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool = False

    @property
    def params_per_layer(self) -> int:
        d, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = d * q + 2 * d * kv + q * d          # q, k, v, o projections
        mlp = 3 * d * self.intermediate_size            # gate, up, down
        return attention + mlp + 2 * d                  # two RMSNorm weights

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        return 2 * self.num_kv_heads * self.head_dim * BYTES_PER_PARAM     # K and V

    @property
    def total_params(self) -> int:
        lm_head = 0 if self.tied_embeddings else self.embedding_params
        return self.num_layers * self.params_per_layer + self.embedding_params + lm_head


def layers_per_stage(num_layers: int, num_stages: int) -> list[int]:
    """vLLM's default split (`get_pp_indices`): equal shares, the remainder
    going to the stages just before the last, which already holds lm_head."""
    if num_stages > num_layers:
        raise WorkloadError(f"--pp {num_stages} exceeds the model's {num_layers} layers")
    shares = [num_layers // num_stages] * num_stages
    for i in range(num_layers % num_stages):
        shares[-2 - i] += 1
    return shares


MODELS: dict[str, ModelSpec] = {m.name: m for m in (
    ModelSpec("llama-3.1-8b", 32, 4096, 14336, 32, 8, 128, 128256),
    ModelSpec("llama-3.1-70b", 80, 8192, 28672, 64, 8, 128, 128256),
    ModelSpec("llama-3.2-1b", 16, 2048, 8192, 32, 8, 64, 128256, tied_embeddings=True),
    ModelSpec("mistral-7b", 32, 4096, 14336, 32, 8, 128, 32000),
    ModelSpec("qwen2.5-7b", 28, 3584, 18944, 28, 4, 128, 152064),
)}


def get_model(name: str) -> ModelSpec:
    try:
        return MODELS[name.lower()]
    except KeyError:
        raise WorkloadError(f"unknown --model {name!r}; known: {', '.join(MODELS)}") from None
