"""The KV connector's model-checking constants (docs/kv-connector.md), kept
apart from the spec as `models.py` keeps the others: one small model per
feature cluster, each searched under the profiles that have a connector's
async loads, and the model each connector mutant is hunted on.
"""

from __future__ import annotations

from dataclasses import replace

from flightcheck.spec import Config, KvConnector, Prompt
from flightcheck.verification.models import Model

# Each model: K = 2, no prefix caching and no stop tokens (which no
# connector rule reads), searched under the profiles that have a
# connector's async loads (KV_PROFILE_MODELS) by `flightcheck verify
# --kv-connector`. The targets of every profile it is too small to reach:
_KV_SKIPPED = ("preempted_request_resumes_and_finishes", "resumption_deferred", "stale_output_delivered",
               "decode_behind_decode", "stopped_with_output_in_flight")


def _under(model: Model, profile: str) -> Model:
    """`model` under `profile`, renamed after it ("kv-fence-k2@vllm-0.34")."""
    return replace(model.under_profile(profile), name=f"{model.name}@{profile}")


def _kv(prompt_len: int, max_tokens: int, external_hit: int, load_async: bool = False) -> Prompt:
    return Prompt(prompt_len, max_tokens, (), external_hit, load_async)


# An async load of every prompt token and a sync hit, both allowed to fail
# (request-level and block-level): promotion, the recompute rollback of a
# parked load and of a sync load with its batch in flight, aborts during a load.
KV_LOAD_FAIL_K2 = Model(
    "kv-load-fail-k2",
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2, num_blocks=4,
           max_model_len=6, prefix_caching=False, profile="vllm-0.33", kv_connector=KvConnector()),
    (_kv(4, 1, 4, load_async=True), _kv(3, 1, 2)),
    allow_stop=False, kv_failures=True, skip_targets=_KV_SKIPPED,
)
# The same under the fail policy: a failed request finishes with
# FINISHED_ERROR, a parked one's blocks held until its load reports.
KV_LOAD_ERROR_K2 = replace(KV_LOAD_FAIL_K2, name="kv-load-error-k2",
                           cfg=replace(KV_LOAD_FAIL_K2.cfg, kv_connector=KvConnector(load_failure_policy="fail")),
                           skip_targets=_KV_SKIPPED + ("two_prefill_chunks_in_flight",))
# A producer (no loads): finished requests held until sent, aborts, and a
# preemption that drops the victim's in-flight output (`requires_kv_delivery`).
KV_SEND_K2 = Model(
    "kv-send-k2",
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2, num_blocks=3,
           max_model_len=6, prefix_caching=False, profile="vllm-0.33",
           kv_connector=KvConnector(consumer=False, producer=True)),
    (_kv(1, 3, 0), _kv(3, 2, 0)),
    allow_stop=False, skip_targets=_KV_SKIPPED,
)
# A consumer under K = 2 in a pool of 3 blocks: the step fence (deferred
# frees drained by completions, a victim with a batch in flight not
# preempted) beside an async load.
KV_FENCE_K2 = Model(
    "kv-fence-k2",
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2, num_blocks=3,
           max_model_len=6, prefix_caching=False, profile="vllm-0.33", kv_connector=KvConnector()),
    (_kv(1, 3, 0), _kv(3, 2, 2, load_async=True)),
    allow_stop=False, skip_targets=_KV_SKIPPED[1:],
)
# vLLM 0.34's load limit (one load at a time) with one seat: async_kv_waiting
# beside waiting, loads started in loads-only mode, the limit holding a second load back.
KV_LIMIT_K2 = Model(
    "kv-limit-k2",
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=1, block_size=2, num_blocks=4,
           max_model_len=6, prefix_caching=False, profile="vllm-0.34",
           kv_connector=KvConnector(max_inflight_loads=1)),
    (_kv(2, 1, 2, load_async=True), _kv(3, 1, 2, load_async=True), _kv(1, 1, 0)),
    allow_stop=False, allow_abort=False,
    skip_targets=_KV_SKIPPED + ("two_prefill_chunks_in_flight", "blocks_freed_behind_fence"),
)
_KV_MODELS = (KV_LOAD_FAIL_K2, KV_LOAD_ERROR_K2, KV_SEND_K2, KV_FENCE_K2)
# The connector's models under each profile with async loads; the load
# limit's only where it exists (vLLM 0.34).
KV_PROFILE_MODELS: dict[str, tuple[Model, ...]] = {
    "vllm-0.33": _KV_MODELS,
    "vllm-0.33-async": tuple(_under(m, "vllm-0.33-async") for m in _KV_MODELS),
    "vllm-0.34": tuple(_under(m, "vllm-0.34") for m in _KV_MODELS) + (KV_LIMIT_K2,),
    "vllm-0.34-async": tuple(_under(m, "vllm-0.34-async") for m in _KV_MODELS + (KV_LIMIT_K2,)),
}

# The connector's mutants (verification/mutants, the historical `..._prNNNNN`
# bugs) and the model each is hunted on, per profile: `verify --kv-connector`
# hunts them. Filled as the mutants are written.
KV_MUTANT_MODELS: dict[str, dict[str, Model]] = {profile: {} for profile in KV_PROFILE_MODELS}
