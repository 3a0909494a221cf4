"""A prefix hit that takes KV no batch wrote (ground truth
`hits_on_unwritten_kv`, unwritten_kv_recording.py), on fabricated block
events: no vLLM.

The shape is vLLM 0.8.4's (`KVCacheManager.allocate_slots`, a negative
`num_full_blocks_after_append`; `BlockPool.cache_full_blocks` slicing
`blocks[0:-1]`): r1, resumed holding 3 drafts, is given 2 tokens on a table
of 3 blocks of 2 (one preallocated past them), and the slice caches blocks
0 and 1 while its batch writes only block 0's tokens.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from flightcheck.vllm.engine_truth import _without_instance_overrides
from flightcheck.vllm.ground_truth import Observations
from flightcheck.vllm.replay import findings
from flightcheck.vllm.unwritten_kv_recording import (BlockIds, UnwrittenKV, UnwrittenKVRecordingMixin,
                                                     newly_hashed, sliced_indexes)

from .vllm_support import DATA, KeptCase, Workers, workers

R1_TABLE = [18, 19, 20]


def entry(req: str, start: int, n: int, cached: int = 0, **more: Any) -> dict[str, Any]:
    return {"req": req, "start": start, "n": n, "cached": cached, **more}


def r1_caches_past_its_tokens() -> UnwrittenKV:
    """r1's batch writes tokens 0-1 (block 18); the slice cached 18 and 19."""
    watch = UnwrittenKV(block_size=2)
    watch.handed_out(R1_TABLE)
    watch.cached([(18, 0), (19, 1)], "r1", 20)
    watch.write_batch([entry("r1", 0, 2)], {"r1": R1_TABLE})
    return watch


def test_a_block_cached_past_the_tokens_scheduled_is_noted_once_its_batch_is_written() -> None:
    watch = r1_caches_past_its_tokens()
    assert watch.cached_short(20) == [{"step": 20, "block": 19, "written": 0,
                                       "cached_by": {"req": "r1", "step": 20, "index": 1}}]
    assert watch.cached_short(21) == []                       # each caching judged once


def test_a_hit_on_it_before_any_batch_writes_it_is_a_finding_naming_who_cached_it() -> None:
    watch = r1_caches_past_its_tokens()
    r2 = entry("r2", 4, 1, cached=4)
    tables = {"r2": [18, 19, 21]}
    watch.write_batch([r2], tables)
    hits = watch.unwritten_hits([r2], tables, 22, 11)
    assert hits == [{"step": 22, "batch": 11, "req": "r2", "hit": 4, "block": 19, "index": 1, "written": 0,
                     "cached_by": {"req": "r1", "step": 20, "index": 1}}]


def test_a_hit_in_the_batch_that_writes_the_block_or_after_it_is_none() -> None:
    watch = r1_caches_past_its_tokens()
    # r1's next chunk (tokens 2-3) and r2's admission in one batch: each
    # layer writes the batch's KV before it attends
    same = [entry("r1", 2, 2), entry("r2", 4, 1, cached=4)]
    tables = {"r1": R1_TABLE, "r2": [18, 19, 21]}
    watch.write_batch(same, tables)
    assert watch.unwritten_hits(same, tables, 22, 11) == []
    # a later batch reads it too
    later = [entry("r3", 4, 2, cached=4)]
    assert watch.unwritten_hits(later, {"r3": [18, 19, 22]}, 24, 12) == []


def test_a_block_half_written_is_not_written() -> None:
    watch = UnwrittenKV(block_size=4)
    watch.handed_out([5, 6])
    watch.cached([(5, 0), (6, 1)], "r1", 3)
    watch.write_batch([entry("r1", 0, 6)], {"r1": [5, 6]})    # block 6 holds tokens 4-5 of 4-7
    assert [short["block"] for short in watch.cached_short(3)] == [6]
    hit = entry("r2", 8, 1, cached=8)
    found = watch.unwritten_hits([hit], {"r2": [5, 6, 7]}, 4, 2)
    assert [(f["block"], f["written"]) for f in found] == [(6, 2)]


def test_a_block_handed_out_again_forgets_what_it_held() -> None:
    watch = UnwrittenKV(block_size=2)
    watch.handed_out([3])
    watch.write_batch([entry("r1", 0, 2)], {"r1": [3]})
    watch.cached([(3, 0)], "r1", 2)
    assert watch.cached_short(2) == []
    watch.handed_out([3])                        # evicted, r4's now: nothing written in it yet
    assert watch.written.get(3) is None and 3 not in watch.cached_by
    hit = entry("r5", 2, 1, cached=2)
    assert [f["cached_by"] for f in watch.unwritten_hits([hit], {"r5": [3, 4]}, 5, 3)] == [None]


def test_loads_write_what_they_bring() -> None:
    watch = UnwrittenKV(block_size=2)
    watch.handed_out([1, 2, 3, 4])
    # a sync load of 4 tokens before start 4, in the entry's batch
    sync = entry("r0", 4, 1, cached=4, external=4)
    watch.write_batch([sync], {"r0": [1, 2, 3]})
    assert watch.unwritten_hits([sync], {"r0": [1, 2, 3]}, 1, 1) == []
    # an async load, once received: the request's tokens up to its num_computed_tokens
    parked = entry("r1", 4, 1, cached=4)
    assert len(watch.unwritten_hits([parked], {"r1": [4, 2, 3]}, 2, 2)) == 1
    watch.write([4, 2, 3], 0, 4)
    assert watch.unwritten_hits([parked], {"r1": [4, 2, 3]}, 3, 3) == []


def test_only_an_admission_below_its_start_is_read() -> None:
    watch = UnwrittenKV(block_size=2)
    running = entry("r1", 4, 2)                  # not admitted: `cached` 0
    assert watch.unwritten_hits([running], {"r1": [7, 8, 9]}, 1, 1) == []


@dataclass
class FakeBlock:
    block_id: int
    block_hash: Any = None


@dataclass
class FakePool:
    blocks: list[FakeBlock] = field(default_factory=lambda: [FakeBlock(i) for i in range(24)])
    free: list[int] = field(default_factory=lambda: list(range(18, 24)))

    def get_new_blocks(self, num_blocks: int) -> list[FakeBlock]:
        taken, self.free = self.free[:num_blocks], self.free[num_blocks:]
        return [self.blocks[i] for i in taken]

    def cache_full_blocks(self, request: Any, blocks: list[FakeBlock], num_cached_blocks: int,
                          num_full_blocks: int, **_: Any) -> None:
        for index, block in enumerate(blocks[num_cached_blocks:num_full_blocks], num_cached_blocks):
            block.block_hash = (request.request_id, index)


@dataclass
class FakeManager:
    block_pool: FakePool = field(default_factory=FakePool)
    req_to_blocks: dict[str, list[FakeBlock]] = field(default_factory=dict)


@dataclass
class FakeRequest:
    request_id: str


class FakeRecorder:
    """What UnwrittenKVRecordingMixin reads of the recorder: a vLLM 0.8.x
    manager (`req_to_blocks`), the step, the next batch, the observations."""

    def __init__(self) -> None:
        self.cache_config = type("CacheConfig", (), {"enable_prefix_caching": True, "block_size": 2})()
        self.kv_cache_manager = FakeManager()
        self.flightcheck_step, self._fc_next_batch = 19, 10
        self._fc_written: list[dict[str, Any]] = []

    def _fc_start_ground_truth(self, spec_decoding: bool) -> None:
        self.flightcheck_observations = Observations(spec_decoding=spec_decoding)

    def _fc_entries(self, output: Any) -> list[tuple[Any, dict[str, Any]]]:
        return [(None, written) for written in self._fc_written]


class Recorder(UnwrittenKVRecordingMixin, FakeRecorder):
    pass


def schedule(recorder: Recorder, entries: list[dict[str, Any]]) -> None:
    recorder.flightcheck_step += 1
    recorder._fc_written = entries
    recorder._fc_entries(type("Output", (), {"total_num_scheduled_tokens": sum(e["n"] for e in entries)})())
    recorder._fc_next_batch += 1


def test_the_mixin_reads_vllm_0_8_4s_negative_slice_through_the_block_pool() -> None:
    recorder = Recorder()
    recorder._fc_start_ground_truth(spec_decoding=True)
    manager, r1 = recorder.kv_cache_manager, FakeRequest("r1")
    # allocate_slots(r1, 2) with 3 drafts held: 1 block + 2 preallocated, then blocks[0:-1] cached
    manager.req_to_blocks["r1"] = manager.block_pool.get_new_blocks(3)
    manager.block_pool.cache_full_blocks(request=r1, blocks=manager.req_to_blocks["r1"], num_cached_blocks=0,
                                         num_full_blocks=-1)
    schedule(recorder, [entry("r1", 0, 2, cached=0)])
    observations = recorder.flightcheck_observations
    assert [(c["block"], c["cached_by"]) for c in observations.blocks_cached_unwritten] == [
        (19, {"req": "r1", "step": 20, "index": 1})]
    # r2, same first 4 tokens, admitted in the next batch: hits 18 and 19
    manager.req_to_blocks["r2"] = manager.req_to_blocks["r1"][:2] + manager.block_pool.get_new_blocks(1)
    schedule(recorder, [entry("r2", 4, 1, cached=4)])
    assert [(h["req"], h["block"], h["batch"], h["step"]) for h in observations.hits_on_unwritten_kv] == [
        ("r2", 19, 11, 21)]
    truth = observations.to_json()
    said = findings({"ending": "done", "ground_truth": truth})
    assert len(said) == 1 and "hit_on_unwritten_kv" in said[0] and "cached by r1 at step 20" in said[0]


def test_a_probe_twin_of_the_scheduler_allocates_in_its_own_pool() -> None:
    recorder = Recorder()
    recorder._fc_start_ground_truth(spec_decoding=False)
    twin_manager = copy.deepcopy(recorder.kv_cache_manager)
    _without_instance_overrides(twin_manager.block_pool)
    twin_manager.block_pool.get_new_blocks(2)
    assert recorder.kv_cache_manager.block_pool.free == list(range(18, 24))
    assert twin_manager.block_pool.free == list(range(20, 24))


def test_newly_hashed_reads_the_blocks_that_had_none_in_the_slice_vllm_takes() -> None:
    blocks = [FakeBlock(1, "a"), FakeBlock(2), FakeBlock(3), FakeBlock(4)]
    indexes = sliced_indexes(blocks, {"num_cached_blocks": 0, "num_full_blocks": -1})   # 0.8.x's negative count
    assert list(indexes) == [0, 1, 2]
    before = [blocks[index].block_hash is not None for index in indexes]
    blocks[1].block_hash = "b"
    assert newly_hashed(blocks, indexes, before) == [(2, 1)]
    assert list(sliced_indexes(blocks, {"num_cached_blocks": 2, "num_full_blocks": 1})) == []
    assert list(sliced_indexes(blocks, {})) == [0, 1, 2, 3]


def test_block_ids_read_a_live_table_by_index() -> None:
    table = [FakeBlock(7), FakeBlock(8)]
    ids = BlockIds(table)
    table.append(FakeBlock(9))                   # vLLM appends to the same list
    assert (len(ids), ids[2], ids[:2]) == (3, 9, [7, 8])


def test_no_observation_no_key() -> None:
    assert "hits_on_unwritten_kv" not in Observations().to_json()


# --- on vLLM itself (slow)


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_0_8_4s_negative_slice_in_the_kept_case_caches_a_written_block_no_finding(running: Workers,
                                                                                       tmp_path) -> None:
    """Seed 376 index 149 (tests/test_vllm_negative_slice_084.py): the slice
    caches r1's first block, whose 2 tokens r1's own batch writes; r1's next
    admission hits it. The watch sees the hit and names nothing."""
    from flightcheck.vllm.differential import decisions, read_trace

    case = KeptCase(DATA / "hunt395" / "084_sync_negative_count_caches_the_first_block_seed376_149")
    trace = tmp_path / "replayed.jsonl"
    result = running["0.8.4"].replay(case.raw(), trace=str(trace))
    assert decisions(read_trace(trace)) == decisions(read_trace(case.trace))
    hits = [entry for event in read_trace(trace) if event["ev"] == "schedule"
            for entry in event["entries"] if entry["cached"] > 0]
    assert [(entry["req"], entry["cached"]) for entry in hits] == [("r1", 2), ("r1", 2)]
    truth = result["ground_truth"]
    assert "hits_on_unwritten_kv" not in truth and "blocks_cached_unwritten" not in truth
