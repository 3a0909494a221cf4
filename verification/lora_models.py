"""LoRA's `max_loras` cap and the prompt-logprobs limit: model-checking
constants (spec/lora.py), kept apart from the spec as `models.py` keeps the
others.

LORA_K2: a cap of one LoRA, K = 2, three one-token prompts: two of different
LoRAs and one without, so a request of the second LoRA is held while the
first runs (its tokens in flight or not) and the one without LoRA behind it
is admitted past it. PROMPT_LOGPROBS_K2: two requests sharing a cached
block, the second asking for prompt logprobs. PROMPT_LOGPROBS_SESSION_K2: a
streaming session whose next input asks for them, preempted in that turn.
"""

from __future__ import annotations

from dataclasses import replace

from flightcheck.spec import Config, KvConnector, Prompt
from flightcheck.spec.sessions import ASKS_PROMPT_LOGPROBS, END_OF_SESSION
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

# Prompt logprobs beside a streaming session (prefix caching on, two seats,
# a pool of 3 blocks of 2): the session's first input (a prompt of 1, one
# output) asks for none, its next (2 new tokens, 2 outputs) asks for them;
# the plain request (a prompt of one full block, 3 outputs) preempts the
# session's next turn, which looks up its whole prompt on readmission. Under
# vLLM 0.34 the turn's flag is its input's (`_update_request_as_session`
# recomputes `prefix_cache_hit_limit`): it reads nothing cached; under 0.33
# the first input's (`skip_reading_prefix_cache` set once, in
# `Request.__init__`): it hits the block it kept (tests/test_prompt_logprobs_sessions.py).
_SESSION_SKIPPED = ("preempted_request_resumes_and_finishes", "resumption_deferred", "stale_output_delivered",
                    "decode_behind_decode", "stopped_with_output_in_flight", "two_prefill_chunks_in_flight",
                    "blocks_freed_behind_fence", "session_holds_seat_for_input", "session_runs_beside_old_output")
PROMPT_LOGPROBS_SESSION_K2 = Model(
    "prompt-logprobs-session-k2",
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2, num_blocks=3,
           max_model_len=8, prefix_caching=True, profile="vllm-0.34", streaming_sessions=True, prompt_logprobs=True),
    (Prompt(1, 1, session=((2, 2, ASKS_PROMPT_LOGPROBS), END_OF_SESSION)), Prompt(2, 3, labels=(1,))),
    allow_abort=False, skip_targets=_SESSION_SKIPPED,
)


def _at(model: Model, profile: str) -> Model:
    return replace(model.under_profile(profile), name=f"{model.name}@{profile}")


LORA_MODELS: dict[str, tuple[Model, ...]] = {
    "vllm-0.34": (LORA_K2, PROMPT_LOGPROBS_K2, PROMPT_LOGPROBS_SESSION_K2),
    "vllm-0.34-async": (LORA_K2_ASYNC, replace(PROMPT_LOGPROBS_K2.under_profile("vllm-0.34-async"),
                                               name="prompt-logprobs-k2-async"),
                        _at(PROMPT_LOGPROBS_SESSION_K2, "vllm-0.34-async")),
    "vllm-0.33": (LORA_K2.under_profile("vllm-0.33"), PROMPT_LOGPROBS_K2.under_profile("vllm-0.33"),
                  _at(PROMPT_LOGPROBS_SESSION_K2, "vllm-0.33")),
    "vllm-0.33-async": (LORA_K2.under_profile("vllm-0.33-async"),
                        PROMPT_LOGPROBS_K2.under_profile("vllm-0.33-async"),
                        _at(PROMPT_LOGPROBS_SESSION_K2, "vllm-0.33-async")),
}


# --- beside a KV connector (vLLM 0.34; 0.33 reads alike). Targets these
# models are too small to reach, beside the above:
_KV_SKIPPED = _SKIPPED + ("preempted_request_resumes_and_finishes", "decode_behind_decode",
                          "two_prefill_chunks_in_flight", "blocks_freed_behind_fence", "empty_batch_in_queue")

# A cap of one LoRA, a request of LoRA 1 and an async load of LoRA 2 that
# may fail: the load parks while LoRA 1 is admitted beside it, lands, is
# promoted and then passed over by the cap (vLLM tests it after
# `_handle_blocked_waiting_request`), and runs once LoRA 1 is done.
LORA_KV_K2 = Model(
    "lora-kv-k2",
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2, num_blocks=4,
           max_model_len=6, prefix_caching=False, profile="vllm-0.34", max_loras=1,
           kv_connector=KvConnector()),
    (Prompt(1, 2, lora=1), Prompt(2, 1, external_hit=2, load_async=True, lora=2)),
    allow_abort=False, allow_stop=False, kv_failures=True, skip_targets=_KV_SKIPPED,
)
# A prompt-logprobs request offered an async load of a prefix another request
# loads and caches: it drops the offer (`skip_reading_external_kv`) and the
# cached prefix, never parks.
PROMPT_LOGPROBS_KV_K2 = Model(
    "prompt-logprobs-kv-k2",
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2, num_blocks=4,
           max_model_len=6, prefix_caching=True, profile="vllm-0.34", prompt_logprobs=True,
           kv_connector=KvConnector()),
    (Prompt(2, 1, (3,), external_hit=2, load_async=True),
     Prompt(3, 1, (3,), external_hit=2, load_async=True, prompt_logprobs=True)),
    allow_abort=False, allow_stop=False, kv_failures=True, skip_targets=_KV_SKIPPED,
)
LORA_KV_MODELS = (LORA_KV_K2, PROMPT_LOGPROBS_KV_K2)
