"""Hunt seed 379 index 4 (`python -m flightcheck.vllm.campaign --versions
0.34.0,0.33.0 --all-features --spec-tokens 2 --lookahead --stages 1
--reuse-ids --seed 379`, sync, both releases; kept in
tests/data/vllm/hunt395): a check-trace miss, now a rejection.

Under the priority policy r1 (priority 0, the head) has 22 tokens and an
external hit offered asynchronously; its load needs 6 blocks of 4, and the
waiting loop admits an async load only into the free blocks less the
in-flight reservations and `_spec_decode_step_blocks` (cdiv(1 + k +
lookahead, block_size) = cdiv(3, 4) = 1; vLLM 0.33.0/0.34.0
`Scheduler.schedule`, the `load_kv_async` reservation, and
`KVCacheManager.allocate_slots(reserved_blocks=...)`). 6 usable blocks, all
free, leave 5: `allocate_slots` returns None and the loop `break`s, so r0, r2
and r3 behind it are never reached. Nothing runs, so the prefill cadence
(`prefill_schedule_interval` 4) defers nothing (`any(not r.is_prefill_chunk
for r in self.running)` is false): the idle is not the cadence's. Without
r1's abort vLLM would idle for ever: a vLLM bug, the class of vLLM #39734
(a request within max_model_len that the KV cache can never admit deadlocks
the scheduler), here made by the spec-decode margin of #57104 on top of the
reservation of #44560.

The spec's L2 (`spec/deadlock.py`) rejects the state after r1's arrival, and
the full replay (`check-trace --full`) did; the incremental checker took L2
after an arrival from L2 before it, on the ground that an arrival joins the
tail of `waiting`. Under the priority policy it joins at its rank
(`PriorityRequestQueue.add_request`), here at the head, so the shortcut
now applies only to a newcomer at the tail (verification/traces/
incremental.py `_arrival_behind_a_schedulable_queue`). Since the hunt over
seeds 417-423, L2 is judged after the last input of engine step 0 (r3's
arrival), the state vLLM's first `schedule()` call meets
(verification/traces/step_inputs.py), and the shortcut is not taken from
an arrival whose own L2 was left to the next input.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flightcheck.verification.traces.check import check_trace
from flightcheck.verification.traces.reading import read_trace_file

from .vllm_support import DATA, KeptCase, Workers, replay_kept_workload, workers

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

HEAD_NEVER_FITS = {version: KeptCase(DATA / "hunt395" /
                                     f"{tag}_sync_async_load_head_that_never_fits_beside_the_spec_margin_seed379_4")
                   for version, tag in (("0.34.0", "034"), ("0.33.0", "033"))}
VERSIONS = sorted(HEAD_NEVER_FITS)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_kept_trace_idles_behind_a_priority_head_whose_load_never_fits(version: str) -> None:
    events = read_trace_file(str(HEAD_NEVER_FITS[version].trace))
    config = events[0]
    assert (config["scheduling_policy"], config["usable_blocks"], config["block_size"]) == ("priority", 6, 4)
    assert (config["num_spec_tokens"], config["num_lookahead_tokens"], config["prefill_schedule_interval"]) == (1, 1, 4)
    r1 = events[2]
    assert (r1["ev"], r1["req"], r1["prompt_len"], r1["external_hit"], r1["load_async"]) == ("arrive", "r1", 22, 24, True)
    assert r1.get("priority", 0) < min(e["priority"] for e in events[1:5] if e["req"] != "r1")
    abort = events[5]
    assert (abort["ev"], abort["req"]) == ("abort", "r1")
    assert [e["ev"] for e in abort["empty_batches_before"]] == ["schedule", "complete"] * 2
    assert not any(load["req"] == "r1" for e in events for load in e.get("kv_loads", []))


@pytest.mark.parametrize("version", VERSIONS)
def test_check_trace_rejects_the_idle_the_first_schedule_call_meets_with_r1_at_the_head(version: str) -> None:
    # r1 goes to the head at line 3; L2 is judged of the state the first
    # schedule() call sees, after r3's arrival (line 5), the last input of
    # step 0 (verification/traces/step_inputs.py; seed 422 index 42 of the
    # hunt over seeds 417-423); the incremental checker takes no shortcut
    # from the owed arrivals before it
    result = check_trace(HEAD_NEVER_FITS[version].trace)
    assert (result.ok, result.property, result.event_index) == (False, "L2_no_deadlock", 4), result
    full = check_trace(HEAD_NEVER_FITS[version].trace, full=True)
    assert (full.ok, full.property, full.event_index) == (False, "L2_no_deadlock", 4), full


@pytest.mark.parametrize("version", VERSIONS)
def test_the_kept_ground_truth_calls_the_idle_a_stall(version: str) -> None:
    result = HEAD_NEVER_FITS[version].result()
    # from step 0: the arrivals' own step formed nothing, its schedule() having read them
    # (run_endings.py `IdleCount.quiet`; step 1 before seed 391 index 51)
    assert result["stalls"] == [{"step": 0, "until": 2, "unfinished": ["r0", "r1", "r2", "r3"]}]
    assert result["left_to_clients"] == [] and result["ending"] == "done"


# --- on vLLM itself (slow): the kept workload, the ground truth and check-trace together


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("version", VERSIONS)
def test_vllm_idles_behind_the_head_and_the_campaign_calls_it_a_real_bug(running: Workers, version: str) -> None:
    replayed = replay_kept_workload(running[version], HEAD_NEVER_FITS[version], version)
    assert replayed.result["stalls"] == HEAD_NEVER_FITS[version].result()["stalls"]
    assert replayed.category == "rejected, real bug", replayed.detail
    assert "L2_no_deadlock" in replayed.detail
