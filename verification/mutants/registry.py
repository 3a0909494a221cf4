"""The registry of the spec's mutants: for each, where the bug comes from,
which spec functions it replaces (and a fingerprint of each original, so that
a change to one fails a test instead of leaving the mutant silently stale),
and what kills it: the property and the length of the shortest
counterexample `flightcheck verify --json` reports.

A historical mutant is a bug some vLLM version had; a synthetic one exists
to show that one property carries weight (tests/test_property_weight.py).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from dataclasses import dataclass
from types import FunctionType
from typing import Literal

from flightcheck.verification.mutants import spec as mutated

# The spec modules a mutant may replace functions of, by the short name a
# target is written with ("schedule._add_entry").
SPEC_MODULES: dict[str, str] = {
    "schedule": "flightcheck.spec.schedule",
    "actions": "flightcheck.spec.actions",
}


@dataclass(frozen=True)
class Mutant:
    name: str
    kind: Literal["historical", "synthetic"]
    history: str                                  # where the bug comes from and what broke
    replaces: dict[str, FunctionType]             # "module.function" of the spec -> its replacement
    fingerprints: dict[str, str]                  # "module.function" -> fingerprint of the original
    killed_by: str                                # the property its shortest counterexample breaks
    shortest: int                                 # that counterexample's length, in steps
    profile: str | None = None                    # the one profile it is hunted under; None: every profile


def spec_function(target: str) -> FunctionType:
    """The spec function named "module.function", as the module holds it now."""
    module_name, function_name = target.split(".")
    return getattr(importlib.import_module(SPEC_MODULES[module_name]), function_name)


def fingerprint(function: FunctionType) -> str:
    """A short hash of a function's source: it changes whenever the function is edited."""
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]


def _mutant(name: str, kind: Literal["historical", "synthetic"], history: str,
            replaces: dict[str, FunctionType], fingerprints: dict[str, str],
            killed_by: str, shortest: int, profile: str | None = None) -> Mutant:
    if set(replaces) != set(fingerprints):
        raise ValueError(f"mutant {name}: a fingerprint for each replaced function, no more")
    return Mutant(name, kind, history, replaces, fingerprints, killed_by, shortest, profile)


_REGISTRY: tuple[Mutant, ...] = (
    # --- historical: bugs vLLM had ---------------------------------------------------
    _mutant("advance_at_completion", "historical",
            "num_computed advanced when the output returns while prefill continues: "
            "double scheduling, what scheduled_req_ids prevented (#15307)",
            {"schedule._advance_counter": mutated.advance_counter_not_at_schedule,
             "actions._settle_live": mutated.settle_live_and_advance},
            {"schedule._advance_counter": "b9f3da3a2df22bc7", "actions._settle_live": "e42da0b879814409"},
            "S3_contiguous_coverage", 2),
    _mutant("shared_snapshot", "historical",
            "one snapshot object per request, overwritten by the next batch while the previous "
            "one is in flight (CachedRequestData reused before vLLM 0.8.5)",
            {"schedule._launch": mutated.launch_with_shared_snapshot},
            {"schedule._launch": "2f9519326ef44930"},
            "S4_snapshot_immutability", 3),
    _mutant("final_chunk_from_live_counter", "historical",
            "whether a batch samples is decided at completion from the live counter, not from "
            "the batch's snapshot (#13637 design note)",
            {"actions.entry_samples": mutated.entry_samples_from_live_counter},
            {"actions.entry_samples": "0727ec0ac427884d"},
            "S5_one_sample_per_prefill", 4),
    _mutant("snapshot_omits_prefix_hit", "historical",
            "the snapshot's start leaves out the prefix-cache hit, so the final chunk looks "
            "partial and its token is dropped: the request hangs (#13637)",
            {"schedule._add_entry": mutated.add_entry_without_prefix_hit},
            {"schedule._add_entry": "9742cc11b3d01c12"},
            "S3_contiguous_coverage", 7),
    _mutant("rejections_not_subtracted", "historical",
            "spec-decode rejections not subtracted from num_computed",
            {"actions._subtracts_rejections": mutated.never_subtracts_rejections},
            {"actions._subtracts_rejections": "3b6f4615dca8edba"},
            "S8_spec_accounting", 5),
    _mutant("decode_while_token_in_flight", "historical",
            "the num_new_tokens == 0 gate removed: a decode is scheduled while the previous "
            "token is still in flight",
            {"schedule._num_new_running": mutated.num_new_running_decodes_in_flight},
            {"schedule._num_new_running": "5f10b0554c99db7a"},
            "S1_counter_bounds", 3),
    _mutant("stale_output_applied_to_resumed", "historical",
            "the output of a batch scheduled before a preemption is applied by name to the "
            "resumed request (vLLM 0.8.5, PP >= 3)",
            {"schedule._supersede_orphans": mutated.resumed_request_takes_orphans_live},
            {"schedule._supersede_orphans": "08295d2a98f71cbd"},
            "S13_fates_only_age", 7),
    _mutant("inflight_set_not_cleared_on_preemption", "historical",
            "one-batch-per-request: scheduled_req_ids keeps a preempted request, the "
            "unscheduled count drifts and the engine stops scheduling (vLLM 0.8.1-0.8.4)",
            {"schedule._preempt": mutated.preempt_keeping_inflight_set},
            {"schedule._preempt": "2f25e8aa6d38a2b3"},
            "S11_pipeline_depth", 8),
    _mutant("rejections_subtracted_after_reset", "historical",
            "spec-decode rejections of a stale batch subtracted from the counter that "
            "preemption reset (the guard vLLM 0.12.0 added)",
            {"actions._subtracts_rejections": mutated.subtracts_rejections_after_reset},
            {"actions._subtracts_rejections": "3b6f4615dca8edba"},
            "S1_counter_bounds", 9),
    # --- synthetic: each shows one property carries weight ------------------------------
    _mutant("budget_ignored", "synthetic",
            "the token budget is not charged for running requests",
            {"schedule._num_new_running": mutated.num_new_running_over_budget,
             "schedule._add_entry": mutated.add_entry_uncharged},
            {"schedule._num_new_running": "5f10b0554c99db7a", "schedule._add_entry": "9742cc11b3d01c12"},
            "S10_queues_and_budgets", 5),
    _mutant("max_num_seqs_ignored", "synthetic",
            "admission does not check max_num_seqs",
            {"schedule._has_free_seat": mutated.always_a_free_seat},
            {"schedule._has_free_seat": "81c1cf6ce132c8b1"},
            "S10_queues_and_budgets", 3),
    _mutant("threshold_ignored_on_admission", "synthetic",
            "long_prefill_token_threshold is not applied to admissions",
            {"schedule._num_new_waiting": mutated.num_new_waiting_over_threshold},
            {"schedule._num_new_waiting": "42adb0beabed8ae2"},
            "S10_queues_and_budgets", 2),
    _mutant("no_length_cap", "synthetic",
            "max_tokens is not checked after an appended token",
            {"actions._stop_reason": mutated.stop_reason_without_length_cap},
            {"actions._stop_reason": "967662593703e34d"},
            "S2_length_cap", 5),
    _mutant("blocks_not_freed_on_abort", "synthetic",
            "an aborted request keeps its blocks",
            {"actions._finish": mutated.finish_keeping_blocks_on_abort},
            {"actions._finish": "bfb5b38a30d4d0ba"},
            "S9_kv_ownership", 3),
    _mutant("admit_after_preemption", "synthetic",
            "admission runs in a step that preempted",
            {"schedule.schedule": mutated.schedule_admitting_after_preemption},
            {"schedule.schedule": "b55177aa84883358"},
            "S12_status_monotonicity", 5),
    _mutant("orphan_kept_after_reschedule", "synthetic",
            "a rescheduled request's orphaned entries stay orphaned",
            {"schedule._supersede_orphans": mutated.orphans_kept_on_resume},
            {"schedule._supersede_orphans": "08295d2a98f71cbd"},
            "S7_output_binding", 7),
    _mutant("preempt_keeps_counter", "synthetic",
            "preemption does not reset num_computed",
            {"schedule._preempt": mutated.preempt_keeping_counter},
            {"schedule._preempt": "2f25e8aa6d38a2b3"},
            "S1_counter_bounds", 5),
    _mutant("preemption_clears_inflight_drafts", "synthetic",
            "in-flight batches alias the request's draft list, which preemption clears",
            {"schedule._preempt": mutated.preempt_clearing_inflight_drafts},
            {"schedule._preempt": "2f25e8aa6d38a2b3"},
            "S4_snapshot_immutability", 8),
    _mutant("empty_batch_submitted", "synthetic",
            "a schedule call that only preempted still enqueues an empty batch",
            {"schedule._launch": mutated.launch_even_when_empty},
            {"schedule._launch": "2f9519326ef44930"},
            "S11_pipeline_depth", 6),
    _mutant("arrival_counter_stale", "synthetic",
            "an arriving request keeps a stale num_computed until admitted",
            {"actions.arrive": mutated.arrive_with_stale_counter},
            {"actions.arrive": "fd35b5f23bc0f6d9"},
            "S1_counter_bounds", 1),
    _mutant("overlapping_chunks", "synthetic",
            "a continuing prefill chunk restarts one token early, recomputing a token already "
            "in flight",
            {"schedule._add_entry": mutated.add_entry_overlapping,
             "schedule._advance_counter": mutated.advance_counter_to_entry_end},
            {"schedule._add_entry": "9742cc11b3d01c12", "schedule._advance_counter": "b9f3da3a2df22bc7"},
            "S3_contiguous_coverage", 3),
    _mutant("stale_drafts_on_prefill_chunk", "synthetic",
            "a prefill chunk's snapshot records a draft, as if the request's old proposal were "
            "still scheduled",
            {"schedule._add_entry": mutated.add_entry_with_stale_draft},
            {"schedule._add_entry": "9742cc11b3d01c12"},
            "S5_one_sample_per_prefill", 2),
    _mutant("draft_cap_ignored", "synthetic",
            "the drafter may propose k + 1 drafts",
            {"actions.max_next_drafts": mutated.max_next_drafts_plus_one},
            {"actions.max_next_drafts": "76398d304876b9fc"},
            "S8_spec_accounting", 3),
    _mutant("complete_refuses_orphans", "synthetic",
            "a batch holding an orphaned entry can never be consumed",
            {"actions.is_complete_enabled": mutated.complete_enabled_without_orphans},
            {"actions.is_complete_enabled": "bf6162c2d47954c4"},
            "L3_drain", 6),
    _mutant("schedule_blocked_when_idle", "synthetic",
            "the engine will not schedule while nothing is in flight",
            {"schedule.is_schedule_enabled": mutated.schedule_enabled_only_while_busy},
            {"schedule.is_schedule_enabled": "a496bc7731a3d762"},
            "L2_no_deadlock", 1),
    _mutant("no_block_for_last_token", "synthetic",
            "allocation rounds down, the last partial block is missing",
            {"schedule._num_required_blocks": mutated.num_required_blocks_rounded_down},
            {"schedule._num_required_blocks": "d1a170ddc52263a1"},
            "S9_kv_ownership", 2),
)

# Mutants of rules only one profile has (vLLM 0.33's stale-output counters):
# every other profile never calls the functions they replace, so they are
# hunted under that profile only (`flightcheck verify --profile vllm-0.33`),
# on the model `models.mutant_model(name, profile)` names, and kept out of
# MUTANTS (the every-profile set the default run and its golden file hold).
_PROFILE_REGISTRY: tuple[Mutant, ...] = (
    _mutant("resumption_not_deferred", "historical",
            "vLLM 0.33's deferral of a preempted request with stale output in flight left out "
            "(Scheduler.schedule's waiting loop, num_stale_output_tokens): 0.8.5's bug returns, "
            "the request resumes while its old output is in flight and that output is applied "
            "to the running request",
            {"schedule._has_stale_output": mutated.has_stale_output_never},
            {"schedule._has_stale_output": "9e20ed424c49d015"},
            "IF3_no_stale_resumption", 10, profile="vllm-0.33"),
    _mutant("drop_leaves_counters", "synthetic",
            "drop mode discards a stale output without settling the request's counters "
            "(Scheduler.update_from_output)",
            {"actions._settle_counters": mutated.settle_counters_skipping_dropped},
            {"actions._settle_counters": "4a4c66046d1ee7d5"},
            "IF1_in_flight_counter", 9, profile="vllm-0.33"),
    _mutant("stale_drained_by_wrong_batch", "synthetic",
            "the stale count is drained by the size of another batch of the request than the one "
            "that completed (Scheduler.update_from_output)",
            {"actions._settle_counters": mutated.settle_counters_by_newest_batch},
            {"actions._settle_counters": "4a4c66046d1ee7d5"},
            "IF2_stale_counter", 10, profile="vllm-0.33"),
    _mutant("in_flight_kept_without_output", "synthetic",
            "the in-flight counter is not decremented for an entry whose output is empty (a partial "
            "prefill chunk), as if the decrement sat behind update_from_output's skip of requests "
            "without generated tokens",
            {"actions._settle_counters": mutated.settle_counters_only_with_output},
            {"actions._settle_counters": "4a4c66046d1ee7d5"},
            "IF1_in_flight_counter", 3, profile="vllm-0.33"),
    # The hardened variant's two guards against a reused request id
    # (Profile.stale_test, Profile.in_flight_floor): with unique names neither
    # guard ever binds, so these are hunted on the profile's name-reuse
    # model, and killed only by a property the hardened base keeps there
    # (models.NAME_REUSE_MUTANT_MODELS, suite.hunt_mutant_against_base).
    _mutant("stale_tested_by_truthiness", "historical",
            "the waiting loop defers a preempted request while its stale count is truthy "
            "(`num_stale_output_tokens and not drop_stale_output`, vLLM 0.33's Scheduler.schedule) "
            "instead of > 0: a stale count a reused request id drove below 0 never drains, "
            "the request is never resumed and the engine spins on empty batches",
            {"schedule._has_positive_stale_output": mutated.has_stale_output_truthy},
            {"schedule._has_positive_stale_output": "b1d35f138daed9c3"},
            "L1_L3_every_request_can_finish", 7, profile="vllm-0.33-hardened"),
    _mutant("in_flight_below_zero", "historical",
            "update_from_output subtracts an output's tokens from num_in_flight_tokens with no floor "
            "(vLLM 0.33): an old incarnation's output bound through a reused request id drives "
            "the new request's counter below 0",
            {"actions._floor_in_flight": mutated.in_flight_not_floored},
            {"actions._floor_in_flight": "aa15ef1d7983f39a"},
            "IF0_in_flight_never_negative", 5, profile="vllm-0.33-hardened"),
)

# Mutants of vLLM 0.33's asynchronous scheduling (AsyncScheduler: output
# placeholders, the decode stagger, the max_tokens guard), hunted under
# `vllm-0.33-async` only: every other profile keeps the placeholders at 0 and
# the countdown unset, so the functions they replace change nothing there.
_ASYNC_REGISTRY: tuple[Mutant, ...] = (
    _mutant("async_rejections_not_settled", "synthetic",
            "rejected drafts are not taken back from num_output_placeholders "
            "(Scheduler.update_from_output's `num_output_placeholders -= num_rejected` left out)",
            {"actions._settle_rejected_placeholders": mutated.rejected_placeholders_kept},
            {"actions._settle_rejected_placeholders": "55df582ac357a78a"},
            "IA1_placeholders", 7, profile="vllm-0.33-async"),
    _mutant("async_placeholders_kept_on_preemption", "synthetic",
            "Scheduler._preempt_request does not reset num_output_placeholders to 0",
            {"schedule._reset_placeholders": mutated.reset_placeholders_never},
            {"schedule._reset_placeholders": "00c147aa556746bf"},
            "IA1_placeholders", 12, profile="vllm-0.33-async"),
    _mutant("async_stagger_ignored", "synthetic",
            "the running loop's `current_step < next_decode_eligible_step` skip (V2 runner, PP) "
            "left out: decodes of one request closer than pp_size steps",
            {"schedule._stagger_pending": mutated.stagger_never_pending},
            {"schedule._stagger_pending": "2f20ba1c37650020"},
            "S6p_async_decode_gating", 3, profile="vllm-0.33-async"),
    _mutant("async_max_tokens_guard_off_by_one", "synthetic",
            "the async max_tokens guard reads `num_computed_tokens + 1 - num_output_placeholders` "
            "for `+ 2`: a decode past max_tokens is scheduled",
            {"schedule._placeholders_reach_max_tokens": mutated.placeholders_reach_max_tokens_one_late},
            {"schedule._placeholders_reach_max_tokens": "6e809bca95bd507a"},
            "IA2_placeholders_within_max_tokens", 5, profile="vllm-0.33-async"),
    _mutant("async_decode_on_stale_placeholder", "synthetic",
            "a request preempted and resumed at once (drop mode) counts its stale decodes still in "
            "flight as its own placeholders and schedules decodes on them",
            {"schedule._admit": mutated.admit_taking_stale_placeholders},
            {"schedule._admit": "896b578ab4c3bde0"},
            "IA1_placeholders", 11, profile="vllm-0.33-async"),
)

MUTANTS: dict[str, Mutant] = {m.name: m for m in _REGISTRY}
# profile -> the mutants hunted under it only
PROFILE_MUTANTS: dict[str, dict[str, Mutant]] = {}
for _m in _PROFILE_REGISTRY + _ASYNC_REGISTRY:
    PROFILE_MUTANTS.setdefault(_m.profile or "", {})[_m.name] = _m
ALL_MUTANTS: dict[str, Mutant] = MUTANTS | {m.name: m for m in _PROFILE_REGISTRY + _ASYNC_REGISTRY}

# The originals, taken when this module is first imported: nothing has been
# swapped yet then, since only `applied` swaps, and it needs this module.
ORIGINALS: dict[str, FunctionType] = {target: spec_function(target)
                                      for m in _REGISTRY + _PROFILE_REGISTRY + _ASYNC_REGISTRY
                                      for target in m.replaces}


def mutant(name: str) -> Mutant:
    """The mutant called `name` (of every profile, or of one); ValueError
    naming the known ones otherwise."""
    if name in MUTANTS:
        return MUTANTS[name]
    for own in PROFILE_MUTANTS.values():
        if name in own:
            return own[name]
    raise ValueError(f"unknown mutant {name!r}; known: {', '.join(ALL_MUTANTS)}")


def mutants_of(profile: str) -> list[str]:
    """The mutants hunted under `profile`: every profile's, then its own."""
    return list(MUTANTS) + list(PROFILE_MUTANTS.get(profile, {}))


def stale_fingerprints(m: Mutant) -> list[str]:
    """The spec functions m replaces that changed since m was derived from them."""
    return [target for target, stored in m.fingerprints.items()
            if fingerprint(ORIGINALS[target]) != stored]
