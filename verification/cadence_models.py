"""The prefill cadence's model-checking constants (spec/cadence.py): small
models with `prefill_schedule_interval` 2 under vLLM 0.34, sync and async,
where a decode and a later prefill meet, and where the queue backs up.
"""

from __future__ import annotations

from dataclasses import replace

from flightcheck.spec import Config, Prompt
from flightcheck.verification.models import Model

# Targets of every profile these models are too small to reach.
_SKIPPED = ("resumption_deferred", "stale_output_delivered", "stopped_with_output_in_flight",
            "preempted_request_resumes_and_finishes", "decode_behind_decode", "duplicate_cached_block")

# K = 2, interval 2: a one-token prompt that decodes while a four-token
# prompt (two chunks under a budget of 3) and a second copy of the first
# (a full prefix hit once the first caches its block: one token left, the
# gate's edge) arrive; seats for two, so the queue can back up.
CADENCE_K2 = Model(
    "cadence-k2",
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2, num_blocks=5,
           max_model_len=7, prefix_caching=True, profile="vllm-0.34", prefill_schedule_interval=2),
    (Prompt(1, 3), Prompt(4, 2, (1, 2)), Prompt(3, 1, (1,))),
    allow_abort=False, allow_stop=False, skip_targets=_SKIPPED,
)
CADENCE_K2_ASYNC = replace(CADENCE_K2.under_profile("vllm-0.34-async"), name="cadence-k2-async")

CADENCE_MODELS: dict[str, tuple[Model, ...]] = {
    "vllm-0.34": (CADENCE_K2,),
    "vllm-0.34-async": (CADENCE_K2_ASYNC,),
    "vllm-0.33": (CADENCE_K2.under_profile("vllm-0.33"),),
    "vllm-0.33-async": (CADENCE_K2.under_profile("vllm-0.33-async"),),
}
