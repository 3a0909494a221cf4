"""A prefix hit on KV no batch wrote, on vLLM's real scheduler: the
priority policy preempts a request it already scheduled in the same step
(ground truth `hits_on_unwritten_kv`; docs/vllm-unwritten-kv-findings.md,
finding 1; kept in tests/data/vllm/unwritten).

Hand-written (four stages, blocks of 8, `long_prefill_token_threshold` 6,
5 usable blocks, prefix `p` of 16 tokens): r0 (priority 2, 18 tokens with
`p`) is chunked 6 at a time; r2 (priority 1, 22 tokens with `p`) takes r0's
first block as a prefix hit. At step 3 vLLM 0.33.0/0.34.0 `Scheduler.
schedule`'s running loop gives r0 its chunk 12+6: `KVCacheManager.
allocate_slots` caches its full blocks through `min(12 + 6, num_tokens)`
= 18 tokens, so block 3 (tokens 8-15, of which batch 2 wrote 8-11) gets
its hash; r2's allocation then finds no block and the priority branch
preempts r0, the lowest priority, removing the chunk it had just scheduled
(`scheduled_running_reqs.remove(preempted_req)`, `num_scheduled_tokens.pop`).
`_preempt_request` frees r0's blocks with their hashes. At step 20 (21
async) r0 is admitted again with a 16-token prefix hit on blocks 2 and 3:
tokens 12-15 of block 3 were never computed. check-trace rejects every
trace at that schedule event (KV8_no_hit_on_unwritten_kv: the spec's
history variable `State.unwritten_kv` holds block 3 from the hand-back of
step 3 on; spec/kv_unwritten.py, verification/traces/unwritten.py), with
both checkers.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flightcheck.verification.traces.check import check_trace
from flightcheck.vllm.replay import findings

from .vllm_support import DATA, KeptCase, Workers, workers

pytestmark = pytest.mark.usefixtures("both_checkers")   # the checks read traces: both checkers compared

CASES = DATA / "unwritten"
STEM = "priority_preempts_a_scheduled_chunk"
RUNS = [("033", "sync", 20), ("033", "async", 21), ("034", "sync", 20), ("034", "async", 21)]


def hit_of(result: dict) -> list[tuple]:
    return [(hit["req"], hit["hit"], hit["block"], hit["written"], hit["cached_by"]["req"], hit["cached_by"]["step"],
             hit["step"]) for hit in result["ground_truth"]["hits_on_unwritten_kv"]]


@pytest.mark.parametrize("release,mode,step", RUNS)
def test_the_kept_run_names_r0s_hit_on_block_3_which_r0_cached_for_the_chunk_preempted_with_it(
        release: str, mode: str, step: int) -> None:
    result = KeptCase(CASES / f"{release}_{mode}_{STEM}").result()
    assert hit_of(result) == [("r0", 16, 3, 4, "r0", 3, step)]
    cached = result["ground_truth"]["blocks_cached_unwritten"]
    assert [(c["block"], c["written"], c["cached_by"]) for c in cached] == [(3, 4, {"req": "r0", "step": 3,
                                                                                     "index": 1})]
    assert any("hit_on_unwritten_kv" in finding for finding in findings(result))


@pytest.mark.parametrize("release,mode,step", RUNS)
def test_the_trace_shows_the_chunk_unscheduled_and_the_hit(release: str, mode: str, step: int) -> None:
    import json

    events = [json.loads(line) for line in KeptCase(CASES / f"{release}_{mode}_{STEM}").trace.read_text().splitlines()]
    third = next(e for e in events if e.get("ev") == "schedule" and e.get("step") == 3)
    assert third["preempted"] == ["r0"] and [e["req"] for e in third["entries"]] == ["r2"]
    readmitted = next(e for e in events if e.get("ev") == "schedule" and e.get("step") == step)
    assert [(e["start"], e["cached"], e["block_ids"][:2]) for e in readmitted["entries"] if e["req"] == "r0"] == [
        (16, 16, [2, 3])]


@pytest.mark.parametrize("release,mode,step", RUNS)
def test_check_trace_rejects_it_at_the_hit_kv8(release: str, mode: str, step: int) -> None:
    import json

    trace = KeptCase(CASES / f"{release}_{mode}_{STEM}").trace
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    hit_line = next(i for i, e in enumerate(lines, start=1) if e.get("ev") == "schedule" and e.get("step") == step)
    result = check_trace(trace)
    assert not result.ok
    assert (result.property, result.line, result.event) == ("KV8_no_hit_on_unwritten_kv", hit_line, "schedule")
    assert '"r0" is scheduled @16+2 with a prefix hit on blocks [3]' in result.message, result.message


# --- on vLLM itself (slow)


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("release,mode,step", RUNS)
def test_vllm_hits_the_unwritten_block_again_and_check_trace_rejects_it(running: Workers, release: str, mode: str,
                                                                      step: int, tmp_path) -> None:
    from flightcheck.vllm import ASYNC_RECORDER
    from flightcheck.vllm.campaign import check_verdict, verdict
    from flightcheck.vllm.differential import decisions, read_trace

    case = KeptCase(CASES / f"{release}_{mode}_{STEM}")
    trace = tmp_path / "replayed.jsonl"
    version = {"033": "0.33.0", "034": "0.34.0"}[release]
    result = running[version].replay(case.raw(), trace=str(trace),
                                     scheduler_cls=ASYNC_RECORDER if mode == "async" else None)
    assert decisions(read_trace(trace)) == decisions(read_trace(case.trace))
    assert hit_of(result) == [("r0", 16, 3, 4, "r0", 3, step)]
    category, detail = verdict(result, check_verdict(trace))
    assert category == "rejected, real bug" and detail.endswith("): rejected, KV8_no_hit_on_unwritten_kv"), detail
    assert "prefix hit of 16 tokens takes block 3" in detail, detail
