"""check-trace on KV connector traces recorded from vLLM's real scheduler
(issue 36: check-trace's verdicts equal vLLM's ground truth): a handful of
the `flightcheck vllm campaign --kv-connector --seed 1` runs that show each
rule the spec reads from vLLM (docs/kv-connector.md, "Read as the spec reads
it"), each accepted, and the runs where vLLM is wrong (its ground truth
flags them), each rejected at the event with the property vLLM breaks.

The traces are the recorder's (flightcheck/vllm/recorder.py), recorded by
replaying workload `index` of `campaign_workloads(1, 300, ..., "kv-connector")`
on vLLM 0.33.0 or 0.34.0 (prefix `033_` / `034_`), sync or async. Each of the
accepted ones was rejected before the rule it names was read into the spec,
the checker or the recorder.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flightcheck.verification.traces.check import check_trace

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

DATA = Path(__file__).parent / "data" / "kv" / "vllm"

# file -> (ok, line, property): what vLLM did, and where check-trace puts its bug
EXPECTED = {
    # index 107, fail policy: requests that share the failed load's blocks through
    # their prefix hit fail with it (`_update_requests_with_invalid_blocks`)
    "034_shared_prefix_fail_policy.jsonl": (True, None, None),
    "033_async_shared_prefix_fail_policy.jsonl": (True, None, None),
    # index 243, recompute: a sharer keeps its hit and loses its entry in the batch
    "034_shared_prefix_recompute.jsonl": (True, None, None),
    # index 78: the loader was aborted; its failure still fails the sharers
    "034_aborted_loader_fails_sharers.jsonl": (True, None, None),
    # index 77: the fail policy evicts the invalid blocks from the prefix cache
    # (a later hit is shorter) and frees with the carrying batch's update
    "034_fail_policy_evicts_invalid_blocks.jsonl": (True, None, None),
    # index 16: a failure reported for an aborted request's load changes nothing
    "034_failure_of_aborted_load.jsonl": (True, None, None),
    # index 18 (async): a load that left nothing valid is admitted with a new table
    "034_async_failed_load_new_table.jsonl": (True, None, None),
    # index 146 (async): an async load parks only beside the reserved blocks
    "034_async_park_beside_reservations.jsonl": (True, None, None),
    # index 152 (async): the long-prefill threshold counts kv_holding_waiting
    "034_async_threshold_counts_kv_holding.jsonl": (True, None, None),
    # `campaign --all-features --versions 0.34.0 --seed 1`, index 5 (inputs during
    # waits): a landed load promoted by one call and admitted by a later one
    # lists its held table first in `block_ids`, as one admitted at promotion does
    "034_promoted_load_admitted_later.jsonl": (True, None, None),
    # `campaign --all-features --versions 0.34.0 --seed 2`, index 191: one output
    # reports two loads' invalid blocks, r0's (a prefix block r3 holds through its
    # hit) and r3's own; vLLM judges them in one scan (r0 to 4 tokens, r3 to its
    # own first invalid block, 6), as the spec's joint action does (a false
    # C2_reports_own_blocks before: r0's failure alone rolled r3 back as a sharer)
    "034_joint_failures_loader_and_sharer.jsonl": (True, None, None),
    # the same workload replayed with r0 aborted at engine step 9, during the wait
    # for batch 1 (hand-edited: abort_step 9): the loader is not scanned, so r3,
    # the first holder of r0's invalid block, is cut there (4 tokens), not at its
    # own (each failure written with `of`; vLLM's ground truth: legal)
    "034_joint_failures_aborted_loader.jsonl": (True, None, None),
    # `campaign --all-features --versions 0.34.0 --seed 2` (main at c265f6d), index 83:
    # an aborted loader's invalid block held by a parked load (r2) and a running
    # request (r3): vLLM's two passes mark apart, so r3, the first running holder,
    # recomputes from it (16 tokens; a false KV3 rejection before: the parked
    # holder took the mark and r3 kept its hit)
    "034_aborted_loader_parked_and_running_holders.jsonl": (True, None, None),
    # `campaign --all-features --versions 0.33.0 --seed 3`, index 150 (async): a
    # load that failed whole is promoted by a schedule() call that formed nothing
    # (its table to the free queue's head), before a completion drains r1's fenced
    # frees ahead of it; the next batch allocates r1's blocks first (a false
    # S9_kv_ownership before: the checker promoted it only at that batch)
    "033_async_failed_load_promoted_at_empty_call.jsonl": (True, None, None),
    # the same at seed 2, index 114 (chunked prefill off, a producer): the empty
    # call's promotion comes before a held request's table frees
    "033_async_failed_load_promoted_before_a_send.jsonl": (True, None, None),
    # `campaign --all-features --versions 0.34.0 --seed 1`, index 173 (cache-aware
    # admission on): r1's async load holds r0's sync-loaded prefix block; r0's load
    # fails, which cuts parked r1 to 2 tokens; then r1's own load fails whole
    # (request-level failed_recving), and vLLM zeroes it (`_handle_failed_recving`),
    # frees its table at promotion and takes a fresh prefix hit (a false KV3 before:
    # the checker took the second failure as changing nothing) ...
    "034_cache_aware_parked_load_cut_then_its_own_failure.jsonl": (True, None, None),
    # ... the same workload without cache-aware admission: the same trace shape
    # (the reorder is not the cause)
    "034_parked_load_cut_then_its_own_failure.jsonl": (True, None, None),
    # vLLM wrong, its ground truth flags it: #49250, the rollback keeps the
    # placeholders (index 13, async) ...
    "034_async_rollback_keeps_placeholders_pr49250.jsonl": (False, 9, "KV3_rollback_restores_counters"),
    "033_async_rollback_keeps_placeholders_pr49250.jsonl": (False, 8, "KV3_rollback_restores_counters"),
    # ... and a batch in flight past the valid prefix keeps its output (index 13,
    # two stages: docs/vllm-kv-connector-findings.md, finding 2) ...
    "034_later_batch_token_after_rollback.jsonl": (False, 14, "S7_output_binding"),
    # ... and a sharer rolled back to `num_computed_tokens - num_scheduled_tokens`,
    # which counts its later batch in flight (index 233, two stages)
    "034_sharer_rollback_base_counts_later_batch.jsonl": (False, 8, "KV3_rollback_restores_counters"),
    "033_sharer_rollback_base_counts_later_batch.jsonl": (False, 8, "KV3_rollback_restores_counters"),
    # ... also where the later batch's entry is no longer than the failing one's, so it
    # starts at vLLM's base (r2: [2, 6) failing, [6, 10) in flight, set back to 6; the
    # workload kept beside them, tests/test_vllm_holder_base.py: vLLM's ground truth
    # missed it, and the rejection was counted false)
    "034_sharer_rollback_base_counts_later_batch_of_equal_chunk.jsonl": (False, 6, "KV3_rollback_restores_counters"),
    "033_sharer_rollback_base_counts_later_batch_of_equal_chunk.jsonl": (False, 6, "KV3_rollback_restores_counters"),
    # ... and #49250 on a request sharing the failed blocks (`campaign --all-features
    # --versions 0.33.0 --seed 1`, index 64, async): aborted before its next entry, so
    # only the kv_failed's `holders` show its counters (accepted, the bug missed, before)
    "033_async_sharer_rollback_keeps_placeholders_pr49250.jsonl": (False, 8, "KV3_rollback_restores_counters"),
    # `campaign --versions 0.34.0 --kv-connector --spec-tokens 1 --seed 59`, index 6:
    # drafts handed over at submission sample r0 twice (vLLM's double sample; the
    # differential's fixture for the fail policy's error order, test_vllm_differential_kv)
    "034_fail_policy_errors_in_set_order_after_drafts_deviation.jsonl": (False, 7, "S5_one_sample_per_prefill"),
    # `campaign --versions 0.33.0 --all-features --spec-tokens 2 --seed 11 --async`,
    # index 12: r0's chunk stopped at 16 of 17 tokens, so it stays in
    # `_inflight_prefills` (`_update_after_schedule`) and its 2 blocks stay
    # reserved: r2's load (7 blocks, 9 free) does not park (a false
    # kv_load_decision before: the spec let only `num_tokens - 1` and below count)
    "033_async_chunk_one_short_still_reserves.jsonl": (True, None, None),
}


def test_every_recorded_trace_is_listed():
    assert {p.name for p in DATA.glob("*.jsonl")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_check_trace_agrees_with_vllms_ground_truth(name):
    result = check_trace(DATA / name)
    assert (result.ok, result.line, result.property) == EXPECTED[name], result.message
