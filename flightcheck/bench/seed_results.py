"""The seed PR's published benchmark (vLLM #13637, comaniac's comment of
2025-03-11; full text in shared/seed/): PP = 2 on 2x L4, Llama-3.1-8B-Instruct,
chunked prefill, --max-num-batched-tokens 2048, --max-model-len 16384, prefix
caching off, BurstGPT_without_fails_2.csv at 2 req/s, 150 prompts.

"V1 main" is the one-batch-per-request scheduler, "this PR" continue-prefill.
"""

from __future__ import annotations

V1_MAIN = {
    "completed": 150, "duration": 175.30, "total_input_tokens": 106025,
    "total_output_tokens": 41936, "request_throughput": 0.86, "output_throughput": 239.23,
    "total_token_throughput": 844.05,
    "mean_ttft_ms": 359.48, "median_ttft_ms": 217.95, "p99_ttft_ms": 1705.93,
    "mean_tpot_ms": 110.96, "median_tpot_ms": 110.21, "p99_tpot_ms": 155.08,
    "mean_itl_ms": 107.03, "median_itl_ms": 95.87, "p99_itl_ms": 507.94,
}

THIS_PR = {
    "completed": 150, "duration": 173.27, "total_input_tokens": 106025,
    "total_output_tokens": 41920, "request_throughput": 0.87, "output_throughput": 241.94,
    "total_token_throughput": 853.85,
    "mean_ttft_ms": 308.59, "median_ttft_ms": 197.27, "p99_ttft_ms": 1234.44,
    "mean_tpot_ms": 107.31, "median_tpot_ms": 107.30, "p99_tpot_ms": 150.19,
    "mean_itl_ms": 103.79, "median_itl_ms": 94.51, "p99_itl_ms": 492.35,
}

V0_MAIN = {
    "completed": 150, "duration": 185.01, "total_input_tokens": 106025,
    "total_output_tokens": 42550, "request_throughput": 0.81, "output_throughput": 229.99,
    "total_token_throughput": 803.06,
    "mean_ttft_ms": 366.26, "median_ttft_ms": 245.31, "p99_ttft_ms": 1650.63,
    "mean_tpot_ms": 121.15, "median_tpot_ms": 121.40, "p99_tpot_ms": 166.25,
    "mean_itl_ms": 117.67, "median_itl_ms": 109.92, "p99_itl_ms": 494.85,
}

SEED_BY_POLICY = {"one-batch-per-request": V1_MAIN, "continue-prefill": THIS_PR}

# The seed's configuration, as `flightcheck simulate` arguments.
SEED_CONFIG = {
    "model": "llama-3.1-8b", "gpu": "L4", "pp": 2, "max_num_batched_tokens": 2048,
    "max_model_len": 16384, "dataset": "burstgpt", "request_rate": 2.0, "num_prompts": 150,
    "enable_prefix_caching": False,
}
