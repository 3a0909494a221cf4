"""The block pool and KV cache manager rules the spec checks step for step."""

from __future__ import annotations

import pytest

from flightcheck.reference import (Engine, Request, SamplingParams, Scheduler, SchedulerConfig,
                                   ScriptedExecutor)
from flightcheck.reference.consistency import consistency_errors, leak_errors
from flightcheck.reference.kv_cache_manager import KVCacheManager

BS = 4


def req(req_id: str, tokens: list[int]) -> Request:
    r = Request(req_id, tokens, SamplingParams(max_tokens=8))
    return r


def admit(kv: KVCacheManager, r: Request, num_new: int | None = None):
    """What the waiting loop does: hit, allocate, count the hit as computed."""
    hits, num_hit = kv.get_computed_blocks(r)
    n = r.num_tokens - num_hit if num_new is None else num_new
    new_blocks = kv.allocate_slots(r, n, hits)
    if new_blocks is not None:
        r.num_computed_tokens = num_hit + n
    return new_blocks, num_hit


def test_fresh_blocks_come_from_the_head_of_the_free_queue_in_id_order():
    kv = KVCacheManager(8, BS, enable_caching=False)
    blocks, _ = admit(kv, req("a", list(range(10))))
    assert [b.block_id for b in blocks] == [0, 1, 2]
    assert kv.block_pool.free_block_ids() == [3, 4, 5, 6, 7]


@pytest.mark.parametrize("enable_caching, freed_order", [(True, [2, 1, 0]), (False, [0, 1, 2])],
                         ids=["last-block-first-with-prefix-caching", "first-block-first-without"])
def test_freed_table_joins_the_tail_in_vllms_release_order(enable_caching, freed_order):
    # vLLM 0.8.x KVCacheManager.free reverses the table only when caching is on.
    kv = KVCacheManager(8, BS, enable_caching=enable_caching)
    a = req("a", list(range(10)))
    admit(kv, a)
    kv.free(a)
    assert kv.block_pool.free_block_ids() == [3, 4, 5, 6, 7, *freed_order]
    assert all(b.ref_cnt == 0 for b in kv.block_pool.blocks)


def test_the_release_order_can_be_named_explicitly():
    kv = KVCacheManager(8, BS, enable_caching=False, release_order="reverse")
    a = req("a", list(range(10)))
    admit(kv, a)
    kv.free(a)
    assert kv.block_pool.free_block_ids() == [3, 4, 5, 6, 7, 2, 1, 0]


def test_only_full_blocks_of_known_tokens_are_cached_at_schedule_time():
    kv = KVCacheManager(8, BS, enable_caching=True)
    a = req("a", list(range(10)))
    admit(kv, a)
    assert [b.block_hash is not None for b in kv.req_to_blocks["a"]] == [True, True, False]
    assert len(kv.block_pool.cached_block_hash_to_block) == 2


def test_prefix_hit_stops_at_the_first_miss():
    kv = KVCacheManager(16, BS, enable_caching=True)
    admit(kv, req("a", list(range(12))))
    b = req("b", [0, 1, 2, 3, 9, 9, 9, 9, 8, 9, 10, 11, 12])
    hits, num_hit = kv.get_computed_blocks(b)
    assert [h.block_id for h in hits] == [0] and num_hit == 4


def test_full_prefix_hit_recomputes_the_last_block():
    kv = KVCacheManager(16, BS, enable_caching=True)
    admit(kv, req("a", list(range(12))))
    hits, num_hit = kv.get_computed_blocks(req("b", list(range(12))))
    assert [h.block_id for h in hits] == [0, 1] and num_hit == 8


def test_hit_on_a_free_cached_block_takes_it_out_of_the_free_queue():
    kv = KVCacheManager(8, BS, enable_caching=True)
    a = req("a", list(range(9)))
    admit(kv, a)                       # blocks 0, 1 cached, 2 partial
    kv.free(a)                         # free queue: 3..7, 2, 1, 0
    b = req("b", list(range(9)))
    blocks, num_hit = admit(kv, b)
    assert num_hit == 8 and [x.block_id for x in blocks] == [0, 1, 3]
    assert kv.block_pool.free_block_ids() == [4, 5, 6, 7, 2]
    assert [x.ref_cnt for x in kv.req_to_blocks["b"]] == [1, 1, 1]


def test_popping_a_cached_free_block_evicts_its_hash():
    kv = KVCacheManager(3, BS, enable_caching=True)
    a = req("a", list(range(8)))
    admit(kv, a)                       # blocks 0, 1 cached
    kv.free(a)                         # free queue: 2, 1, 0
    c = req("c", list(range(100, 108)))
    admit(kv, c)                       # pops 2 and 1: block 1 loses a's second hash
    assert kv.block_pool.blocks[1].block_hash != kv.block_pool.blocks[0].block_hash
    hits, num_hit = kv.get_computed_blocks(req("d", list(range(9))))
    assert [h.block_id for h in hits] == [0] and num_hit == 4


def test_allocation_fails_without_change_when_hits_would_be_counted_twice():
    # 3 blocks; the hit block is free, so it cannot also serve as a fresh block.
    kv = KVCacheManager(3, BS, enable_caching=True)
    a = req("a", list(range(5)))
    admit(kv, a)
    kv.free(a)                         # block 0 cached and free; free = 2, 1, 0 ... all 3
    b = req("b", list(range(4)) + list(range(200, 209)))   # 13 tokens: hit 1 + needs 3 more
    hits, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 4
    before = (kv.block_pool.free_block_ids(), [x.ref_cnt for x in kv.block_pool.blocks])
    assert kv.allocate_slots(b, 9, hits) is None           # 3 needed > 3 free - 1 evictable hit
    assert (kv.block_pool.free_block_ids(), [x.ref_cnt for x in kv.block_pool.blocks]) == before
    assert "b" not in kv.req_to_blocks
    assert kv.allocate_slots(b, 8, hits) is not None       # 2 needed <= 2


def test_a_duplicate_block_is_cached_too_and_hits_come_from_the_first_copy_still_cached():
    kv = KVCacheManager(7, BS, enable_caching=True)
    pool = kv.block_pool
    a = req("a", list(range(8)))
    admit(kv, a)                                  # blocks 0, 1 cached
    b = req("b", list(range(8)))
    _, num_hit = admit(kv, b)                     # hit block 0; block 1's content recomputed
    assert num_hit == 4 and [x.block_id for x in kv.req_to_blocks["b"]] == [0, 2]
    original, dup = pool.blocks[1], pool.blocks[2]
    shared_hash = original.block_hash
    assert dup.block_hash == shared_hash          # vLLM 0.8.x keeps both copies
    assert list(pool.cached_block_hash_to_block[shared_hash]) == [1, 2]
    assert pool.get_cached_block(shared_hash) is original     # the first copy serves hits
    kv.free(a)                                    # a's block 1: free, still cached
    assert pool.free_block_ids() == [3, 4, 5, 6, 1]
    c = req("c", list(range(300, 320)))
    admit(kv, c, num_new=20)                      # pops 3, 4, 5, 6, 1: evicts copy 1 only
    assert original.block_hash != shared_hash                 # now caches c's content
    assert list(pool.cached_block_hash_to_block[shared_hash]) == [2]
    assert pool.get_cached_block(shared_hash) is dup          # the copy still cached
    assert consistency_errors_of(kv) == []


def consistency_errors_of(kv: KVCacheManager) -> list[str]:
    """Every cached block is listed under its hash, and only those."""
    pool = kv.block_pool
    listed = {(h, i) for h, copies in pool.cached_block_hash_to_block.items() for i in copies}
    cached = {(b.block_hash, b.block_id) for b in pool.blocks if b.block_hash is not None}
    return [] if listed == cached else [f"listed {listed - cached}, cached {cached - listed}"]


def test_preallocation_takes_the_profiles_extra_blocks_into_the_table():
    # vLLM 0.8.4 allocate_slots: ceil(64 / 4) = 16 extra blocks, capped by the
    # free blocks and by max_model_len's blocks per request (40 / 4 = 10).
    kv = KVCacheManager(30, BS, enable_caching=False, num_preallocate_tokens=64, max_model_len=40)
    a = req("a", list(range(6)))
    blocks, _ = admit(kv, a)
    assert [x.block_id for x in blocks] == list(range(10))    # 2 needed + 8 up to the cap
    a.append_output_token_id(6)
    assert kv.allocate_slots(a, 1) == []                      # a preallocated block serves it
    b = req("b", list(range(100, 105)))
    blocks, _ = admit(kv, b)
    assert len(blocks) == 10
    c = req("c", list(range(200, 205)))
    blocks, _ = admit(kv, c)
    assert len(blocks) == 10                                  # the 10 blocks left
    d = req("d", list(range(300, 305)))
    assert admit(kv, d)[0] is None                            # the fit check counts only the 2 needed


def test_preallocation_is_capped_by_the_free_blocks():
    kv = KVCacheManager(5, BS, enable_caching=False, num_preallocate_tokens=64, max_model_len=20)
    blocks, _ = admit(kv, req("a", list(range(6))))
    assert len(blocks) == 5


def test_drafts_are_not_cached():
    kv = KVCacheManager(8, BS, enable_caching=True)
    a = req("a", list(range(7)))
    admit(kv, a)
    a.append_output_token_id(7)                        # 8 known tokens, 7 computed
    a.spec_token_ids = [8, 9, 10, 11]
    assert kv.allocate_slots(a, 5, num_draft_tokens=4) is not None
    cached = [b.block_hash is not None for b in kv.req_to_blocks["a"]]
    assert cached == [True, True, False]               # block 2 would hold only drafts


def test_scheduler_pool_stays_consistent_under_preemption_and_prefix_hits():
    cfg = SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=4, max_model_len=32,
                          block_size=4, num_blocks=10, num_pipeline_stages=2)
    engine = Engine(Scheduler(cfg), ScriptedExecutor())
    for i in range(4):
        engine.add_request(Request(str(i), [1, 2, 3, 4, 5, 6, 7, 8, 9 + i],
                                   SamplingParams(max_tokens=12)))
    preempted = 0
    for step in range(500):
        engine.step()
        if engine.batch_queue:
            preempted += len(engine.batch_queue[-1][0].preempted_req_ids)
        assert consistency_errors(engine.scheduler) == [], step
        if not engine.has_unfinished_requests() and not engine.batch_queue:
            break
    assert not engine.has_unfinished_requests()
    assert preempted > 0
    assert leak_errors(engine.scheduler) == []
