"""The reference scheduler's mutants: their names and histories.

Each mutant re-introduces one historical bug (or, where noted, a bug that was
only ever a design hazard). `SchedulerConfig(mutant=NAME)` selects one (`None`
is the correct scheduler); the scheduler built for it swaps in the mutant's
versions of the one or two steps it changes, which mutant_steps.py holds,
each with a fingerprint of the correct step it replaces. The verification
suite must find a counterexample for every name here; the tests in
`tests/test_reference_mutants.py` show each one's damage on a small scenario.
"""

from __future__ import annotations

ADVANCE_AT_COMPLETION = "advance_at_completion"
SHARED_SNAPSHOT = "shared_snapshot"
FINAL_CHUNK_FROM_LIVE_COUNTER = "final_chunk_from_live_counter"
SNAPSHOT_OMITS_PREFIX_HIT = "snapshot_omits_prefix_hit"
REJECTIONS_NOT_SUBTRACTED = "rejections_not_subtracted"
DECODE_WHILE_TOKEN_IN_FLIGHT = "decode_while_token_in_flight"
STALE_OUTPUT_APPLIED_TO_RESUMED = "stale_output_applied_to_resumed"
INFLIGHT_SET_NOT_CLEARED_ON_PREEMPTION = "inflight_set_not_cleared_on_preemption"
REJECTIONS_SUBTRACTED_AFTER_RESET = "rejections_subtracted_after_reset"
OUTPUT_BOUND_BY_NAME = "output_bound_by_name"

# name -> one-line description with its historic source.
MUTANTS: dict[str, str] = {
    ADVANCE_AT_COMPLETION:
        "num_computed_tokens advanced in update_from_output while prefill "
        "continues: the same tokens are scheduled twice (what scheduled_req_ids "
        "prevented before #15307, v0.8.1-0.8.2)",
    SHARED_SNAPSHOT:
        "one mutable CachedRequestData per request, overwritten by the next batch "
        "while the previous one is in flight (vLLM <= 0.8.4 object reuse, #13637 (c))",
    FINAL_CHUNK_FROM_LIVE_COUNTER:
        "update_from_output decides whether an entry sampled from the live "
        "request counter, not the batch's snapshot (#13637 design note (d)); "
        "visible with a worker that samples every chunk "
        "(ScriptedExecutor(sample_every_chunk=True), as vLLM <= 0.8.2)",
    SNAPSHOT_OMITS_PREFIX_HIT:
        "the snapshot's num_computed_tokens leaves out the prefix-cache hit: the "
        "final chunk looks partial, its token is dropped, the request hangs "
        "(#13637, 2025-03-14)",
    REJECTIONS_NOT_SUBTRACTED:
        "spec-decode rejections not subtracted from num_computed_tokens "
        "(#13637 (d): 'simply subtracts the number of rejected tokens')",
    DECODE_WHILE_TOKEN_IN_FLIGHT:
        "the num_new_tokens == 0 skip removed for decodes: one token is scheduled "
        "while the previous sampled token is still in flight (0.8.5 running-loop gate)",
    STALE_OUTPUT_APPLIED_TO_RESUMED:
        "an output of a batch scheduled before a preemption is applied by name to "
        "the resumed, RUNNING request (vLLM 0.8.5 with PP >= 3; fixed by #20739)",
    INFLIGHT_SET_NOT_CLEARED_ON_PREEMPTION:
        "one-batch-per-request: scheduled_req_ids keeps a request preempted while "
        "in flight, get_num_unscheduled_requests undercounts and the engine stops "
        "scheduling (inferred from vLLM 0.8.1-0.8.4)",
    REJECTIONS_SUBTRACTED_AFTER_RESET:
        "spec-decode rejections of an orphaned batch subtracted from the counter "
        "that preemption reset to 0 (the v0.12.0 `num_computed_tokens > 0` guard, #28473)",
    OUTPUT_BOUND_BY_NAME:
        "an output applied by request name: an aborted id re-added as a new "
        "request gets the old batch's tokens (#42492 / #42523)",
}


# Mutants of vLLM 0.33's rules (its stale-output counters and lookup by id):
# under any other profile the steps they replace never run, so they are
# fuzzed under that profile only (`fuzz(..., profile="vllm-0.33")`) and kept
# out of MUTANTS (the every-profile set the 0.8.x kill matrix holds). The
# first three are the reference's counterparts of the spec's mutants of the
# same names (verification/mutants/registry.py); the last is vLLM 0.33's own
# binding, which only a reused id can tell from the reference's.
RESUMPTION_NOT_DEFERRED = "resumption_not_deferred"
DROP_LEAVES_COUNTERS = "drop_leaves_counters"
OUTPUT_BOUND_BY_ID_ALONE = "output_bound_by_id_alone"
IN_FLIGHT_KEPT_WITHOUT_OUTPUT = "in_flight_kept_without_output"

# Mutants of vLLM 0.33's asynchronous scheduling (AsyncScheduler: output
# placeholders, the decode stagger, the max_tokens guard), fuzzed under
# `vllm-0.33-async` only (every other profile keeps no placeholders and no
# stagger, so the steps they replace change nothing there): the reference's
# counterparts of the spec's mutants of the same names
# (verification/mutants/registry.py, issue 22 point 5).
ASYNC_REJECTIONS_NOT_SETTLED = "async_rejections_not_settled"
ASYNC_PLACEHOLDERS_KEPT_ON_PREEMPTION = "async_placeholders_kept_on_preemption"
ASYNC_STAGGER_IGNORED = "async_stagger_ignored"
ASYNC_MAX_TOKENS_GUARD_OFF_BY_ONE = "async_max_tokens_guard_off_by_one"
ASYNC_DECODE_ON_STALE_PLACEHOLDER = "async_decode_on_stale_placeholder"

PROFILE_MUTANTS: dict[str, dict[str, str]] = {
    "vllm-0.33": {
        RESUMPTION_NOT_DEFERRED:
            "vLLM 0.33's deferral of a preempted request with deliver-mode stale output in "
            "flight left out of the waiting loop (`skip_request`): 0.8.5's bug returns, the "
            "request resumes and its stale output reaches the running request",
        DROP_LEAVES_COUNTERS:
            "drop mode discards a stale output without settling the request's counters "
            "(`update_from_output`): the in-flight count keeps the dropped batch's tokens and "
            "the stale share never drains",
        IN_FLIGHT_KEPT_WITHOUT_OUTPUT:
            "the counters are not settled for an entry that returns no token (a partial "
            "prefill chunk), as if the decrement sat behind `update_from_output`'s skip of "
            "requests without generated tokens: the in-flight count never drains",
        OUTPUT_BOUND_BY_ID_ALONE:
            "vLLM 0.33's `update_from_output`: an output looked up by request id alone, with no "
            "incarnation check, so a batch of an aborted request whose id was re-added lands on "
            "the new request, tokens and counters (the id-reuse bug, "
            "docs/vllm-0.33-id-reuse.md); inert with fresh ids",
    },
    "vllm-0.33-async": {
        ASYNC_REJECTIONS_NOT_SETTLED:
            "rejected drafts are not taken back from num_output_placeholders "
            "(`update_from_output`'s `num_output_placeholders -= num_rejected` left out): the "
            "request keeps placeholders no entry stands for",
        ASYNC_PLACEHOLDERS_KEPT_ON_PREEMPTION:
            "`_preempt_request` does not reset num_output_placeholders to 0: the resumed "
            "request counts tokens of its stale output as its own",
        ASYNC_STAGGER_IGNORED:
            "the running loop's `current_step < next_decode_eligible_step` skip (V2 runner, "
            "PP) left out: two decodes of one request closer than pp_size schedule() calls",
        ASYNC_MAX_TOKENS_GUARD_OFF_BY_ONE:
            "the async max_tokens guard reads `num_computed_tokens + 1 - "
            "num_output_placeholders` for `+ 2`: a decode whose token can only pass "
            "max_tokens is scheduled",
        ASYNC_DECODE_ON_STALE_PLACEHOLDER:
            "a preempted request resumed while its stale output is still in flight (drop mode) "
            "takes the placeholders it had at preemption back as its own, so the running loop "
            "schedules decodes on tokens of the old, dropped output",
    },
}
ALL_MUTANTS: dict[str, str] = MUTANTS | {name: text for own in PROFILE_MUTANTS.values()
                                         for name, text in own.items()}


def profile_of_mutant(name: str) -> str | None:
    """The profile a mutant is fuzzed under (None: every profile's)."""
    return next((profile for profile, own in PROFILE_MUTANTS.items() if name in own), None)


def check_mutant(name: str | None) -> None:
    """Raise ValueError unless `name` is None or a known mutant."""
    if name is not None and name not in ALL_MUTANTS:
        raise ValueError(f"unknown mutant {name!r}; known: {', '.join(ALL_MUTANTS)}")
