"""vLLM 0.8.x caches blocks through a negative full-block count (seed 376
index 149, `--versions 0.8.5,0.8.4 --spec-tokens 3 --reuse-ids`, 0.8.4 sync).

r1 (2 tokens, blocks of 2) is preempted holding 3 drafts, which 0.8.x keeps;
re-admitted from 0 it is given its 2 tokens, and `KVCacheManager.allocate_slots`
(0.8.4 and 0.8.5, kv_cache_manager.py) counts `(0 + 2 - 3) // 2 = -1` full
blocks; `BlockPool.cache_full_blocks` caches `blocks[0:-1]`, the table's first
block, and the count -1 is recorded. r1's next re-admission hits those 2
tokens. The reference caches nothing for a count below the cached one; its
released 0.8.x profiles do as vLLM (reference/profiles.py
`caches_through_a_negative_count`).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flightcheck.reference import Request, SamplingParams
from flightcheck.reference.kv_cache_manager import KVCacheManager
from flightcheck.reference.profiles import get_profile, released_profile
from flightcheck.vllm.campaign import ReplayJob, compare_workload, replay_workload
from flightcheck.vllm.differential import classify, decisions, profile_for, read_trace

from .vllm_support import DATA, KeptCase, Workers, workers

pytestmark = pytest.mark.usefixtures("both_checkers")   # the slow replay checks its trace: both checkers compared

CASE = KeptCase(DATA / "hunt395" / "084_sync_negative_count_caches_the_first_block_seed376_149")


def _resumed_with_drafts(kv: KVCacheManager, num_tokens: int, num_drafts: int) -> Request:
    """A request of `num_tokens` known tokens resumed from 0 holding `num_drafts`."""
    request = Request("r1", list(range(100, 100 + num_tokens)), SamplingParams(max_tokens=8))
    request.spec_token_ids = tuple(range(num_drafts))
    assert kv.allocate_slots(request, num_tokens, num_draft_tokens=num_drafts) is not None
    return request


@pytest.mark.parametrize("negative_slice, cached", [(True, [True, False]), (False, [False, False])],
                         ids=["released-0.8.x-caches-all-but-the-last", "reference-caches-nothing"])
def test_a_negative_count_caches_the_table_but_its_last_block(negative_slice: bool, cached: list[bool]) -> None:
    # 0.8.4's preallocation gives the 2-token table a second block, as r1's [18, 19]
    kv = KVCacheManager(8, 2, True, num_preallocate_tokens=2, caches_through_a_negative_count=negative_slice)
    request = _resumed_with_drafts(kv, 2, 3)
    blocks = kv.req_to_blocks["r1"]
    assert len(blocks) == 2
    assert [b.block_hash is not None for b in blocks[:2]] == cached
    assert kv.num_cached_block.get("r1", 0) == (-1 if negative_slice else 0)


def test_blocks_past_the_known_tokens_are_not_cached() -> None:
    # 2 known tokens, a table of 4 blocks of 1 (2 lookahead slots): -1 reaches
    # blocks 0-2, block 2 holds no known token (vLLM would fail its assertion)
    kv = KVCacheManager(8, 1, True, caches_through_a_negative_count=True)
    request = Request("r1", [7, 8], SamplingParams(max_tokens=8))
    request.spec_token_ids = (1, 2, 3)
    assert kv.allocate_slots(request, 2, num_draft_tokens=3, num_lookahead_tokens=2) is not None
    blocks = kv.req_to_blocks["r1"]
    assert len(blocks) == 4 and kv.num_cached_block["r1"] == -1
    assert [b.block_hash is not None for b in blocks] == [True, True, False, False]


def test_only_the_released_0_8_x_profiles_slice() -> None:
    for name in ("vllm-0.8.4", "vllm-0.8.5"):
        assert released_profile(name).caches_through_a_negative_count
        assert not get_profile(name).caches_through_a_negative_count
    assert not released_profile("vllm-0.34").caches_through_a_negative_count


def test_the_kept_run_is_explained_and_the_released_reference_hits_what_vllm_hits() -> None:
    result, events = CASE.result(), read_trace(CASE.trace)
    assert result["exception"].endswith("assert num_new_blocks > 0")
    readmitted = [e for e in events if e["ev"] == "schedule" and e.get("batch")
                  and any(entry["req"] == "r1" and entry["start"] == 2 for entry in e["entries"])]
    assert readmitted and readmitted[0]["entries"][0]["cached"] == 2         # the block the slice cached
    comparison, ours = compare_workload(CASE.raw(), result, events, profile_for("0.8.4", False))
    assert comparison.explained, comparison.describe()
    assert comparison.deviation == "negative_count_caches_blocks", comparison.describe()
    theirs = decisions(events)
    assert (theirs[20][1][0][:5], theirs[27][1][0][4], ours[27][1][0][4]) == (("r1", 0, 2, True, 0), 2, 0)


def test_held_drafts_no_more_than_the_tokens_given_are_not_named_so() -> None:
    result, theirs = CASE.result(), decisions(read_trace(CASE.trace))
    ours = compare_workload(CASE.raw(), result, read_trace(CASE.trace), profile_for("0.8.4", False))[1]
    assert classify(result, theirs, ours, 27) == "negative_count_caches_blocks"
    truth = result["ground_truth"]
    two = {**truth, "drafts_held_at_admission": [{**item, "drafts": 2} for item in truth["drafts_held_at_admission"]]}
    assert classify({**result, "ground_truth": two}, theirs, ours, 27) != "negative_count_caches_blocks"


# --- on vLLM itself (slow)


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_0_8_4_caches_through_the_negative_count_and_the_differential_explains_it(running: Workers) -> None:
    raw = CASE.raw()
    replayed = replay_workload(running["0.8.4"], ReplayJob("0.8.4", False, 149, raw, 376))
    assert replayed.result["batches"] == CASE.result()["batches"]
    assert replayed.comparison is not None and replayed.comparison.explained, replayed.comparison.describe()
