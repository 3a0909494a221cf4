"""A synthetic stand-in for BurstGPT's GPT-4 rows, for when the CSV is absent.

`--dataset burstgpt` without `--dataset-path` uses this. Its parameters were
fixed from published figures *before* any simulator calibration and are not
to be changed to improve a fit:

* Prompt and output lengths are lognormal, independent. BurstGPT's authors
  model lengths with heavy-tailed (Zipf) laws; a lognormal has the same
  right skew and, unlike a pure Zipf law over integers, can match a given
  mean and spread with two parameters.
* Means: 106,025 / 150 = 706.8 prompt tokens and 42,550 / 150 = 283.7 output
  tokens, the totals of the 150-request BurstGPT sample in the seed PR's
  benchmark (vLLM #13637, V0 table; the V1 runs show the same input total).
* Spread (sigma of the log): 0.96 for prompts and 0.50 for outputs, the
  sample standard deviations of ln(tokens) over the nine GPT-4 rows with a
  response shown on the first page of the Hugging Face viewer of
  BurstGPT_1.csv (lzzmm/BurstGPT: 417/276, 586/293, 549/362, 969/206,
  1574/501, 92/95, 1327/239, 1840/378, 1741/428). Nine rows make this a
  rough estimate; it implies ~5.6 % of prompts above 2048 tokens (the chunks
  that make PP's P99 TTFT) and ~1 % above 4096.
* A draw whose prompt + output exceeds `max_model_len` is redrawn (the
  server would refuse it; the PR's run had no failed request).
"""

from __future__ import annotations

import math
import random

from .workload import RequestSpec, Workload

PROMPT_MEAN_TOKENS = 106_025 / 150
OUTPUT_MEAN_TOKENS = 42_550 / 150
PROMPT_LOG_SIGMA = 0.96
OUTPUT_LOG_SIGMA = 0.50


def _lognormal_mu(mean: float, sigma: float) -> float:
    """mu such that a lognormal(mu, sigma) has the given mean."""
    return math.log(mean) - sigma * sigma / 2


def synthetic_burstgpt(num_prompts: int, seed: int, max_model_len: int = 16384) -> Workload:
    rng = random.Random(seed)
    mu_in = _lognormal_mu(PROMPT_MEAN_TOKENS, PROMPT_LOG_SIGMA)
    mu_out = _lognormal_mu(OUTPUT_MEAN_TOKENS, OUTPUT_LOG_SIGMA)
    requests: list[RequestSpec] = []
    while len(requests) < num_prompts:
        prompt = max(1, round(rng.lognormvariate(mu_in, PROMPT_LOG_SIGMA)))
        output = max(1, round(rng.lognormvariate(mu_out, OUTPUT_LOG_SIGMA)))
        if prompt + output <= max_model_len:
            requests.append(RequestSpec(f"r{len(requests)}", prompt, output))
    return Workload("burstgpt-synthetic", tuple(requests))
