"""The lookahead admission livelock of the hunt over fresh seeds 364-395
(seed 379, `python -m flightcheck.vllm.campaign --versions 0.34.0,0.33.0
--all-features --spec-tokens 2 --lookahead --stages 1 --reuse-ids --seed
379`): index 32 on 0.34.0 sync and async, index 84 on 0.33.0 sync and async.

vLLM 0.33.0/0.34.0 `Scheduler.schedule`'s waiting loop admits a request
through `KVCacheManager.allocate_slots(..., full_sequence_must_fit=True)`
(`scheduler_reserve_full_isl`), whose gate counts the blocks of the whole
sequence, `request.num_tokens`, and no lookahead slots; each chunk's own
allocation asks `num_lookahead_tokens` slots past it. In index 32 r4 (15
tokens, blocks of 8, 2 lookahead slots) fits 2 blocks, which the gate finds
beside r2, a streaming session parked holding the rest; its last chunk asks
14 + 1 + 2 = 17 slots, 3 blocks, the running loop finds none and preempts
r4 (itself: nothing else runs), and the next step admits it again past its
8-token prefix hit. Nothing is appended between: the same state comes back
every 6 steps to the step limit. Index 84 (0.33.0, prefix caching off): r2,
24 tokens, 3 blocks, 4 with its lookahead slot, recomputed from 0 each time.

The ground truth names it (ground_truth.py `_fc_check_livelock`: a request
preempted 3 times in a row from one state of every request). check-trace
cannot: its L2 (spec/deadlock.py `l2_no_deadlock`) counts a preemption as
moving on, and every step is one the spec takes, so the run stays a miss
whose trace has no end event ("liveness at the end" unchecked).

The kept workloads are the campaign's with `max_steps` cut from 3000 to 120
(the loop is found at step 83 and 99; the step limit then ends the run).
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from flightcheck.verification.traces.check import check_trace
from flightcheck.verification.traces.reading import read_trace_file
from flightcheck.vllm.campaign import ReplayJob, replay_workload, verdict
from flightcheck.vllm.ground_truth import LIVELOCK_REPEATS, GroundTruthMixin, Observations
from flightcheck.vllm.replay import findings

from .vllm_support import DATA, KeptCase, Workers, workers

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

HUNT = DATA / "hunt395"
LIVELOCK = {"0.34.0": KeptCase(HUNT / "034_sync_lookahead_admission_livelock_seed379_32"),
            "0.33.0": KeptCase(HUNT / "033_sync_lookahead_admission_livelock_seed379_84")}
# (request, tokens, blocks without and with the lookahead slots, the step the ground truth names it)
LOOPS = {"0.34.0": ("r4", 15, 2, 3, 83), "0.33.0": ("r2", 24, 3, 4, 99)}


def _preemptions(events: list[dict[str, Any]], req: str) -> list[int]:
    return [i for i, e in enumerate(events) if e["ev"] == "schedule" and req in e.get("preempted", [])]


def test_the_kept_trace_loops_admit_prefill_preempt_with_nothing_appended() -> None:
    events = read_trace_file(str(LIVELOCK["0.34.0"].trace))
    config = events[0]
    assert (config["block_size"], config["usable_blocks"], config["num_lookahead_tokens"]) == (8, 5, 2)
    preempted = _preemptions(events, "r4")
    assert len(preempted) >= 8
    for before, after in zip(preempted[2:], preempted[3:]):
        between = events[before + 1:after]
        entries = [entry for e in between if e["ev"] == "schedule" for entry in e["entries"]]
        assert {entry["req"] for entry in entries} == {"r4"}
        assert (entries[0]["start"], entries[0]["cached"], entries[0]["block_ids"]) == (8, 8, [1, 4])
        assert entries[-1]["start"] + entries[-1]["n"] == 14        # the last chunk, 1 token + 2 slots, never runs
        assert all(not tokens for e in between if e["ev"] == "complete" for tokens in e["tokens"].values())
        assert not [e for e in between if e["ev"] in ("arrive", "input", "abort", "finish", "reset", "pause")]
    assert events[-1]["ev"] == "schedule" and events[-1]["preempted"] == ["r4"]    # no end event


@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
def test_check_trace_accepts_the_loop_and_leaves_liveness_unchecked(version: str) -> None:
    result = check_trace(LIVELOCK[version].trace)
    assert result.ok, result
    assert "liveness at the end (the trace has no end event)" in result.unchecked


@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
def test_the_ground_truth_names_the_livelock_and_the_lookahead_block(version: str) -> None:
    case = LIVELOCK[version]
    result = case.result()
    req, tokens, blocks, with_lookahead, step = LOOPS[version]
    [loop] = result["ground_truth"]["admission_livelocks"]
    assert (loop["req"], loop["num_tokens"], loop["repeats"], loop["step"]) == (req, tokens, LIVELOCK_REPEATS, step)
    assert (loop["blocks_of_sequence"], loop["blocks_with_lookahead"], loop["free_blocks"]) \
        == (blocks, with_lookahead, blocks)          # the sequence fits what is free, its lookahead slots do not
    assert result["ending"] == "step_limit"
    named = findings(result)
    assert named[0].startswith(f"a livelock: {req} was preempted 3 times in a row")
    category, detail = verdict(result, check_trace(case.trace).to_json())
    assert category == "accepted, MISSED bug" and "(named unchecked): a livelock" in detail


class _Scheduler(GroundTruthMixin):
    """GroundTruthMixin's livelock check on a stand-in of vLLM's state."""

    def __init__(self) -> None:
        self.flightcheck_step = 0
        self.flightcheck_observations = Observations()
        self._fc_preempted_from = {}
        self.num_lookahead_tokens = 2
        self.cache_config = SimpleNamespace(block_size=8)
        self.kv_cache_manager = SimpleNamespace(block_pool=SimpleNamespace(get_num_free_blocks=lambda: 2))
        self.requests = {"r4": _request(15), "r2": _request(20, "WAITING_FOR_STREAMING_REQ")}

    def preempt(self, req_id: str) -> None:
        self.flightcheck_step += 6
        self._fc_check_livelock(req_id)


def _request(num_tokens: int, status: str = "PREEMPTED") -> SimpleNamespace:
    return SimpleNamespace(num_tokens=num_tokens, num_computed_tokens=0, status=SimpleNamespace(name=status))


def test_preemptions_from_one_state_are_named_once_at_the_third() -> None:
    scheduler = _Scheduler()
    for _ in range(LIVELOCK_REPEATS - 1):
        scheduler.preempt("r4")
    assert scheduler.flightcheck_observations.admission_livelocks == []
    for _ in range(3):
        scheduler.preempt("r4")
    [loop] = scheduler.flightcheck_observations.admission_livelocks
    assert (loop["step"], loop["blocks_of_sequence"], loop["blocks_with_lookahead"]) == (18, 2, 3)


def test_a_token_appended_between_preemptions_starts_the_count_again() -> None:
    scheduler = _Scheduler()
    for _ in range(4):
        scheduler.preempt("r4")
        scheduler.requests["r4"].num_tokens += 1             # progress: a token sampled before each preemption
    scheduler.preempt("r4")
    scheduler.requests["r2"].status.name = "WAITING"       # the session's input came: another state
    scheduler.preempt("r4")
    assert scheduler.flightcheck_observations.admission_livelocks == []
    assert "admission_livelocks" not in scheduler.flightcheck_observations.to_json()


# --- on vLLM itself (slow): the kept workloads, the ground truth and check-trace together


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
def test_vllm_loops_on_the_lookahead_block_and_the_ground_truth_names_it(running: Workers, version: str) -> None:
    case = LIVELOCK[version]
    raw = case.raw()
    replayed = replay_workload(running[version], ReplayJob(version, False, 0, raw, raw.get("seed", 0)))
    kept = case.result()
    assert replayed.result["batches"] == kept["batches"] and replayed.result["ending"] == "step_limit"
    assert replayed.result["ground_truth"]["admission_livelocks"] == kept["ground_truth"]["admission_livelocks"]
    # check-trace accepts every step (its L2 counts a preemption as moving on): a miss, named unchecked
    assert replayed.category == "accepted, MISSED bug", replayed.detail
    assert "a livelock" in replayed.detail
