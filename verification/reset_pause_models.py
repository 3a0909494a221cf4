"""Reset and pause's model-checking constants (spec/reset_pause.py,
docs/request-states.md), kept apart from the spec as `models.py` keeps the
others: small models where the environment may reset the prefix cache
(with or without the running requests) and set any pause state between
any two steps, searched under vLLM 0.34 sync and async, the model each
reset-and-pause mutant is hunted on, and the pair's models beside a KV
connector (docs/request-states.md, "Features together").
"""

from __future__ import annotations

from dataclasses import replace

from flightcheck.spec import Config, KvConnector, Prompt
from flightcheck.verification.models import Model
from flightcheck.verification.mutants.reset_pause import RESET_PAUSE_PROFILE

# Targets of every profile these models are too small to reach, or that the
# drop mode of a reset makes moot (deliver-mode stale output).
_SKIPPED = ("resumption_deferred", "stale_output_delivered", "stopped_with_output_in_flight",
            "preempted_request_resumes_and_finishes", "decode_behind_decode")

# K = 2, a pool of 3 blocks (the decode of one request preempts the other:
# the running loop's preemption beside the reset's), two requests sharing
# no prefix but each caching a block (so a reset has labels to clear).
RESET_PAUSE_K2 = Model(
    "reset-pause-k2",
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2, num_blocks=3,
           max_model_len=6, prefix_caching=True, profile="vllm-0.34", reset_and_pause=True),
    (Prompt(1, 3), Prompt(3, 2, (7,))),
    allow_abort=False, allow_stop=False, skip_targets=_SKIPPED,
)
RESET_PAUSE_K2_ASYNC = replace(RESET_PAUSE_K2.under_profile("vllm-0.34-async"), name="reset-pause-k2-async")
# One request with a draft per step, K = 2, async, one seat: a reset drops a
# draft-carrying decode in flight and the request resumes (same step: drop
# mode) while that decode is still out, with fresh placeholders of its own
# (vLLM #46066). 2,190 states; no other request is needed for the bug.
RESET_DRAFTS_K2 = Model(
    "reset-drafts-k2",
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=1, block_size=2, num_blocks=3,
           max_model_len=6, prefix_caching=False, num_spec_tokens=1, profile="vllm-0.34-async",
           reset_and_pause=True),
    (Prompt(1, 3),),
    allow_abort=False, allow_stop=False, skip_targets=_SKIPPED + ("two_prefill_chunks_in_flight",),
)
# The reset-and-pause mutants whose bug needs a draft in flight.
_ON_DRAFTS = ("stale_rejections_settled_pr46066",)

# The models `flightcheck verify` would search per profile, by profile.
RESET_PAUSE_MODELS: dict[str, tuple[Model, ...]] = {
    "vllm-0.34": (RESET_PAUSE_K2,),
    "vllm-0.34-async": (RESET_PAUSE_K2_ASYNC,),
    "vllm-0.33": (RESET_PAUSE_K2.under_profile("vllm-0.33"),),
    "vllm-0.33-async": (RESET_PAUSE_K2.under_profile("vllm-0.33-async"),),
}


def reset_pause_mutant_model(name: str) -> Model:
    """The model the reset-and-pause mutant `name` is hunted on, with it applied."""
    model = RESET_DRAFTS_K2 if name in _ON_DRAFTS else RESET_PAUSE_K2_ASYNC
    assert model.cfg.profile == RESET_PAUSE_PROFILE
    return model.with_mutant(name)


# --- beside a KV connector (vLLM 0.34; the same code in 0.33). Targets these
# models are too small to reach, beside the above:
_KV_SKIPPED = _SKIPPED + ("empty_batch_in_queue", "load_lands_and_runs", "two_prefill_chunks_in_flight")

# One batch in flight (K = 1, sync: no step fence) and sync loads that may
# fail: a reset while the batch carrying a load is in flight (the load's
# failure then reaches nobody), a pause beside it. Every invariant of both
# features holds: nothing but running requests ever holds a block here.
RESET_KV_SYNC_K1 = Model(
    "reset-kv-sync-k1",
    Config(num_stages=1, max_num_batched_tokens=3, max_num_seqs=2, block_size=2, num_blocks=3,
           max_model_len=6, prefix_caching=True, profile="vllm-0.34", reset_and_pause=True,
           kv_connector=KvConnector()),
    (Prompt(3, 1, (5,), external_hit=2), Prompt(2, 1, (7,))),
    allow_stop=False, allow_abort=False, kv_failures=True, skip_targets=_KV_SKIPPED,
)
# K = 2 (the step fence) with one seat, an async load of a whole prompt and
# a plain request: PAUSED_NEW promotes and runs the landed load and admits
# nothing from `waiting`, PAUSED_ALL leaves it parked. Every invariant holds
# but RP4: a reset of the running requests fails while the parked load, or
# a fenced free, holds blocks (vLLM raises there: the finding,
# docs/vllm-kv-connector-findings.md).
RESET_KV_ASYNC_K2 = Model(
    "reset-kv-async-k2",
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=1, block_size=2, num_blocks=3,
           max_model_len=6, prefix_caching=False, profile="vllm-0.34", reset_and_pause=True,
           kv_connector=KvConnector()),
    (Prompt(2, 1, external_hit=2, load_async=True), Prompt(1, 1)),
    allow_stop=False, allow_abort=False, skip_targets=_KV_SKIPPED,
)
RESET_PAUSE_KV_MODELS = (RESET_KV_SYNC_K1, RESET_KV_ASYNC_K2)
