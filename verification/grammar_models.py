"""Structured output's model-checking constants (docs/request-states.md,
"Structured output"), kept apart from the spec as `models.py` keeps the
others: small models whose requests wait for a grammar that compiles or
fails, and whose FSM is advanced by outputs with batches in flight, each
searched under the profiles that model structured output (vLLM 0.33 and
0.34, sync and async); the models the grammar mutants are hunted on; and
the pair's models beside a KV connector (docs/request-states.md, "Features
together").
"""

from __future__ import annotations

from dataclasses import replace

from flightcheck.spec import Config, KvConnector, Prompt
from flightcheck.verification.models import Model

# The "sometimes" targets of every profile these models are too small to
# reach (sized for the grammar, not for preemption or prefix caching).
_GRAMMAR_SKIPPED = ("preempted_request_resumes_and_finishes", "resumption_deferred", "stale_output_delivered",
                    "decode_behind_decode", "stopped_with_output_in_flight", "two_prefill_chunks_in_flight",
                    "blocks_freed_behind_fence")


def _g(prompt_len: int, max_tokens: int, structured: bool = True) -> Prompt:
    return Prompt(prompt_len, max_tokens, structured=structured)


def _under(model: Model, profile: str) -> Model:
    """`model` under `profile`, renamed after it ("grammar-k2@vllm-0.34-async")."""
    return replace(model.under_profile(profile), name=f"{model.name}@{profile}")


# Two requests, one structured, K = 2: compile or fail while the other runs,
# the waiting loop skipping the one that waits, a failed grammar finished by
# the next completion, aborts while compiling.
GRAMMAR_K2 = Model(
    "grammar-k2",
    Config(num_stages=2, max_num_batched_tokens=4, max_num_seqs=2, block_size=2, num_blocks=4,
           max_model_len=6, prefix_caching=False, profile="vllm-0.34", structured_output=True),
    (_g(2, 2), _g(1, 2, structured=False)),
    allow_stop=False, skip_targets=_GRAMMAR_SKIPPED,
)
# One structured request with a draft per step under async scheduling with
# K = 1 (a queue of 2, a stagger of 1): it is scheduled again while its
# output is in flight, so its next bitmask is deferred (vLLM #29379), and a
# grammar-illegal draft reaches its batch (vLLM #49694).
GRAMMAR_SPEC_K1 = Model(
    "grammar-spec-k1",
    Config(num_stages=1, max_num_batched_tokens=4, max_num_seqs=1, block_size=2, num_blocks=4,
           max_model_len=7, num_spec_tokens=1, prefix_caching=False, profile="vllm-0.34-async",
           structured_output=True),
    (_g(2, 3),),
    allow_abort=False, allow_stop=False, skip_targets=_GRAMMAR_SKIPPED,
)

# The profiles that model structured output, each model searched under each.
GRAMMAR_PROFILES = ("vllm-0.33", "vllm-0.33-async", "vllm-0.34", "vllm-0.34-async")
GRAMMAR_MODELS: tuple[Model, ...] = tuple(_under(m, p) for m in (GRAMMAR_K2, GRAMMAR_SPEC_K1)
                                          for p in GRAMMAR_PROFILES)


def grammar_mutant_model(name: str) -> Model:
    """The model the grammar mutant `name` is hunted on (under vllm-0.34-async), with it applied."""
    model = GRAMMAR_SPEC_K1 if name in _ON_SPEC_DECODE else GRAMMAR_K2
    return _under(model, "vllm-0.34-async").with_mutant(name)


# The mutants whose bug needs a draft (or a decode scheduled with its output in flight).
_ON_SPEC_DECODE = ("stale_fsm_bitmask_29379", "illegal_draft_verified_49694", "fsm_advanced_by_drafts_scheduled")


# --- beside a KV connector (vLLM 0.34; 0.33 reads alike): the waiting loop
# asks the connector only once `_handle_blocked_waiting_request` let the
# request through, so a request whose grammar compiles (or failed) never
# loads. Targets these models are too small to reach, beside the above:
_GRAMMAR_KV_SKIPPED = _GRAMMAR_SKIPPED + ("empty_batch_in_queue",)

# vLLM 0.34's load limit with one seat: a structured request offered an
# async load of its prompt (in `async_kv_waiting` from its arrival, its
# grammar compiling or not) beside a plain request that takes the seat: in
# loads-only mode it is skipped while its grammar compiles (or failed) and
# parks once compiled; the load may fail; its first sampled token masked.
GRAMMAR_KV_LIMIT_K2 = Model(
    "grammar-kv-limit-k2",
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=1, block_size=2, num_blocks=4,
           max_model_len=6, prefix_caching=False, profile="vllm-0.34", structured_output=True,
           kv_connector=KvConnector(max_inflight_loads=1)),
    (Prompt(2, 1, external_hit=2, load_async=True, structured=True), Prompt(1, 2)),
    allow_stop=False, allow_abort=False, kv_failures=True, skip_targets=_GRAMMAR_KV_SKIPPED,
)
# Two structured requests, an async load and a sync one (its failure rolls
# the request back with its batch in flight, K = 2): the FSM never advances
# by a rolled-back output.
GRAMMAR_KV_K2 = Model(
    "grammar-kv-k2",
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2, num_blocks=4,
           max_model_len=6, prefix_caching=False, profile="vllm-0.34", structured_output=True,
           kv_connector=KvConnector()),
    (Prompt(2, 2, external_hit=2, load_async=True, structured=True), Prompt(3, 1, external_hit=2, structured=True)),
    allow_stop=False, allow_abort=False, kv_failures=True, skip_targets=_GRAMMAR_KV_SKIPPED,
)
GRAMMAR_KV_MODELS = (GRAMMAR_KV_LIMIT_K2, GRAMMAR_KV_K2)
