"""The KV connector's model-checking constants (docs/kv-connector.md), kept
apart from the spec as `models.py` keeps the others: one small model per
feature cluster, each searched under the profiles that have a connector's
async loads, and the model each connector mutant is hunted on (four of
them the mutants' own: a partial async hit, prefix caching under pressure,
a shared prefix with a failing load, a plain request that needs the pool
a landed load holds).
"""

from __future__ import annotations

from dataclasses import replace

from flightcheck.spec import Config, KvConnector, Prompt
from flightcheck.verification.models import Model
from flightcheck.verification.mutants.kv_connector import KV_PROFILE

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
    # finding 7's fix is checked with everything 0.34 is (it reaches 0.34's states on them)
    "vllm-0.34-invalid-kv-fixed": tuple(_under(m, "vllm-0.34-invalid-kv-fixed") for m in _KV_MODELS + (KV_LIMIT_K2,)),
}

# --- the models of the connector's mutants (verification/mutants/kv_connector.py,
# the historical `..._prNNNNN` bugs): most are hunted on the models above;
# the few whose bug needs a behaviour none of those has get one of their
# own, with only what the bug needs (the smaller the model, the shorter the
# counterexample). Their targets too small to reach, beside the above:
_MUTANT_SKIPPED = _KV_SKIPPED + ("two_prefill_chunks_in_flight", "blocks_freed_behind_fence")


def _kv_labelled(prompt_len: int, max_tokens: int, external_hit: int, load_async: bool,
                 labels: tuple[int, ...]) -> Prompt:
    return Prompt(prompt_len, max_tokens, labels, external_hit, load_async)


# A prompt of 5 whose first block loads asynchronously: once the load has
# landed, 3 prompt tokens are left to compute (a second load promised after
# promotion, #18232).
KV_PARTIAL_LOAD = Model(
    "kv-partial-load",
    Config(num_stages=2, max_num_batched_tokens=4, max_num_seqs=1, block_size=2, num_blocks=3,
           max_model_len=6, prefix_caching=False, profile=KV_PROFILE, kv_connector=KvConnector()),
    (_kv(5, 1, 2, load_async=True),),
    allow_stop=False, allow_abort=False, skip_targets=_MUTANT_SKIPPED,
)
# Prefix caching: a running request that grows to the whole pool, beside a
# request whose first block loads asynchronously (its blocks cached once it
# has landed); the landed request cannot be admitted while the other holds
# the pool (a promoted load not admitted at once, #18631).
KV_PREFIX_PRESSURE = Model(
    "kv-prefix-pressure",
    Config(num_stages=2, max_num_batched_tokens=4, max_num_seqs=2, block_size=2, num_blocks=3,
           max_model_len=6, prefix_caching=True, profile=KV_PROFILE, kv_connector=KvConnector()),
    (_kv_labelled(2, 3, 0, False, (1,)), _kv_labelled(4, 1, 2, True, (5, 6))),
    allow_stop=False, allow_abort=False, skip_targets=_MUTANT_SKIPPED,
)
# Prefix caching: two requests share their first prompt block; the second
# loads both its blocks asynchronously and its load may fail (#37827).
KV_SHARED_PREFIX = Model(
    "kv-shared-prefix",
    Config(num_stages=2, max_num_batched_tokens=4, max_num_seqs=2, block_size=2, num_blocks=4,
           max_model_len=6, prefix_caching=True, profile=KV_PROFILE, kv_connector=KvConnector()),
    (_kv_labelled(3, 1, 0, False, (1,)), _kv_labelled(4, 1, 4, True, (1, 2))),
    allow_stop=False, allow_abort=False, kv_failures=True, skip_targets=_MUTANT_SKIPPED,
)

# A parked async load (one block) and a plain request that needs the whole
# pool: once the load has landed, the plain request cannot be allocated
# until the loaded one has run and finished (a blocked plain head, #45388).
KV_HEAD_OF_LINE = Model(
    "kv-head-of-line",
    Config(num_stages=2, max_num_batched_tokens=6, max_num_seqs=2, block_size=2, num_blocks=3,
           max_model_len=6, prefix_caching=False, profile=KV_PROFILE, kv_connector=KvConnector()),
    (_kv(2, 1, 2, load_async=True), _kv(5, 1, 0)),
    allow_stop=False, allow_abort=False, skip_targets=_MUTANT_SKIPPED,
)

# Speculative decoding (a draft per step) beside two async loads of whole
# prompts (2 blocks and 1) in a pool of 3: under vLLM's reservation the
# second load waits for the first's decode blocks; without the draft step's
# share of it both load, and the landed one cannot allocate its first decode
# (vLLM PR #57104's deadlock).
KV_MTP_PRESSURE = Model(
    "kv-mtp-pressure",
    Config(num_stages=2, max_num_batched_tokens=4, max_num_seqs=2, block_size=2, num_blocks=3,
           max_model_len=6, num_spec_tokens=1, prefix_caching=False, profile=KV_PROFILE,
           kv_connector=KvConnector()),
    (_kv(4, 1, 4, load_async=True), _kv(2, 1, 2, load_async=True)),
    allow_stop=False, allow_abort=False, skip_targets=_MUTANT_SKIPPED,
)

_CONNECTOR_MODELS = {m.name.split("@")[0]: m for m in KV_PROFILE_MODELS[KV_PROFILE]}

# The connector's mutants and the model each is hunted on, per profile:
# `verify --kv-connector` hunts them (every one under KV_PROFILE).
KV_MUTANT_MODELS: dict[str, dict[str, Model]] = {profile: {} for profile in KV_PROFILE_MODELS}
KV_MUTANT_MODELS[KV_PROFILE] = {
    "promotion_asks_connector_again_pr18232": KV_PARTIAL_LOAD,
    "landed_load_count_lost_pr18631": KV_PREFIX_PRESSURE,
    "aborted_load_freed_at_once_pr32255": _CONNECTOR_MODELS["kv-fence-k2"],
    "aborted_landed_load_held_pr32255": _CONNECTOR_MODELS["kv-fence-k2"],
    "fence_ignored_pr45357": _CONNECTOR_MODELS["kv-fence-k2"],
    "waiting_head_blocks_promotion_pr45388": KV_HEAD_OF_LINE,
    "fenced_victim_preempted_pr49674": _CONNECTOR_MODELS["kv-fence-k2"],
    "rollback_keeps_placeholders_pr49250": _CONNECTOR_MODELS["kv-load-fail-k2"],
    "shared_prefix_failure_skipped_pr37827": KV_SHARED_PREFIX,
    "spec_step_blocks_not_reserved_pr57104": KV_MTP_PRESSURE,
    "send_reported_before_finish_pr26929": _CONNECTOR_MODELS["kv-send-k2"],
    "old_incarnation_transfer_reported_pr46014": _CONNECTOR_MODELS["kv-fence-k2"],
    "load_reported_after_promotion_51786": KV_PARTIAL_LOAD,
    "remote_load_requested_after_preemption_pr53250": _CONNECTOR_MODELS["kv-fence-k2"],
    "failure_names_foreign_blocks": _CONNECTOR_MODELS["kv-load-fail-k2"],
    "load_reported_twice": _CONNECTOR_MODELS["kv-load-fail-k2"],
}


# --- KV7 (spec/kv_invalid.py; docs/vllm-kv-connector-findings.md, finding 7):
# prefix caching and the recompute policy, KV7 checked (`Config.check_invalid_kv`:
# `invalid_kv` in the state's identity, an aborted loader's failure offered).
# Two requests share their first prompt block; r0 loads it by a sync load
# that may fail. Under vLLM 0.33/0.34's rules KV7 breaks (shortest: r0's
# failure marks the block and r1 keeps its hit, r0 is aborted before it
# recomputes, r1's next entry reads the block); under the fix
# (`vllm-0.34-invalid-kv-fixed`) it holds.
KV_INVALID_K2 = Model(
    "kv-invalid-k2",
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2, num_blocks=3,
           max_model_len=6, prefix_caching=True, profile="vllm-0.34", kv_connector=KvConnector(),
           check_invalid_kv=True),
    (_kv_labelled(3, 1, 2, False, (1,)), _kv_labelled(3, 1, 0, False, (1,))),
    allow_stop=False, kv_failures=True,
    skip_targets=_MUTANT_SKIPPED + ("duplicate_cached_block", "load_lands_and_runs"),
)
# Finding 7's minimal run besides: a third request whose prompt shares the
# block and whose second block loads asynchronously (a parked holder of the
# invalid block, freed and retried when cut to nothing). Slow (about 30 s a
# profile): tests/test_kv_invalid_search.py, marked slow.
KV_INVALID_K3 = replace(
    KV_INVALID_K2, name="kv-invalid-k3",
    cfg=replace(KV_INVALID_K2.cfg, num_blocks=5),
    prompts=(_kv_labelled(3, 1, 2, False, (1,)), _kv_labelled(5, 1, 2, True, (1, 2)),
             _kv_labelled(3, 1, 0, False, (1,))),
    skip_targets=_MUTANT_SKIPPED,
)
# No abort and no sharer needed: two requests share both prompt blocks, r0
# loading its second by a sync load, the long-prefill threshold 3. The
# released rules break KV7 in 8 steps: r0's load fails (back to its valid
# first block, its own block 1 left cached), r1's next chunk preempts r0
# before it recomputes, and r0's resumption takes its own invalid block back
# as a prefix hit (`get_cached_block` serves it: its hash was never dropped).
KV_INVALID_PREEMPT_K2 = Model(
    "kv-invalid-preempt-k2",
    replace(KV_INVALID_K2.cfg, max_num_batched_tokens=4, num_blocks=4, long_prefill_token_threshold=3),
    (_kv_labelled(5, 1, 4, False, (1, 2)), _kv_labelled(5, 1, 0, False, (1, 2))),
    allow_stop=False, allow_abort=False, kv_failures=True,
    skip_targets=_MUTANT_SKIPPED + ("duplicate_cached_block", "load_lands_and_runs"),
)
# `verify --kv-connector`'s KV7 rows, per profile: violated under vLLM
# 0.34's rules (a vLLM bug; 0.33's are the same, tests/test_kv_invalid_search.py),
# proved under the fix.
KV_INVALID_MODELS: dict[str, tuple[Model, ...]] = {
    profile: (_under(KV_INVALID_K2, profile), _under(KV_INVALID_PREEMPT_K2, profile))
    for profile in ("vllm-0.34", "vllm-0.34-invalid-kv-fixed")
}


def kv_mutant_model(name: str, profile: str = KV_PROFILE) -> Model:
    """The model the KV connector mutant `name` is hunted on under `profile`, with it applied."""
    return KV_MUTANT_MODELS[profile][name].with_mutant(name)
