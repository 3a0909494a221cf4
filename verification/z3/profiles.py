"""The Z3 engines' models under each vLLM version profile (issues 19 and 21).

A profile changes the configuration only (spec/profiles.py: the policy, the
release order, preallocation, duplicate cached blocks, and vLLM 0.33's rules
through `Config.rules`); the Z3 encoding reads those constants from
`Model.cfg`, so a profile's model is a model with its configuration resolved
under that profile. `DEFERRAL_MODEL` is 0.33's smallest model with a
deferred resumption, for the cross-check and the deferral's cover query.
"""

from __future__ import annotations

from dataclasses import replace

from flightcheck.spec import Config, Prompt
from flightcheck.spec.profiles import DEFAULT_PROFILE, PROFILES, profile as profile_named
from flightcheck.verification.models import Model

__all__ = ["DEFAULT_PROFILE", "DEFERRAL_MODEL", "ENCODED_PROFILES", "PROFILES", "profile_config", "profile_model"]

# The profiles whose constants the encoding reads: the `Config` fields (policy,
# release order, preallocation, duplicate cached blocks) and vLLM 0.33's rules
# (`Config.rules`: free-queue head in blocks.free_table, threshold with company
# and the sampled-token slot in schedule._clip, full-sequence admission and
# deferred resumption in schedule._waiting_step, the stop order in
# actions._apply_sample, S10's threshold clause in invariants), and under
# vllm-0.33-async the placeholders, decode countdown and queue of K + 1
# (`state.SAsync`, `Layout.K` = `Config.queue_depth`). Encoded does not mean
# run by verify: suite.EXPLICIT_ONLY_PROFILES lists the one it is not.
# The hardened 0.33 variant's two guards are encoded too (the stale test in
# schedule._waiting_step and _resumption_deferred, the in-flight floor in
# actions._apply_by_name); with unique names neither binds. vLLM 0.34's own
# rules act only with chunked prefill off or the cache-aware window open,
# which the encoding refuses (state._refuse_admission_knobs). 0.34 with
# finding 7's fix differs from 0.34 only where a sync load fails beside
# prefix caching, which the connector's encoding refuses
# (kv_state.refuse_unencoded_connector): 0.34's encoding is its. 0.34 with
# finding 1's fix of the unwritten-KV findings differs from 0.34 only where a
# priority victim is handed back beside prefix caching, which the priority
# encoding refuses under it (priority_state.refuse_unencoded_priority).
ENCODED_PROFILES: tuple[str, ...] = ("vllm-0.8.5", "vllm-0.8.4", "vllm-0.33", "vllm-0.33-async",
                                     "vllm-0.33-hardened", "vllm-0.34", "vllm-0.34-async",
                                     "vllm-0.34-invalid-kv-fixed", "vllm-0.34-unwritten-kv-fixed")


def profile_config(cfg: Config, profile: str) -> Config:
    """`cfg` under `profile`: every profile constant re-derived from it."""
    profile_named(profile)                  # ValueError naming the known profiles
    if profile not in ENCODED_PROFILES:
        raise ValueError(f"the Z3 encoding does not model profile {profile!r} "
                         f"(encoded: {', '.join(ENCODED_PROFILES)})")
    return replace(cfg, profile=profile, continue_prefill=None, release_order=None,
                   num_preallocate_tokens=None, cache_duplicate_blocks=None)


def profile_model(model: Model, profile: str) -> Model:
    """`model` with its configuration under `profile`, named after it."""
    return replace(model, name=f"{model.name}@{profile}", cfg=profile_config(model.cfg, profile))


# vLLM 0.33's deferred resumption at its shallowest: two requests, K = 3, a
# pool of two blocks, spec decode and a threshold of one token, so a request
# is preempted with a chunk in flight and the next schedule passes it over
# (the target `deferred_resumption` at depth 6, where shared-k3 needs 8).
# Every rule of the profile changes its reachable states (358 of them), so
# the cross-check compares each rule on it (tests/test_z3_crosscheck.py).
DEFERRAL_MODEL = Model(
    "tiny-stale",
    Config(num_stages=3, max_num_batched_tokens=2, max_num_seqs=2, block_size=2, num_blocks=2,
           max_model_len=4, prefix_caching=False, num_spec_tokens=1, long_prefill_token_threshold=1,
           profile="vllm-0.33"),
    (Prompt(1, 3), Prompt(3, 1)))
