"""The models the KV connector's historical bugs are hunted on
(verification/mutants/kv_connector.py), and which one each is hunted on.

Most are hunted on the connector's own models (models.KV_PROFILE_MODELS,
each sized for one feature cluster); the few whose bug needs a behaviour
none of those has get a model of their own here, each with only what the
bug needs (the smaller the model, the shorter the counterexample):

* a partial async hit (a landed load that leaves prompt tokens to compute),
  for a second load promised after promotion (#18232);
* prefix caching with an async load under KV pressure, for a promoted load
  that cannot be admitted at once (#18631);
* prefix caching with two requests sharing a prompt block, one of them
  loading it asynchronously and allowed to fail (#37827).
"""

from __future__ import annotations

from dataclasses import replace

from flightcheck.spec import Config, KvConnector, Prompt
from flightcheck.verification.models import KV_PROFILE_MODELS, Model
from flightcheck.verification.mutants.kv_connector import KV_PROFILE

# "Sometimes" targets these models, each sized for one bug, are too small to
# reach (the connector's own models reach them).
_SKIPPED = ("preempted_request_resumes_and_finishes", "resumption_deferred", "stale_output_delivered",
            "decode_behind_decode", "stopped_with_output_in_flight", "two_prefill_chunks_in_flight",
            "blocks_freed_behind_fence")


def _kv(prompt_len: int, max_tokens: int, external_hit: int = 0, load_async: bool = False,
        labels: tuple[int, ...] = ()) -> Prompt:
    return Prompt(prompt_len, max_tokens, labels, external_hit, load_async)


# A prompt of 5 whose first block loads asynchronously: once the load has
# landed, 3 prompt tokens are left to compute.
KV_PARTIAL_LOAD = Model(
    "kv-partial-load",
    Config(num_stages=2, max_num_batched_tokens=4, max_num_seqs=1, block_size=2, num_blocks=3,
           max_model_len=6, prefix_caching=False, profile=KV_PROFILE, kv_connector=KvConnector()),
    (_kv(5, 1, 2, load_async=True),),
    allow_stop=False, allow_abort=False, skip_targets=_SKIPPED,
)
# Prefix caching: a running request that grows to the whole pool, beside a
# request whose first block loads asynchronously (its blocks cached once it
# has landed); the landed request cannot be admitted while the other holds
# the pool.
KV_PREFIX_PRESSURE = Model(
    "kv-prefix-pressure",
    Config(num_stages=2, max_num_batched_tokens=4, max_num_seqs=2, block_size=2, num_blocks=3,
           max_model_len=6, prefix_caching=True, profile=KV_PROFILE, kv_connector=KvConnector()),
    (_kv(2, 3, labels=(1,)), _kv(4, 1, 2, load_async=True, labels=(5, 6))),
    allow_stop=False, allow_abort=False, skip_targets=_SKIPPED,
)
# Prefix caching: two requests share their first prompt block; the second
# loads both its blocks asynchronously and its load may fail.
KV_SHARED_PREFIX = Model(
    "kv-shared-prefix",
    Config(num_stages=2, max_num_batched_tokens=4, max_num_seqs=2, block_size=2, num_blocks=4,
           max_model_len=6, prefix_caching=True, profile=KV_PROFILE, kv_connector=KvConnector()),
    (_kv(3, 1, labels=(1,)), _kv(4, 1, 4, load_async=True, labels=(1, 2))),
    allow_stop=False, allow_abort=False, kv_failures=True, skip_targets=_SKIPPED,
)

_CONNECTOR_MODELS = {m.name.split("@")[0]: m for m in KV_PROFILE_MODELS[KV_PROFILE]}

# Each KV connector mutant -> the model it is hunted on, under KV_PROFILE.
KV_MUTANT_MODELS: dict[str, dict[str, Model]] = {KV_PROFILE: {
    "promotion_asks_connector_again_pr18232": KV_PARTIAL_LOAD,
    "landed_load_count_lost_pr18631": KV_PREFIX_PRESSURE,
    "aborted_load_freed_at_once_pr32255": _CONNECTOR_MODELS["kv-fence-k2"],
    "aborted_landed_load_held_pr32255": _CONNECTOR_MODELS["kv-fence-k2"],
    "fence_ignored_pr45357": _CONNECTOR_MODELS["kv-fence-k2"],
    "waiting_head_blocks_promotion_pr45388": _CONNECTOR_MODELS["kv-limit-k2"],
    "fenced_victim_preempted_pr49674": _CONNECTOR_MODELS["kv-fence-k2"],
    "rollback_keeps_placeholders_pr49250": _CONNECTOR_MODELS["kv-load-fail-k2"],
    "shared_prefix_failure_skipped_pr37827": KV_SHARED_PREFIX,
    "send_reported_before_finish_pr26929": _CONNECTOR_MODELS["kv-send-k2"],
    "old_incarnation_transfer_reported_pr46014": _CONNECTOR_MODELS["kv-fence-k2"],
    "remote_load_requested_after_preemption_pr53250": _CONNECTOR_MODELS["kv-fence-k2"],
    "failure_names_foreign_blocks": _CONNECTOR_MODELS["kv-load-fail-k2"],
    "load_reported_twice": _CONNECTOR_MODELS["kv-load-fail-k2"],
}}


def kv_mutant_model(name: str, profile: str = KV_PROFILE) -> Model:
    """The model the KV connector mutant `name` is hunted on under `profile`, with it applied."""
    model = KV_MUTANT_MODELS[profile][name]
    return replace(model, mutant=name)
