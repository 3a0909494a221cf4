"""The seed PR's published benchmark (vLLM #13637, comaniac's comment of
2025-03-11): PP = 2 on 2x L4, Llama-3.1-8B-Instruct,
chunked prefill, --max-num-batched-tokens 2048, --max-model-len 16384, prefix
caching off, BurstGPT_without_fails_2.csv at 2 req/s, 150 prompts.

"V1 main" is the one-batch-per-request scheduler, "this PR" continue-prefill;
the comment's third table (V0) is left out: nothing here models V0.
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
