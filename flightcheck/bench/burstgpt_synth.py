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
  server would refuse it; the PR's run had no failed request). Below
  MIN_MAX_MODEL_LEN (256) fewer than ~2 % of draws fit: the workload would no
  longer be BurstGPT-like (and below ~100 the redrawing would not end), so a
  smaller `max_model_len` is refused, naming the limit.
"""

from __future__ import annotations

import math
import random

from .workload import RequestSpec, Workload, WorkloadError

PROMPT_MEAN_TOKENS = 106_025 / 150
OUTPUT_MEAN_TOKENS = 42_550 / 150
PROMPT_LOG_SIGMA = 0.96
OUTPUT_LOG_SIGMA = 0.50
MIN_MAX_MODEL_LEN = 256          # ~2 % of draws fit in 256 tokens, ~1 % in 214
MAX_DRAWS_PER_REQUEST = 1_000    # a bound on redrawing, far above the ~50 draws at the minimum


def _lognormal_mu(mean: float, sigma: float) -> float:
    """mu such that a lognormal(mu, sigma) has the given mean."""
    return math.log(mean) - sigma * sigma / 2


def synthetic_burstgpt(num_prompts: int, seed: int, max_model_len: int = 16384) -> Workload:
    if max_model_len < MIN_MAX_MODEL_LEN:
        raise WorkloadError(f"--max-model-len {max_model_len} is too small for the synthetic BurstGPT "
                            f"workload: it needs at least {MIN_MAX_MODEL_LEN} (prompt + output of most "
                            "requests); use --dataset random for shorter requests")
    rng = random.Random(seed)
    mu_in = _lognormal_mu(PROMPT_MEAN_TOKENS, PROMPT_LOG_SIGMA)
    mu_out = _lognormal_mu(OUTPUT_MEAN_TOKENS, OUTPUT_LOG_SIGMA)
    requests: list[RequestSpec] = []
    for _ in range(MAX_DRAWS_PER_REQUEST * num_prompts):
        if len(requests) == num_prompts:
            break
        prompt = max(1, round(rng.lognormvariate(mu_in, PROMPT_LOG_SIGMA)))
        output = max(1, round(rng.lognormvariate(mu_out, OUTPUT_LOG_SIGMA)))
        if prompt + output <= max_model_len:
            requests.append(RequestSpec(f"r{len(requests)}", prompt, output))
    if len(requests) < num_prompts:
        raise WorkloadError(f"--max-model-len {max_model_len}: only {len(requests)} of {num_prompts} "
                            f"synthetic BurstGPT requests fit after {MAX_DRAWS_PER_REQUEST} draws each")
    return Workload("burstgpt-synthetic", tuple(requests))
