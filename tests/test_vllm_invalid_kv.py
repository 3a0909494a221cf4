"""KV a load reported invalid, computed on (KV7; ground truth
`kv_computed_on_invalid_kv`; docs/vllm-kv-connector-findings.md, finding 7).

Campaign `--versions 0.34.0,0.33.0 --kv-connector --async --spec-tokens 3
--stages 2 --workloads 100 --reuse-ids --seed 362` index 27 (kept in
tests/data/vllm/invalid_kv): r0's sync load (4 external tokens) writes
prefix blocks 16 and 17; r0 is aborted with the batch in flight; r5 and r1
take 16 and 17 as a prefix hit and park for async loads; r0's load is
reported invalid from block 0. vLLM 0.33.0/0.34.0 `_handle_invalid_blocks`
scans the parked loads with `evict_blocks=False`: r5, met first, marks
both blocks and is rolled back to 0; r1 meets them marked and keeps its 18
computed tokens ("this request can still consider this block as
computed"; "Async loading does not yet support block sharing"); under the
recompute policy nothing leaves the prefix cache. r3 then takes 16 and 17
as a prefix hit, r5 (freed by `_update_waiting_for_remote_kv`) takes them
back as one, r1 runs @17 on them: nobody ever recomputes them (vLLM
#37827, closed unmerged). check-trace rejected the run with KV3 at r1's
entry and the ground truth called it correct: a false rejection. Now both
name the first read, r3's hit (KV7 at trace line 34).

The hand-written minimal runs (one stage, no drafts; r0's sync load of a
4-token prefix fails after r0's abort): with r1 parked on the same prefix,
rolled back to 0, r2 arriving computes @4 on the invalid blocks, then r1
(`computed_on_invalid_kv`); with no holder, vLLM's scan finds nobody
affected and returns, the blocks stay cached and r2 computes on them
(`stale_hit_after_aborted_loader`: two requests, the smallest).

A sync sharer read before its chunked marker rewrites (campaign `--versions
0.34.0 --all-features --spec-tokens 2 --lookahead --stages 1 --reuse-ids
--seed 379 --workloads 120` index 44, sync and async, kept as
`sharer_reads_before_chunked_marker_rewrites_seed379_44`): r0's sync load
of the 8-token prefix (blocks 1, 2) and r4's prefix hit on them share batch
1; the load fails from block 0. `_update_requests_with_invalid_blocks`
rolls r0 back to 0 (it marks both blocks) and r4 keeps its 8 cached tokens
("will be recomputed by them"), but `long_prefill_token_threshold` 3
chunks r0: batch 2 recomputes r0 @0+3 and runs r4 @8+3 on block 2, which r0
rewrites only in batch 3. The ground truth named it; check-trace skipped
every rolled-back request at KV7 (leaving it to KV3), r4 among them,
though the spec rolls r4 back as vLLM does: a miss. Now KV7 at line 12.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flightcheck.spec.kv_invalid import kv7_reads, rewritten
from flightcheck.verification.traces.check import check_trace
from flightcheck.vllm.differential import profile_for
from flightcheck.vllm.kv_invalid_recording import invalid_reads, rewritten_blocks

from .vllm_support import DATA, KeptCase, Workers, replay_kept_case, replay_kept_async, workers

pytestmark = pytest.mark.usefixtures("both_checkers")   # the checks read traces: both checkers compared

CASES = DATA / "invalid_kv"
SEED362 = "async_sharers_compute_on_invalid_kv_seed362_27"
MINIMAL = "computed_on_invalid_kv"
STALE_HIT = "stale_hit_after_aborted_loader"
KV7 = "KV7_no_compute_on_invalid_kv"
SEED379 = "sharer_reads_before_chunked_marker_rewrites_seed379_44"


@pytest.mark.parametrize("release", ["034", "033"])
def test_check_trace_rejects_the_first_hit_on_the_invalid_blocks_not_the_sharers_later_entry(release: str) -> None:
    incremental = check_trace(CASES / f"{release}_{SEED362}.jsonl")
    full = check_trace(CASES / f"{release}_{SEED362}.jsonl", full=True)
    assert (incremental.ok, incremental.line, incremental.property) == (False, 34, KV7), incremental.message
    assert '"r3" is scheduled @4+4' in incremental.message   # r3's hit, before r5's and r1's entries (line 57)
    # the blocks by the trace's ids, as the ground truth names them ("r3 was scheduled @4 on blocks [16, 17]")
    assert "on blocks [16, 17] (the trace's ids)" in incremental.message
    assert incremental.to_json() == full.to_json()


@pytest.mark.parametrize("release", ["034", "033"])
@pytest.mark.parametrize("stem,line", [(MINIMAL, 11), (STALE_HIT, 9)])
def test_check_trace_rejects_the_minimal_runs_at_the_new_requests_hit(release: str, stem: str, line: int) -> None:
    result = check_trace(CASES / f"{release}_{stem}.jsonl")
    assert (result.ok, result.line, result.property) == (False, line, KV7), result.message
    assert '"r2" is scheduled @4+4' in result.message


@pytest.mark.parametrize("mode", ["", "async_"])
def test_check_trace_rejects_a_rolled_back_sharer_read_before_its_chunked_marker_rewrites(mode: str) -> None:
    trace = CASES / f"034_{mode}{SEED379}.jsonl"
    incremental, full = check_trace(trace), check_trace(trace, full=True)
    assert (incremental.ok, incremental.line, incremental.property) == (False, 12, KV7), incremental.message
    assert '"r4" is scheduled @8+3' in incremental.message      # batch 2: r0 @0+3 rewrites block 1, not 2
    assert incremental.to_json() == full.to_json()


def test_a_batch_that_recomputes_the_block_may_read_it() -> None:
    """vLLM's sync sharer: the marking request recomputes the block in the
    same batch as the sharer that keeps it computed (each layer writes the
    batch's KV before it attends): no breach. Without the marker: one."""
    loader, sharer = (0, 0, 4, (7, 8), 0), (1, 4, 2, (7, 8, 9), 0)
    assert rewritten([loader], 2) == {7, 8}
    assert kv7_reads(frozenset({7}), [loader, sharer], 2) == []
    assert kv7_reads(frozenset({7}), [sharer], 2) == [(1, [7])]
    assert kv7_reads(frozenset({9}), [sharer], 2) == []           # its own block past its start: written, not read


def test_a_sync_load_writes_the_blocks_it_brings() -> None:
    """A block popped fresh for a sync load (its stale label still on it
    when the failure was reported) is written by the load, not read stale."""
    loading = (0, 4, 2, (7, 8, 9), 4)
    assert rewritten([loading], 2) == {7, 8, 9}
    assert kv7_reads(frozenset({7}), [loading], 2) == []
    assert kv7_reads(frozenset({7}), [(0, 4, 2, (7, 8, 9), 2)], 2) == [(0, [7])]


def test_the_recorders_watch_reads_the_same_rule() -> None:
    entries = [{"req": "a", "start": 0, "n": 4}, {"req": "b", "start": 4, "n": 2}]
    tables = {"a": [7, 8], "b": [7, 8, 9]}
    assert rewritten_blocks(entries, tables, 2) == {7, 8, 9}           # b computes block 9 from its start
    assert invalid_reads(entries, tables, 2, {7}) == []
    assert invalid_reads(entries[1:], tables, 2, {7, 8}) == [("b", 4, [7, 8])]
    assert invalid_reads([{"req": "b", "start": 4, "n": 2, "external": 4}], tables, 2, {7, 8}) == []


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
def test_vllm_computes_on_the_invalid_blocks_and_the_ground_truth_names_it(running: Workers, version: str,
                                                                           tmp_path) -> None:
    case = KeptCase(CASES / f"{version.replace('.', '')[:3]}_{SEED362}")
    _, (category, detail) = replay_kept_case(running[version], case, profile_for(version, True),
                                             tmp_path / "replayed.jsonl")
    assert category == "rejected, real bug", detail
    assert KV7 in detail and "r3 was scheduled @4 on blocks [16, 17]" in detail


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
@pytest.mark.parametrize("stem,readers", [(MINIMAL, ["r2", "r1"]), (STALE_HIT, ["r2"])])
def test_vllm_computes_the_minimal_runs_on_the_invalid_blocks(running: Workers, version: str, stem: str,
                                                             readers: list[str], tmp_path) -> None:
    case = KeptCase(CASES / f"{version.replace('.', '')[:3]}_{stem}")
    result, _ = replay_kept_async(running[version], case.raw(), case.trace, tmp_path / "replayed.jsonl")
    reads = result["ground_truth"]["kv_computed_on_invalid_kv"]
    assert [(read["req"], read["start"], read["blocks"]) for read in reads] == [(r, 4, [1, 2]) for r in readers]


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("mode", ["", "async_"])
def test_vllm_runs_the_rolled_back_sharer_on_the_block_its_marker_has_not_rewritten(running: Workers, mode: str,
                                                                                   tmp_path) -> None:
    from flightcheck.vllm import ASYNC_RECORDER
    from flightcheck.vllm.campaign import check_verdict, verdict
    from flightcheck.vllm.differential import decisions, read_trace

    case = KeptCase(CASES / f"034_{mode}{SEED379}")
    trace = tmp_path / "replayed.jsonl"
    result = running["0.34.0"].replay(case.raw(), trace=str(trace), scheduler_cls=ASYNC_RECORDER if mode else None)
    assert decisions(read_trace(trace)) == decisions(read_trace(case.trace))
    reads = result["ground_truth"]["kv_computed_on_invalid_kv"]
    assert [(read["req"], read["start"], read["blocks"]) for read in reads] == [("r4", 8, [2])]
    category, detail = verdict(result, check_verdict(trace))
    assert category == "rejected, real bug" and KV7 in detail, detail
