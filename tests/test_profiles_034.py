"""The vllm-0.34 profiles: every constant they share with vllm-0.33 is named
here with the vLLM 0.34.0 function it was re-read in, so a constant added
later must be looked at for 0.34 too (the test fails on a constant with no
entry), and one 0.34 changes is listed apart with the function that changes it.
"""

from __future__ import annotations

from dataclasses import fields

import pytest

from flightcheck.reference import profiles as reference_profiles
from flightcheck.spec import profiles as spec_profiles
from flightcheck.verification.models import PROFILE_MODELS, PROFILE_MUTANT_MODELS
from flightcheck.verification.mutants import PROFILE_MUTANTS
from flightcheck.verification.suite import MOOT_MUTANTS, Z3_PROFILES
from flightcheck.verification.z3.profiles import ENCODED_PROFILES

# spec Profile field -> the 0.34.0 function that still says what 0.33.0 says.
SAME_AS_033_IN: dict[str, str] = {
    "policy": "Scheduler.schedule (prefill chunks of a request in flight keep being scheduled)",
    "release_order_with_prefix_caching": "SingleTypeKVCacheManager.free (reversed table)",
    "release_order_without_prefix_caching": "SingleTypeKVCacheManager.free (reversed table)",
    "num_preallocate_tokens": "KVCacheManager.allocate_slots (no preallocation)",
    "cache_duplicate_blocks": "BlockHashToBlockMap.insert / get_one_block",
    "unhashed_blocks_to_head": "BlockPool.free_blocks (prepend_n for unhashed blocks)",
    "threshold_needs_company": "Scheduler.schedule (num_eligible_reqs > 1)",
    "sampled_token_slot": "Scheduler.schedule, running loop (max_model_len - 1 - num_computed)",
    "full_sequence_admission": "KVCacheManager.allocate_slots(full_sequence_must_fit=...)",
    "defer_resume_while_stale": "Scheduler.schedule, waiting loop (skip_request while stale)",
    "stop_tokens_before_length": "check_stop (v1/core/sched/utils.py)",
    "stale_output_counters": "Scheduler._preempt_request / update_from_output (by id)",
    "empty_batches": "EngineCore.step_with_batch_queue (schedule() while has_requests())",
    "output_placeholders": "AsyncScheduler._update_after_schedule",
    "extra_queued_batches": "VllmConfig.max_concurrent_batches",
    "decode_stagger_is_pipeline_depth": "AsyncScheduler.__init__ / Scheduler.schedule (next_decode_eligible_step)",
    "cache_settled_blocks_on_output": "Scheduler.update_from_output (cache_blocks before a stop)",
    "stale_test": "Scheduler.schedule, waiting loop (truthiness of num_stale_output_tokens)",
    "in_flight_floor": "Scheduler.update_from_output (no floor)",
    "draft_source": "EngineCore.post_step (sync: take_draft_token_ids -> update_draft_token_ids) / "
                    "AsyncScheduler._update_after_schedule (async: spec_token_ids = placeholders)",
    "pads_admitted_decodes": "Scheduler.schedule, waiting loop (\"Pad new decode requests to uniform "
                             "spec decoding size\")",
    "held_drafts_left_uncached": "Scheduler._preempt_request (spec_token_ids = []) / "
                                 "KVCacheManager.allocate_slots (min(total_computed_tokens + num_new_tokens, "
                                 "request.num_tokens) cached)",
    "lookahead_slots": "Scheduler.schedule (allocate_slots(num_lookahead_tokens=effective_lookahead_tokens), "
                       "limit_lookahead_tokens for an async load; input_budget -= num_new_tokens + draft_slots)",
    "demands_blocks_past_max_model_len": "Scheduler.schedule, running loop (num_new_tokens clipped to "
                                         "max_model_len - num_computed_tokens - num_sampled_tokens_per_step "
                                         "before allocate_slots: no demand past it)",
    "unchunked_prefill_stops_admission": "Scheduler.schedule, waiting loop (not enable_chunked_prefill and "
                                         "num_new_tokens > request_token_budget: break)",
    "waits_with_batch_in_flight": "EngineCoreProc._process_input_queue (blocks only while not has_work(), "
                                  "which counts the batch queue)",
    "kv_sync_hits": "Scheduler.schedule, waiting loop (get_num_new_matched_tokens -> (n, False))",
    "kv_async_loads": "Scheduler.schedule, waiting loop (load_kv_async: WAITING_FOR_REMOTE_KVS) / "
                      "_handle_blocked_waiting_request / _update_waiting_for_remote_kv",
    "kv_load_failures": "Scheduler._handle_failed_recving / _handle_invalid_blocks / "
                        "_update_requests_with_invalid_blocks (kv_load_failure_policy)",
    "kv_send_hold": "Scheduler._free_request / _connector_finished (delay_free until finished_sending)",
    "kv_aborted_load_held": "Scheduler.finish_requests (delay_free_blocks for WAITING_FOR_REMOTE_KVS)",
    "kv_step_fence": "Scheduler._request_blocks_can_be_freed / _free_request_blocks / _drain_deferred_frees",
    "kv_holding_first": "Scheduler.schedule, waiting loop (kv_holding_waiting drained before waiting)",
    "kv_producer_drops_stale_output": "Scheduler.schedule, running loop "
                                      "(_preempt_request(drop_stale_output=self.requires_kv_delivery))",
    "priority_policy": "Scheduler.schedule, running loop (SchedulingPolicy.PRIORITY: max(running, "
                       "key=(priority, arrival_time)), the hand-back, victim_index < req_index) / "
                       "PriorityRequestQueue (request_queue.py, the same in both)",
    "priority_orders_kv_holding": "Scheduler.__init__ (kv_holding_waiting = create_request_queue(self.policy): "
                                  "a PriorityRequestQueue under SchedulingPolicy.PRIORITY) / schedule, waiting "
                                  "loop (step_started_kv_loads add_request, prepend_requests) / "
                                  "_handle_invalid_blocks (iterates kv_holding_waiting)",
    "streaming_sessions": "Scheduler.add_request / _update_request_as_session / _handle_stopped_request "
                          "(WAITING_FOR_STREAMING_REQ, num_waiting_for_streaming_input in the admission cap)",
    "reset_drops_running_output": "Scheduler.reset_prefix_cache (reset_running_requests: "
                                  "_preempt_request(drop_stale_output=True), then BlockPool.reset_prefix_cache)",
    "pause_states": "Scheduler.set_pause_state / schedule (PAUSED_ALL: token_budget = 0; waiting loop "
                    "UNPAUSED only) / get_num_unfinished_requests",
    "prefill_cadence": "Scheduler.__init__ (local_prefill_interval) / schedule (defer_prefills, "
                       "prefill_capacity_bound, last_prefill_step): the same code",
    "hand_back_uncaches_unwritten": "Scheduler.schedule, running loop (the priority branch pops the victim's "
                                    "req_to_new_blocks, _preempt_request frees its blocks with the hashes "
                                    "KVCacheManager.allocate_slots gave them): the same code, no fix",
    "kv_recompute_quarantines_invalid": "Scheduler._handle_invalid_blocks (evict_blocks only when not "
                                        "recompute_kv_load_failures) / _update_requests_with_invalid_blocks "
                                        "(marked_invalid_block_ids kept computed): the same code, no fix",
}
# Fields that are not vLLM rules.
NOT_RULES = {"name", "follows"}
# spec Profile field -> the 0.34.0 function that changes it from 0.33.0.
CHANGED_IN_034: dict[str, str] = {
    "threshold_needs_chunked_prefill": "Scheduler.schedule (enable_chunked_prefill and num_eligible_reqs > 1)",
    "cache_aware_admission": "Scheduler._reorder_waiting_by_cached_prefix (cache_aware_admission_window)",
    "mid_step_inputs": "EngineCoreProc._wait_for_output (ADD and ABORT handled while it spins on a step's "
                       "output before a deadline; 0.33: aborts only, EngineCore._process_aborts_queue)",
    "kv_inflight_load_limit": "Scheduler._next_waiting_queue / _admits_inflight_kv_load (async_kv_waiting, "
                              "loads-only mode, max_num_inflight_kv_loads; 0.33 has none)",
    "scheduler_validates_drafts": "Scheduler.update_draft_token_ids (trim_spec_tokens keeps the first illegal "
                                  "draft) / update_draft_token_ids_in_output (no validate_tokens: rejection "
                                  "sampling handles grammar violations)",
    "priority_orders_async_kv": "Scheduler.__init__ (async_kv_waiting = create_request_queue(self.policy)) / "
                                "_next_waiting_queue (async_head < head under SchedulingPolicy.PRIORITY; 0.33 "
                                "has no async_kv_waiting)",
    "session_input_sets_cache_limit": "Scheduler._update_request_as_session (prefix_cache_hit_limit = "
                                      "get_prefix_cache_hit_limit() from the update's sampling_params; 0.33 "
                                      "leaves skip_reading_prefix_cache as Request.__init__ set it)",
    # the reference's name for the same rule
    "kv_async_waiting_queue": "Scheduler._enqueue_waiting_request / _next_waiting_queue / "
                              "_admits_inflight_kv_load (0.33 has no async_kv_waiting)",
}

PAIRS = [("vllm-0.34", "vllm-0.33"), ("vllm-0.34-async", "vllm-0.33-async")]


@pytest.mark.parametrize(("new", "old"), PAIRS)
def test_every_spec_constant_of_034_is_accounted_for(new: str, old: str) -> None:
    new_profile, old_profile = spec_profiles.PROFILES[new], spec_profiles.PROFILES[old]
    assert new_profile.follows == old
    for field in fields(spec_profiles.Profile):
        if field.name in NOT_RULES:
            continue
        assert field.name in SAME_AS_033_IN or field.name in CHANGED_IN_034, (
            f"Profile.{field.name} is new: read it in vLLM 0.34.0 and list it here")
        same = getattr(new_profile, field.name) == getattr(old_profile, field.name)
        assert same == (field.name in SAME_AS_033_IN), field.name


@pytest.mark.parametrize(("new", "old"), PAIRS)
def test_the_reference_profiles_of_034_are_033s_but_for_the_name_and_034s_rules(new: str, old: str) -> None:
    from dataclasses import replace
    # the changed rules the reference has (the engine's are the spec's and drive.py's)
    changed = {rule for rule in CHANGED_IN_034 if rule in {f.name for f in fields(reference_profiles.Profile)}}
    assert set(reference_profiles.VLLM_0_34_RULES) == changed
    for table in (reference_profiles.PROFILES, reference_profiles.RELEASED):
        assert all(getattr(table[new], rule) != getattr(table[old], rule) for rule in changed)
        # and the sync pair's own (0.33's sync V1 runner skips no drafts; 0.34 has no V1 runner)
        own = reference_profiles.VLLM_0_34_SYNC_RULES if new == "vllm-0.34" else {}
        assert all(getattr(table[new], rule) != getattr(table[old], rule) for rule in own)
        assert replace(table[new], name=old, **{rule: getattr(table[old], rule) for rule in {*changed, *own}}) \
            == table[old]


def test_vllm_0_34_0_maps_to_its_profile() -> None:
    assert spec_profiles.profile_for_version("0.34.0").name == "vllm-0.34"
    assert spec_profiles.profile_for_version("0.34.0+cpu").name == "vllm-0.34"


@pytest.mark.parametrize(("new", "old"), PAIRS)
def test_034_is_checked_as_deeply_as_033(new: str, old: str) -> None:
    assert new in ENCODED_PROFILES and new in Z3_PROFILES
    assert [m.name for m in PROFILE_MODELS[new]] == [f"{m.name}@{new}" for m in PROFILE_MODELS[old]]
    assert all(m.cfg.profile == new for m in PROFILE_MODELS[new])
    assert PROFILE_MUTANT_MODELS[new].keys() == PROFILE_MUTANT_MODELS[old].keys()
    assert all(m.cfg.profile == new for m in PROFILE_MUTANT_MODELS[new].values())
    assert PROFILE_MUTANTS[new] == PROFILE_MUTANTS[old]
    assert MOOT_MUTANTS[new] == MOOT_MUTANTS[old]


def test_the_spec_and_the_bridge_name_the_same_profile_for_every_release() -> None:
    # The trace checker picks a profile from spec.profiles.VERSION_PROFILES; the
    # bridge from flightcheck/vllm/versions.py (standard library only, so
    # the recorder installs without the spec): the two tables must agree.
    from flightcheck.verification.traces.configuration import ASYNC_PROFILES
    from flightcheck.vllm.versions import RELEASES
    for version, release in RELEASES.items():
        assert spec_profiles.profile_for_version(version).name == release.profile, version
        assert ASYNC_PROFILES.get(release.profile) == release.async_profile, version
    assert set(spec_profiles.VERSION_PROFILES) - {"0.8.5.post1"} == set(RELEASES)
