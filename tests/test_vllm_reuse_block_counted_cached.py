"""A reused id's drift that leaves a block unhashed: vLLM counts blocks its
request's table does not hold yet as cached (campaign `--versions 0.34.0
--all-features --reuse-ids --spec-tokens 3 --workloads 250 --seed 302`,
index 134, sync, inputs during waits; kept in tests/data/vllm/hunt300/).

r2 is aborted with its batches 3 and 4 in flight, and a new request takes
its id. Batch 3's output, looked up by id (`reused_id_output_dropped`), takes
2 off the waiting new r2's `num_in_flight_tokens`; batch 5 admits it with
one block (vLLM's 18) and brings the count back to 0; batch 4's output takes
2 off again. The new r2 is RUNNING now and drafts are configured, so vLLM
0.34's `Scheduler.update_from_output` caches its settled blocks,
`cache_blocks(request, num_computed_tokens - num_in_flight_tokens)`: 2 - (-2)
= 4 tokens, two full blocks, where the table holds one.
`SingleTypeKVCacheManager.cache_blocks` hands `BlockPool.cache_full_blocks`
the table's slice `[1:2]` (empty) and records `num_cached_block = 2` anyway,
so the block appended next at position 1 (vLLM's 21) is never hashed. When
r2 finishes, `BlockPool.free_blocks` puts the unhashed 21 at the free queue's
head, and r1's next block is 21 (event 24). The reference as released capped
the count at the table (1), hashed 21 at its allocation, queued it at the
tail and handed r1 a fresh 33: the campaign's only unexplained run. The
reference now records the uncapped count as vLLM does
(reference/kv_cache_manager.py `_cache_full_blocks`); a correct count never
reaches past the table, so only the drift can show it.
"""

from __future__ import annotations

from typing import Any

import pytest

from flightcheck.reference import Request, SamplingParams
from flightcheck.reference.kv_cache_manager import KVCacheManager
from flightcheck.vllm.campaign import check_verdict, verdict
from flightcheck.vllm.differential import compare, decisions, first_difference, profile_for, read_trace, run_reference

from .vllm_support import DATA, KeptCase, workers

pytestmark = pytest.mark.usefixtures("both_checkers")       # judges check-trace's verdict

CASE = KeptCase(DATA / "hunt300" / "034_sync_reused_id_block_counted_cached_left_unhashed_seed302_134")
STEM = CASE.stem
_raw, _result = CASE.raw, CASE.result
PROFILE = profile_for("0.34.0", False)


def _blocks_of(events: list[dict[str, Any]], req: str) -> list[tuple[int, int, list[int]]]:
    """(batch, start, block ids) of each entry of `req`, in trace order."""
    return [(event["batch"], entry["start"], entry["block_ids"]) for event in events if event["ev"] == "schedule"
            for entry in event["entries"] if entry["req"] == req]


@pytest.mark.parametrize("settled, hashed", [(4, False), (2, True)],
                         ids=["count-past-the-table", "count-within-the-table"])
def test_a_count_past_the_table_leaves_the_block_appended_there_unhashed(settled: int, hashed: bool) -> None:
    kv = KVCacheManager(8, 2, enable_caching=True, unhashed_blocks_to_head=True)
    request = Request("r", list(range(100, 106)), SamplingParams(max_tokens=4))
    first = kv.allocate_slots(request, 2)
    request.num_computed_tokens = 2
    kv.cache_blocks(request, settled)          # update_from_output's settled count, one block held
    assert kv.num_cached_block["r"] == settled // 2 and first[0].block_hash is not None
    second = kv.allocate_slots(request, 2)
    request.num_computed_tokens = 4
    third = kv.allocate_slots(request, 2)
    assert (second[0].block_hash is not None, third[0].block_hash is not None) == (hashed, True)
    kv.free(request)
    # BlockPool.free_blocks: an unhashed block goes to the free queue's head, a hashed one to its tail
    assert (kv.block_pool.free_block_ids()[0] == second[0].block_id) == (not hashed)


def test_vllm_hands_r1_the_block_the_new_r2_left_unhashed() -> None:
    events = read_trace(STEM.with_suffix(".jsonl"))
    aborted = next(i for i, e in enumerate(events) if e["ev"] == "abort" and e["req"] == "r2")
    finished = next(i for i, e in enumerate(events) if e["ev"] == "finish" and e["reason"] == "length")
    assert events[finished]["req"] == "r2"
    # the new r2's second block, taken after batch 4's output counted two as cached
    assert [blocks for _, start, blocks in _blocks_of(events[aborted:finished], "r2")][:2] == [[18], [21, 22]]
    assert _blocks_of(events[finished:], "r1")[0][2] == [21]


def test_the_reference_as_released_makes_vllms_decisions_throughout() -> None:
    raw, theirs = _raw(), decisions(read_trace(STEM.with_suffix(".jsonl")))
    conforming = decisions(run_reference(raw, PROFILE, vllm_outputs=True).events, block_offset=1)
    assert first_difference(theirs, conforming) is None
    assert conforming[24] == theirs[24] and conforming[24][1][1][:1] + conforming[24][1][1][5:6] == ("r1", (21,))


def test_the_differential_explains_the_run_by_the_id_reuse_alone() -> None:
    raw, events = _raw(), read_trace(STEM.with_suffix(".jsonl"))
    comparison = compare(raw["name"], _result(), events, run_reference(raw, PROFILE),
                         run_reference(raw, PROFILE, vllm_outputs=True))
    assert comparison.explained and comparison.deviation == "reused_id_output_dropped", comparison.describe()
    assert "still differs" not in comparison.describe()


def test_check_trace_rejects_the_run_as_the_ground_truth_saw_it() -> None:
    category, detail = verdict(_result(), check_verdict(STEM.with_suffix(".jsonl")))
    assert category == "rejected, real bug", detail
    assert detail.endswith("S5_one_sample_per_prefill"), detail


def test_the_kept_workload_is_the_campaigns_index_134() -> None:
    from flightcheck.vllm.generate import campaign_workloads

    drawn = campaign_workloads(302, 135, reuse_ids=True, spec_tokens=3, mid_step_inputs=True,
                               features_of="0.34.0")[134]
    assert drawn == _raw()


@pytest.fixture(scope="module")
def running():
    yield from workers()


@pytest.mark.slow
@pytest.mark.vllm
def test_the_kept_workload_replays_on_vllm_to_an_explained_rejected_run(running, tmp_path) -> None:
    from flightcheck.vllm.campaign import compare_workload

    raw, trace = _raw(), tmp_path / "trace.jsonl"
    result = running["0.34.0"].replay(raw, trace=str(trace))
    events = read_trace(trace)
    assert decisions(events) == decisions(read_trace(STEM.with_suffix(".jsonl")))
    comparison, _ = compare_workload(raw, result, events, PROFILE)
    assert comparison.explained and comparison.deviation == "reused_id_output_dropped", comparison.describe()
    category, detail = verdict(result, check_verdict(trace))
    assert category == "rejected, real bug", detail
