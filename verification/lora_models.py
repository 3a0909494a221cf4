"""LoRA's `max_loras` cap and the prompt-logprobs limit: model-checking
constants (spec/lora.py), kept apart from the spec as `models.py` keeps the
others.

LORA_K2: a cap of one LoRA, K = 2, three one-token prompts: two of different
LoRAs and one without, so a request of the second LoRA is held while the
first runs (its tokens in flight or not) and the one without LoRA behind it
is admitted past it. PROMPT_LOGPROBS_K2: two requests sharing a cached
block, the second asking for prompt logprobs.
"""

from __future__ import annotations

from dataclasses import replace

from flightcheck.spec import Config, Prompt
from flightcheck.verification.models import Model

# Targets of every profile these models are too small to reach.
_SKIPPED = ("resumption_deferred", "stale_output_delivered", "stopped_with_output_in_flight",
            "preempted_request_resumes_and_finishes", "decode_behind_decode", "duplicate_cached_block",
            "two_prefill_chunks_in_flight", "blocks_freed_behind_fence")

LORA_K2 = Model(
    "lora-k2",
    Config(num_stages=2, max_num_batched_tokens=4, max_num_seqs=3, block_size=2, num_blocks=4,
           max_model_len=5, prefix_caching=False, profile="vllm-0.34", max_loras=1),
    (Prompt(1, 2, lora=1), Prompt(1, 1, lora=2), Prompt(1, 1)),
    allow_abort=False, allow_stop=False, skip_targets=_SKIPPED,
)
LORA_K2_ASYNC = replace(LORA_K2.under_profile("vllm-0.34-async"), name="lora-k2-async")

# The second request's prompt repeats the first's block (label 1); it asks
# for prompt logprobs, so it never reads that block from the cache.
PROMPT_LOGPROBS_K2 = Model(
    "prompt-logprobs-k2",
    Config(num_stages=2, max_num_batched_tokens=4, max_num_seqs=2, block_size=2, num_blocks=4,
           max_model_len=5, prefix_caching=True, profile="vllm-0.34", prompt_logprobs=True),
    (Prompt(3, 1, (1,)), Prompt(3, 1, (1,), prompt_logprobs=True)),
    allow_abort=False, allow_stop=False, skip_targets=_SKIPPED,
)

LORA_MODELS: dict[str, tuple[Model, ...]] = {
    "vllm-0.34": (LORA_K2, PROMPT_LOGPROBS_K2),
    "vllm-0.34-async": (LORA_K2_ASYNC, replace(PROMPT_LOGPROBS_K2.under_profile("vllm-0.34-async"),
                                               name="prompt-logprobs-k2-async")),
    "vllm-0.33": (LORA_K2.under_profile("vllm-0.33"), PROMPT_LOGPROBS_K2.under_profile("vllm-0.33")),
    "vllm-0.33-async": (LORA_K2.under_profile("vllm-0.33-async"),
                        PROMPT_LOGPROBS_K2.under_profile("vllm-0.33-async")),
}
