"""Pipeline stages: a transformation of the model, not a feature of it.

`split_into_stages(model, K)` partitions the decoder layers into K
consecutive groups. Stage 0 also holds the embedding; the last stage holds
the final norm and the output projection (with tied embeddings, the
embedding matrix again, as vLLM's last PP rank does). A stage's parameters
keep the whole model's names (`layers.7.attention.wq.weight`), so weights can
be loaded into one stage alone.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .config import ModelConfig
from .model import Attend, Rotary, Transformer


def partition_layers(n_layers: int, num_stages: int) -> list[range]:
    """Consecutive layer ranges, as equal as possible; earlier stages take the
    extra layers (the last one also runs the output projection and sampling)."""
    if not 1 <= num_stages <= n_layers:
        raise ValueError(f"cannot split {n_layers} layers into {num_stages} stages")
    base, extra = divmod(n_layers, num_stages)
    ranges, start = [], 0
    for s in range(num_stages):
        size = base + (1 if s < extra else 0)
        ranges.append(range(start, start + size))
        start += size
    return ranges


class Stage(nn.Module):
    def __init__(self, model: Transformer, layer_ids: range, index: int, num_stages: int) -> None:
        super().__init__()
        self.config: ModelConfig = model.config
        self.index, self.num_stages = index, num_stages
        self.layer_ids = layer_ids
        self.is_first, self.is_last = index == 0, index == num_stages - 1
        self.tok_embeddings = model.tok_embeddings if self.is_first else None
        # A ModuleDict keyed by the global layer index keeps the full model's names.
        self.layers = nn.ModuleDict({str(i): model.layers[i] for i in layer_ids})
        self.norm = model.norm if self.is_last else None
        self.output = model.output if self.is_last else None
        self.rotary = model.rotary

    def forward(self, inputs: Tensor, positions: Tensor, attend: Attend) -> Tensor:
        """inputs: token ids [T] on stage 0, else hidden states [T, D] -> [T, D]."""
        x = self.tok_embeddings(inputs) if self.is_first else inputs      # [T, D]
        for layer in self.layers.values():
            x = layer(x, positions, self.rotary, attend)                  # [T, D]
        return x

    def logits(self, hidden: Tensor) -> Tensor:                          # [N, D] -> [N, V]
        assert self.is_last, "only the last stage projects to the vocabulary"
        return self.output(self.norm(hidden))


def split_into_stages(model: Transformer, num_stages: int) -> list[Stage]:
    """K stages that share the model's modules (and so its weights)."""
    ranges = partition_layers(model.config.n_layers, num_stages)
    return [Stage(model, r, s, num_stages) for s, r in enumerate(ranges)]


def build_stage(cfg: ModelConfig, source, index: int, num_stages: int,
                dtype: torch.dtype, device: torch.device | str = "cpu") -> Stage:
    """One stage with only its own weights materialised: the whole model is
    built on the meta device, split, and only this stage is allocated and
    loaded (`source` is a `weights.WeightSource`)."""
    with torch.device("meta"):
        model = Transformer(cfg)
    stage = split_into_stages(model, num_stages)[index]
    stage.to_empty(device=device)
    stage.to(dtype)
    stage.rotary = Rotary(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta).to(device)
    # A tied output projection is loaded from the embedding's values by name.
    source.load_into(stage, cfg)
    return stage.eval()


def build_model(cfg: ModelConfig, source, dtype: torch.dtype,
                device: torch.device | str = "cpu") -> Transformer:
    """The whole model with its weights (for dense references and PP = 1)."""
    model = Transformer(cfg).to(device=device, dtype=dtype)
    model.rotary = Rotary(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta).to(device)
    source.load_into(model, cfg)
    return model.eval()
