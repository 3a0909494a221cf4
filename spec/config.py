"""The constants of the spec: the scheduler's configuration and the policy
switches.

Abstracted away: everything about the model (layers, weights, dtypes), the
encoder budgets, LoRA, structured output, priorities, async scheduling and KV
connectors. None of them changes how many tokens are in flight for whom, which
is all this spec is about. Preallocation of blocks ahead of need
(`num_preallocate_tokens`) is fixed at 0, as in vLLM from 0.9.
"""

from __future__ import annotations

from dataclasses import dataclass

# Names of the historical bugs (and the synthetic ones that show an invariant
# carries weight) that exist as switches in the spec. `None` is the correct spec.
MUTANTS: dict[str, str] = {
    "advance_at_completion":
        "num_computed advanced when the output returns while prefill continues "
        "(double scheduling; what scheduled_req_ids prevented, #15307)",
    "shared_snapshot":
        "one snapshot object per request, overwritten by the next batch while "
        "the previous one is in flight (pre-0.8.5 CachedRequestData reuse)",
    "final_chunk_from_live_counter":
        "whether a batch samples is decided at completion from the live counter, "
        "not from the batch's snapshot (#13637 design note)",
    "snapshot_omits_prefix_hit":
        "the snapshot's start leaves out the prefix-cache hit, so the final "
        "chunk looks partial and its token is dropped (the #13637 hang)",
    "rejections_not_subtracted":
        "spec-decode rejections not subtracted from num_computed",
    "decode_while_token_in_flight":
        "the num_new_tokens == 0 gate removed: a decode is scheduled while the "
        "previous token is still in flight",
    "stale_output_applied_to_resumed":
        "the output of a batch scheduled before a preemption is applied by name "
        "to the resumed request (vLLM 0.8.5, PP >= 3)",
    "inflight_set_not_cleared_on_preemption":
        "one-batch-per-request: scheduled_req_ids keeps a preempted request, "
        "the unscheduled count drifts and the engine stops scheduling (0.8.1-0.8.4)",
    "rejections_subtracted_after_reset":
        "spec-decode rejections of a stale batch subtracted from the counter "
        "that preemption reset (the 0.12.0 guard)",
    # Synthetic mutants: each exists to show one invariant carries weight.
    "budget_ignored":
        "synthetic: the token budget is not charged for running requests",
    "max_num_seqs_ignored":
        "synthetic: admission does not check max_num_seqs",
    "threshold_ignored_on_admission":
        "synthetic: long_prefill_token_threshold is not applied to admissions",
    "no_length_cap":
        "synthetic: max_tokens is not checked after an appended token",
    "blocks_not_freed_on_abort":
        "synthetic: an aborted request keeps its blocks",
    "admit_after_preemption":
        "synthetic: admission runs in a step that preempted",
    "orphan_kept_after_reschedule":
        "synthetic: a rescheduled request's orphaned entries stay orphaned",
    "preempt_keeps_counter":
        "synthetic: preemption does not reset num_computed",
    "preemption_clears_inflight_drafts":
        "synthetic: in-flight batches alias the request's draft list, which "
        "preemption clears",
    "empty_batch_submitted":
        "synthetic: a schedule call that only preempted still enqueues an empty batch",
    "arrival_counter_stale":
        "synthetic: an arriving request keeps a stale num_computed until admitted",
    "overlapping_chunks":
        "synthetic: a continuing prefill chunk restarts one token early, "
        "recomputing a token already in flight",
    "stale_drafts_on_prefill_chunk":
        "synthetic: a prefill chunk's snapshot records a draft, as if the request's "
        "old proposal were still scheduled",
    "draft_cap_ignored":
        "synthetic: the drafter may propose k + 1 drafts",
    "complete_refuses_orphans":
        "synthetic: a batch holding an orphaned entry can never be consumed",
    "schedule_blocked_when_idle":
        "synthetic: the engine will not schedule while nothing is in flight",
    "no_block_for_last_token":
        "synthetic: allocation rounds down, the last partial block is missing",
}


@dataclass(frozen=True)
class Config:
    """The scheduler's knobs (vLLM's SchedulerConfig/CacheConfig names)."""

    num_stages: int = 2                      # K: pipeline stages = batch queue depth
    max_num_batched_tokens: int = 8          # token budget per batch
    max_num_seqs: int = 2                    # running requests at most
    block_size: int = 2                      # tokens per KV block
    num_blocks: int = 8                      # the pool
    max_model_len: int = 16                  # prompt + outputs at most
    long_prefill_token_threshold: int = 0    # 0 = off; else one request's chunk cap
    num_spec_tokens: int = 0                 # k: drafts proposed per step at most
    prefix_caching: bool = True
    continue_prefill: bool = True            # the PR; False = one batch per request
    mutant: str | None = None

    def __post_init__(self) -> None:
        positive = ("num_stages", "max_num_batched_tokens", "max_num_seqs",
                    "block_size", "num_blocks", "max_model_len")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be >= 0")
        if self.num_spec_tokens < 0:
            raise ValueError("num_spec_tokens must be >= 0")
        if self.mutant is not None and self.mutant not in MUTANTS:
            raise ValueError(f"unknown mutant {self.mutant!r}; known: {', '.join(MUTANTS)}")

    def is_mutant(self, name: str) -> bool:
        return self.mutant == name
