"""The reference's named deviations from vLLM, the catalogue the differential
(differential.py) may name: each a rule where the reference deliberately does
what vLLM should do and vLLM does not (reference/README.md, "Deliberate
deviations"), and which of them each release can show. The released reference
(`vllm_outputs=True`, reference/profiles.py `RELEASED`) switches them to
vLLM's behaviour.
"""

from __future__ import annotations

# The reference's deliberate deviations from vLLM 0.8.x, by name
# (reference/README.md, "Deliberate deviations"); only these may differ.
DEVIATIONS: dict[str, str] = {
    "orphaned_token_kept":
        "a token of a batch whose request was preempted since (and not rescheduled) is "
        "appended by the reference (the later fix #20739); vLLM 0.8.x's update_from_output "
        "walks `running` and drops it",
    "stale_token_dropped":
        "a token of a batch scheduled before its request was preempted and resumed (or "
        "aborted and re-added) is dropped by the reference; vLLM 0.8.x applies it by name "
        "(the ground truth's stale token)",
    "partial_chunk_token_dropped":
        "vLLM's model runner samples a chunk its scheduler scheduled as partial (its own "
        "view of the request is one token short after a preemption, "
        "GPUModelRunner._update_states); the reference takes a token only where the "
        "batch's snapshot says the entry samples",
    "inflight_mark_cleared_on_preemption":
        "one batch per request (0.8.4): the reference removes a preempted request from "
        "scheduled_req_ids (and an aborted waiting one); vLLM 0.8.4 keeps the mark until "
        "a completion of that request while RUNNING removes it, so "
        "get_num_unscheduled_requests drifts, the engine's gate stops scheduling (the "
        "counter-drift livelock) and a stale completion can clear a newer batch's mark",
    "engine_blocked_in_flight":
        "vLLM's engine waits for input when has_requests() turns false with batches of "
        "aborted requests still in flight (0.8.x clears finished_req_ids in every "
        "schedule()), until the next request arrives; the reference keeps the finished ids "
        "until a batch carries them, so it completes those batches first",
    "unscheduled_drafts_dropped":
        "speculative decoding: the reference drops the drafts an entry does not schedule and "
        "clears a request's drafts when it is preempted, as vLLM 0.33 does (Scheduler.schedule "
        "sets `request.spec_token_ids = []` after scheduling; `_preempt_request` clears them); "
        "vLLM 0.8.x keeps them (Scheduler.schedule trims `spec_token_ids` only when "
        "`num_scheduled_spec_tokens > 0`, its preemption resets only the status and "
        "num_computed_tokens) and schedules them in a later batch, with pipeline parallelism "
        "while the request's sampling entry is still in flight: that position is sampled twice "
        "and the token appended twice (the ground truth's double sample)",
    "negative_count_caches_blocks":
        "speculative decoding: vLLM 0.8.x's allocate_slots counts `(num_computed_tokens + "
        "num_tokens - len(request.spec_token_ids)) // block_size` full blocks, negative for a "
        "request resumed holding more drafts (kept through its preemption) than the tokens it "
        "is given, and BlockPool.cache_full_blocks caches `blocks[num_cached_blocks:"
        "num_full_blocks]`, every table block but the last ones, before their KV is written "
        "where they lie past the tokens scheduled; the reference caches nothing there, so the "
        "request's next admission hits less (reference/profiles.py "
        "`caches_through_a_negative_count`, a released constant)",
    "drafts_clipped_to_max_model_len":
        "speculative decoding: the reference clips an entry to `max_model_len - "
        "num_computed_tokens`, as vLLM 0.8.5's Scheduler.schedule does (\"necessary when using "
        "spec decoding\"); vLLM 0.8.4's running loop has no such clip and schedules drafts past "
        "max_model_len (the ground truth's `beyond_max_model_len`; seen to end in an assertion in "
        "BlockPool.cache_full_blocks)",
    "reused_id_output_dropped":
        "vLLM 0.33: a batch scheduled for a request whose id was since given to a new request "
        "(an abort, then a request under the same id, request-id randomization off) is looked "
        "up by id and applied to the new request, whose num_in_flight_tokens then goes "
        "negative (the id-reuse bug: a wrong binding, then a hang or an assertion; 0.34 with async "
        "scheduling and drafts: _update_request_with_output's placeholder assert, vLLM #42492); the "
        "reference drops it and leaves the new request's counters alone",
    "drafts_handed_over_at_submission":
        "vLLM 0.33 (synchronous scheduling): the engine hands the scheduler the drafts proposed for a "
        "batch in the engine step that submitted it (EngineCore.post_step: take_draft_token_ids, "
        "Scheduler.update_draft_token_ids), before that batch completes; with pipeline parallelism "
        "the next schedule() schedules a request's drafts beyond those in flight at once, on top "
        "of its sampling entry in flight (the ground truth's double sample), and a completion "
        "shows drafts handed over for a later batch; the reference takes the drafts with the "
        "output of the request's sampling entry",
    "kv_error_finished_at_once":
        "KV connector, load_failure_policy \"fail\": the reference finishes a request whose load "
        "failed with an error as soon as the failure is processed (as an abort: its entries in "
        "flight are dropped); vLLM 0.33 and 0.34's update_from_output skip its outputs and finish it "
        "with FINISHED_ERROR after the batch's outputs (reference/profiles.py "
        "`kv_errors_after_outputs`, a released constant)",
    "kv_rollback_keeps_placeholders_pr49250":
        "KV connector, load_failure_policy \"recompute\", async scheduling: vLLM 0.33 and 0.34's "
        "_update_requests_with_invalid_blocks sets a failed sync load's request back to its valid prefix "
        "and leaves its num_output_placeholders (and its other work in flight), so the recompute "
        "schedules tokens for placeholders no batch carries (vLLM #49250, open); the reference drops "
        "the request's work in flight and resets its placeholders (reference/profiles.py "
        "`kv_rollback_in_place`, a released constant)",
    "kv_rollback_base_assumes_one_batch":
        "KV connector, load_failure_policy \"recompute\", more than one batch in flight: vLLM 0.33 and "
        "0.34's _update_requests_with_invalid_blocks takes the valid prefix's base as num_computed_tokens "
        "less the failing batch's tokens, as if that batch were the request's only one in flight, and "
        "applies the outputs of its later batches, computed over the invalid blocks; the reference "
        "drops them (reference/profiles.py `kv_rollback_in_place`, a released constant)",
    "padded_admission_cut_by_threshold":
        "speculative decoding with a long-prefill threshold below 1 + k (in force: chunked prefill, more "
        "than one request): vLLM 0.33 and 0.34's Scheduler.schedule pads an admission with one token left "
        "to 1 + k tokens, the threshold then cuts it, and the waiting loop's own `assert num_new_tokens == "
        "1 + self.num_spec_tokens` fails (0.34.0 scheduler.py:1643, 0.33.0 :1579): schedule() raises and "
        "the engine dies; the reference schedules the cut admission with the drafts that fit "
        "(reference/profiles.py `padding_asserted_whole`, a released constant)",
}

# The deviations each version's differential may name (the others cannot occur there).
VERSION_DEVIATIONS: dict[str, tuple[str, ...]] = {
    "0.8.5": ("orphaned_token_kept", "stale_token_dropped", "partial_chunk_token_dropped",
              "engine_blocked_in_flight", "unscheduled_drafts_dropped", "negative_count_caches_blocks"),
    "0.8.4": ("orphaned_token_kept", "stale_token_dropped", "partial_chunk_token_dropped",
              "inflight_mark_cleared_on_preemption", "engine_blocked_in_flight", "unscheduled_drafts_dropped",
              "drafts_clipped_to_max_model_len", "negative_count_caches_blocks"),
    # 0.33 and 0.34 with drafts (sync): drafts handed over at submission, and
    # after them the runner sampling a chunk the scheduler scheduled as partial.
    "0.33.0": ("reused_id_output_dropped", "drafts_handed_over_at_submission", "partial_chunk_token_dropped",
               "kv_error_finished_at_once", "kv_rollback_keeps_placeholders_pr49250",
               "kv_rollback_base_assumes_one_batch", "padded_admission_cut_by_threshold"),
    "0.34.0": ("reused_id_output_dropped",        # update_from_output still binds by id alone
               "drafts_handed_over_at_submission", "partial_chunk_token_dropped", "kv_error_finished_at_once",
               "kv_rollback_keeps_placeholders_pr49250", "kv_rollback_base_assumes_one_batch",
               "padded_admission_cut_by_threshold"),
}
