"""A roofline cost model of one pipeline stage running one batch.

For a batch whose entry i computes q_i new tokens after c_i tokens already in
its KV cache (c_i = the entry's start position), stage s with L_s layers and
P_s = L_s x params_per_layer linear weights:

    T        = sum q_i                                   tokens in the batch
    F_lin    = 2 P_s T            (+ 2 V d n_sampled     on the last stage: lm_head)
    B_w      = 2 P_s              (+ 2 V d               on the last stage;
                                   + 2 d T gathered embedding rows on stage 0)
    F_attn   = 4 L_s n_heads d_head sum q_i (c_i + (q_i + 1) / 2)    causal QK^T and PV
    B_kv     = L_s kv_bytes_per_token_per_layer sum (c_i + q_i)     the KV actually read
    t_stage  = overhead + max(F_lin / (peak eta_c), B_w / (bw eta_m))
                        + max(F_attn / (peak eta_c), B_kv / (bw eta_m))

The linear layers and attention are separate kernels, so each gets its own
roofline: a prefill chunk is compute-bound in both, a decode-only batch is
bound by streaming the weights and by reading each sequence's KV. Between
stages, the hidden state and the residual (2 x d bf16 values per token) cross
the link: t_link = latency + 4 d T / link_bandwidth.

Efficiency factors: eta_c and eta_m are the only fitted constants (see
`CALIBRATED` and docs/simulator.md). Every other constant in `CostParams` was
fixed before the fit, from the sources given beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from .gpus import GpuSpec
from .models import BYTES_PER_PARAM, ModelSpec, layers_per_stage


@dataclass(frozen=True)
class CostParams:
    # Fitted (to the seed's one-batch-per-request run; values in CALIBRATED).
    compute_efficiency: float = 0.5          # eta_c: share of peak bf16 FLOP/s achieved
    memory_efficiency: float = 0.6           # eta_m: share of peak memory bandwidth achieved
    # Fixed a priori, not fitted.
    stage_overhead_s: float = 2e-3           # per batch per stage: input prep, launches, sampler;
                                             # assumed (vLLM V1 eager parts around CUDA graphs)
    link_latency_s: float = 30e-6            # per transfer; docs/pipeline-facts.md §"The link between stages": 20-50 us over PCIe
    dispatch_s: float = 1e-3                 # engine -> stage 0 (Ray compiled graph); assumed
    return_s: float = 0.2e-3                 # last stage -> engine, sampled ids only; assumed
    sched_fixed_s: float = 0.2e-3            # schedule(): fixed part; assumed
    sched_per_running_s: float = 5e-6        # schedule(): per running request (vLLM 0.8.5,
                                             # docs/scheduler-cost.md §"The first anchor: vLLM 0.8.5 alone": 4-6 us)
    update_fixed_s: float = 0.2e-3           # update_from_output(): fixed part; assumed
    update_per_entry_s: float = 5e-6         # per scheduled request (same page: 4-5 us)
    client_in_s: float = 2e-3                # HTTP + tokenisation before the engine has it; assumed
    client_out_s: float = 1e-3               # engine output -> streamed chunk (IPC, detok); assumed

    def with_efficiency(self, compute: float, memory: float) -> "CostParams":
        return replace(self, compute_efficiency=compute, memory_efficiency=memory)


# eta_c, eta_m fitted by benchmarks/calibrate.py to the seed's V1-main run
# (one-batch-per-request): mean TTFT 359.48 ms and mean TPOT 110.96 ms, as the
# median over workload seeds 0-19, Llama-3.1-8B on 2x L4 (docs/calibration.json;
# the fit reached 359.55 ms and 110.97 ms). Not refitted for continue-prefill,
# nor for other GPUs or models.
CALIBRATED = CostParams(compute_efficiency=0.4405, memory_efficiency=0.7834)


@dataclass(frozen=True)
class _Stage:
    linear_flops_per_token: float
    weight_bytes: float
    attn_flops_coeff: float          # times sum q (c + (q+1)/2)
    kv_bytes_per_token: float
    lm_head_flops_per_sample: float
    embedding_bytes_per_token: float


class StageCostModel:
    """Seconds a stage takes for a batch, and a transfer between stages."""

    def __init__(self, model: ModelSpec, gpu: GpuSpec, num_stages: int,
                 params: CostParams = CALIBRATED) -> None:
        self.model, self.gpu, self.params = model, gpu, params
        self.num_stages = num_stages
        self.layers = layers_per_stage(model.num_layers, num_stages)
        self._flops_rate = gpu.peak_bf16_flops * params.compute_efficiency
        self._byte_rate = gpu.mem_bandwidth * params.memory_efficiency
        d = model.hidden_size
        self._stages: list[_Stage] = []
        for s, num_layers in enumerate(self.layers):
            linear = num_layers * model.params_per_layer
            last = s == num_stages - 1
            lm_head = model.embedding_params if last else 0
            self._stages.append(_Stage(
                linear_flops_per_token=2.0 * linear,
                weight_bytes=BYTES_PER_PARAM * (linear + lm_head),
                attn_flops_coeff=4.0 * num_layers * model.num_heads * model.head_dim,
                kv_bytes_per_token=num_layers * model.kv_bytes_per_token_per_layer,
                lm_head_flops_per_sample=2.0 * model.embedding_params if last else 0.0,
                embedding_bytes_per_token=BYTES_PER_PARAM * d if s == 0 else 0.0))
        self._link_bytes_per_token = 2 * d * BYTES_PER_PARAM

    def batch_terms(self, entries: Sequence[tuple[int, int, bool]]) -> tuple[int, int, float, int]:
        """(tokens, samples, sum q (c + (q+1)/2), KV tokens read) of a batch
        given as (start c, new tokens q, samples) per entry."""
        tokens = samples = kv_read = 0
        attn = 0.0
        for c, q, s in entries:
            tokens += q
            samples += s
            attn += q * (c + (q + 1) * 0.5)
            kv_read += c + q
        return tokens, samples, attn, kv_read

    def stage_time(self, stage: int, terms: tuple[int, int, float, int]) -> float:
        tokens, samples, attn, kv_read = terms
        st = self._stages[stage]
        linear_flops = st.linear_flops_per_token * tokens + st.lm_head_flops_per_sample * samples
        linear_bytes = st.weight_bytes + st.embedding_bytes_per_token * tokens
        attn_flops = st.attn_flops_coeff * attn
        kv_bytes = st.kv_bytes_per_token * kv_read
        fr, br = self._flops_rate, self._byte_rate
        return (self.params.stage_overhead_s
                + max(linear_flops / fr, linear_bytes / br)
                + max(attn_flops / fr, kv_bytes / br))

    def link_time(self, tokens: int) -> float:
        return self.params.link_latency_s + self._link_bytes_per_token * tokens / self.gpu.link_bandwidth

    def kv_bytes_per_token(self, stage: int) -> float:
        return self._stages[stage].kv_bytes_per_token

    def weight_bytes(self, stage: int) -> float:
        return self._stages[stage].weight_bytes + (
            BYTES_PER_PARAM * self.model.embedding_params if stage == 0 else 0)
