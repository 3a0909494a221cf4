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
preempted twice in a row from one state of every request, the batches in
flight, the queues and the free blocks). check-trace's
L2 (spec/deadlock.py `l2_no_deadlock`) counts a preemption as moving on,
and every step is one the spec takes; its progress rule
(verification/traces/lasso.py, L4_no_livelock) rejects the run where the
spec's whole state after a preemption comes back with nothing from the
environment between: line 99 (the state after line 94's, one round of 5
lines) on 0.34.0, line 125 on 0.33.0 (after line 95's: two rounds of 15
lines, since the free queue hands r2 its blocks in the other order every
other round).

The kept workloads are the campaign's with `max_steps` cut from 3000 to 120
(the loop is found at step 83 and 99; the step limit then ends the run);
the async traces are those workloads replayed with async scheduling
(`with_async_scheduling`; named at step 96 and 128, rejected at lines 107
and 138, with a batch in flight at each preemption).
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from flightcheck.verification.traces.check import check_events, check_trace
from flightcheck.verification.traces.lasso import quiet_completion
from flightcheck.verification.traces.reading import read_trace_file
from flightcheck.verification.traces.stream import check_lines
from flightcheck.vllm.campaign import check_verdict, verdict
from flightcheck.vllm.ground_truth import LIVELOCK_REPEATS, GroundTruthMixin, Observations
from flightcheck.vllm.livelock_recording import loud_event
from flightcheck.vllm.replay import findings

from .vllm_support import DATA, KeptCase, Workers, replay_kept_workload, workers

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

HUNT = DATA / "hunt395"
LIVELOCK = {"0.34.0": KeptCase(HUNT / "034_sync_lookahead_admission_livelock_seed379_32"),
            "0.33.0": KeptCase(HUNT / "033_sync_lookahead_admission_livelock_seed379_84"),
            "0.34.0-async": KeptCase(HUNT / "034_async_lookahead_admission_livelock_seed379_32"),
            "0.33.0-async": KeptCase(HUNT / "033_async_lookahead_admission_livelock_seed379_84")}
CASES = list(LIVELOCK)
# (request, tokens, blocks without and with the lookahead slots, the step the ground truth names it)
LOOPS = {"0.34.0": ("r4", 15, 2, 3, 77), "0.33.0": ("r2", 24, 3, 4, 83),
         "0.34.0-async": ("r4", 15, 2, 3, 90), "0.33.0-async": ("r2", 24, 3, 4, 112)}


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


# the lasso check-trace names: (request, the line of the first state, the line it comes back, schedule events);
# sync, a round earlier since the lasso reads no flag `is_prefill_chunk` of a request not running (lasso.py
# `_recurs`, the hunt over seeds 417-423: the first round's victim had sampled, the later ones had not)
LASSOS = {"0.34.0": ("r4", 89, 94, 3), "0.33.0": ("r2", 80, 110, 16),
          "0.34.0-async": ("r4", 102, 107, 3), "0.33.0-async": ("r2", 108, 138, 16)}


@pytest.mark.parametrize("case", CASES)
def test_check_trace_rejects_the_loop_where_the_lasso_closes(case: str) -> None:
    req, first, again, calls = LASSOS[case]
    result = check_trace(LIVELOCK[case].trace)               # both checkers, the fast path and the stream
    assert not result.ok
    assert (result.property, result.line, result.event) == ("L4_no_livelock", again, "schedule")
    assert f"after line {first}'s preemption comes back at line {again} ({again - first} lines, {calls} " \
           f"schedule events later)" in result.message
    assert f'"{req}" is scheduled and preempted round this lasso for ever' in result.message
    events = read_trace_file(str(LIVELOCK[case].trace))
    assert events[again - 1]["preempted"] == events[first - 1]["preempted"] == [req]
    # keep going: named once, not again each round (until something from the environment comes)
    *found, final = check_lines(LIVELOCK[case].trace.read_text().splitlines(), keep_going=True)
    assert [(v.result.property, v.result.line) for v in found] == [("L4_no_livelock", again)]
    assert final.violations == 1


@pytest.mark.parametrize("name", CASES)
def test_the_ground_truth_names_the_livelock_and_the_lookahead_block(name: str) -> None:
    case = LIVELOCK[name]
    result = case.result()
    req, tokens, blocks, with_lookahead, step = LOOPS[name]
    [loop] = result["ground_truth"]["admission_livelocks"]
    assert (loop["req"], loop["num_tokens"], loop["repeats"], loop["step"]) == (req, tokens, LIVELOCK_REPEATS, step)
    assert (loop["blocks_of_sequence"], loop["blocks_with_lookahead"], loop["free_blocks"]) \
        == (blocks, with_lookahead, blocks)          # the sequence fits what is free, its lookahead slots do not
    assert result["ending"] == "step_limit"
    named = findings(result)
    assert named[0].startswith(f"a livelock: {req} was preempted 2 times in a row")
    category, detail = verdict(result, check_verdict(case.trace))     # the campaign's verdict (stream.py)
    assert category == "rejected, real bug" and detail.endswith("rejected, L4_no_livelock"), detail


# Seed 388 index 43 (`--all-features --spec-tokens 1 --lookahead --stages 1 --reuse-ids`, 0.34.0 and
# 0.33.0 sync): the same gate, ended by the clients after two rounds. r2 (7 tokens) is admitted into the
# one free block (7 tokens fit it; 6 + 1 + 2 lookahead slots do not), prefills 6 and is preempted, from
# the same state at lines 35 and 38, beside two sessions parked on the other 7 blocks; their clients end
# them at lines 41 and 44, and r2 runs. check-trace names the lasso at line 38, and so does the ground
# truth at that preemption (step 31), since it asks one recurrence; asking 3 preemptions in a row (its
# state at line 32's differs: r4 still ran), it named nothing, and the campaign counted a false rejection.
LOOP_ENDED = KeptCase(HUNT / "034_sync_lookahead_loop_ended_by_the_clients_seed388_43")


def test_a_loop_the_clients_end_after_two_rounds_is_named_by_both() -> None:
    result = check_trace(LOOP_ENDED.trace)
    assert (result.property, result.line) == ("L4_no_livelock", 38)
    assert "after line 35's preemption comes back at line 38" in result.message and '"r2"' in result.message
    assert '"r2":RUNN c=6/7 o=1 b=[1]' in result.state_before and "free=[]" in result.state_before
    events = read_trace_file(str(LOOP_ENDED.trace))
    assert [i + 1 for i, e in enumerate(events) if e["ev"] == "input" and e.get("end_of_session")] == [41, 44]
    assert _preemptions(events, "r2") == [31, 34, 37]        # lines 32, 35, 38
    kept = LOOP_ENDED.result()
    [loop] = kept["ground_truth"]["admission_livelocks"]
    assert (loop["req"], loop["step"], loop["num_tokens"], loop["blocks_of_sequence"],
            loop["blocks_with_lookahead"], loop["free_blocks"]) == ("r2", 31, 7, 1, 2, 1)
    assert kept["ending"] == "done" and findings(kept)[0].startswith("a livelock: r2 was preempted 2 times")
    assert verdict(kept, check_verdict(LOOP_ENDED.trace)) == ("rejected, real bug",
                                                             "bug (a livelock: r2 was preempted 2 times in a row "
                                                             "from one state): rejected, L4_no_livelock")


# --- the rule on a hand-written minimal lasso (vLLM 0.34's gate, no session: a pool of 2 blocks)

# "a", 15 tokens, fits the 2 blocks of the pool by the admission gate (`full_sequence_must_fit`), not
# with the 2 lookahead slots of its last chunk (12 + 3 + 2 = 17 slots, 3 blocks of 8): it prefills 12,
# is preempted, and is admitted again from 0 (prefix caching off). (vLLM itself refuses a max_model_len
# its pool cannot hold at start-up; the spec takes it, which makes the smallest lasso.)
POOL_OF_TWO = {"ev": "config", "num_stages": 1, "max_num_batched_tokens": 4, "max_num_seqs": 2,
               "block_size": 8, "num_blocks": 3, "usable_blocks": 2, "max_model_len": 32,
               "num_spec_tokens": 2, "num_lookahead_tokens": 2, "prefix_caching": False,
               "vllm_version": "0.34.0", "eos_token_id": 2}


def _round(batch: int) -> list[dict[str, Any]]:
    """One round of the loop: 3 chunks of 4 that sample nothing, then the preemption (7 lines)."""
    chunks: list[dict[str, Any]] = []
    for i, start in enumerate((0, 4, 8)):
        chunks += [{"ev": "schedule", "batch": batch + i, "entries": [{"req": "a", "start": start, "n": 4}]},
                   {"ev": "complete", "batch": batch + i, "tokens": {"a": []}}]
    return chunks + [{"ev": "schedule", "batch": None, "entries": [], "preempted": ["a"]}]


def _rounds(count: int, aside: dict[int, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The config, a's arrival and `count` rounds (their preemptions on lines 9, 16, 23, ...), with
    `aside[k]`, an event of the environment, after the first chunk of round k."""
    events = [POOL_OF_TWO, {"ev": "arrive", "req": "a", "prompt_len": 15, "max_tokens": 4}]
    for k in range(count):
        this = _round(1 + 3 * k)
        if aside and k in aside:
            this.insert(2, aside[k])
        events += this
    return events


def test_a_state_that_comes_back_with_nothing_between_is_a_lasso() -> None:
    result = check_events(_rounds(3))
    assert not result.ok and (result.property, result.line) == ("L4_no_livelock", 23)
    # (the free queue hands "a" its two blocks in the other order every other round: 2 rounds, 14 lines)
    assert "after line 9's preemption comes back at line 23 (14 lines, 8 schedule events later)" in result.message
    assert '"a" is scheduled and preempted round this lasso for ever' in result.message
    assert check_events(_rounds(3)[:-1]).ok                   # one event short of the lasso: legal


def test_an_event_of_the_environment_between_starts_again() -> None:
    unknown_abort = {"ev": "abort", "req": "b"}               # the client's, a no-op on the state
    result = check_events(_rounds(3, {1: unknown_abort}))
    assert result.ok, result
    assert "liveness at the end (the trace has no end event)" in result.unchecked
    # quiet again after it: the lasso closes two rounds after the first preemption past it (line 17)
    result = check_events(_rounds(4, {1: unknown_abort}))
    assert (result.property, result.line) == ("L4_no_livelock", 31)
    assert "after line 17's preemption comes back at line 31" in result.message


def test_a_loop_while_a_grammar_compiles_waits_on_the_environment() -> None:
    events = _rounds(4)
    assert check_events(events).property == "L4_no_livelock"
    # "b"'s grammar compiles all along (no grammar_compiled): its backend's event may still change the
    # state, as a KV transfer's report would (spec/deadlock.py waits_on_environment), so no lasso
    events[0] = {**POOL_OF_TWO, "structured_output": True}
    events.insert(2, {"ev": "arrive", "req": "b", "prompt_len": 2, "max_tokens": 1, "structured": True})
    result = check_events(events)
    assert result.ok, result


def test_only_a_completion_that_applies_a_token_is_loud() -> None:
    assert quiet_completion({"ev": "complete", "batch": 3, "tokens": {"a": [], "b": []}})
    assert quiet_completion({"ev": "complete", "batch": 3})
    assert quiet_completion({"ev": "complete", "batch": 3, "tokens": {"a": []}, "stale": ["a"]})   # vLLM's count
    # a dropped token is applied to nothing, drafts proposed are state (tests/test_vllm_hunt409_cases.py)
    assert quiet_completion({"ev": "complete", "batch": 3, "tokens": {"a": [7]}, "dropped": ["a"]})
    assert quiet_completion({"ev": "complete", "batch": 3, "tokens": {"a": []}, "next_drafts": {"a": 2}})
    for loud in ({"tokens": {"a": [], "b": [7]}}, {"tokens": {"a": [7], "b": [7]}, "dropped": ["a"]}):
        assert not quiet_completion({"ev": "complete", "batch": 3, **loud}), loud


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
        self.waiting, self.running = [self.requests["r4"]], []    # the queues the state reads, by request_id

    def preempt(self, req_id: str) -> None:
        self.flightcheck_step += 6
        self._fc_check_livelock(req_id)


def _request(num_tokens: int, status: str = "PREEMPTED") -> SimpleNamespace:
    return SimpleNamespace(request_id=f"{num_tokens} tokens", num_tokens=num_tokens, num_computed_tokens=0,
                           status=SimpleNamespace(name=status), is_finished=lambda: status.startswith("FINISHED"))


def test_preemptions_from_one_state_are_named_once_at_the_second() -> None:
    scheduler = _Scheduler()
    assert LIVELOCK_REPEATS == 2               # one recurrence, as check-trace's L4_no_livelock
    scheduler.preempt("r4")
    assert scheduler.flightcheck_observations.admission_livelocks == []
    for _ in range(3):
        scheduler.preempt("r4")
    [loop] = scheduler.flightcheck_observations.admission_livelocks
    assert (loop["step"], loop["blocks_of_sequence"], loop["blocks_with_lookahead"]) == (12, 2, 3)


def test_a_queue_reordered_or_a_block_freed_between_preemptions_is_another_state() -> None:
    scheduler = _Scheduler()
    scheduler.preempt("r4")
    scheduler.waiting.append(scheduler.requests["r2"])           # the queue changed: not the same state
    scheduler.preempt("r4")
    scheduler.kv_cache_manager.block_pool.get_num_free_blocks = lambda: 1    # a block taken between
    scheduler.preempt("r4")
    assert scheduler.flightcheck_observations.admission_livelocks == []
    scheduler.preempt("r4")
    assert [loop["step"] for loop in scheduler.flightcheck_observations.admission_livelocks] == [24]


def test_an_event_of_the_environment_between_preemptions_is_another_state() -> None:
    """Seed 388 index 40 (0.33.0, sync): r2 preempted at two schedule() calls from one state of the
    requests, queues and blocks, with two resets of the running requests between that rolled every
    request back to it; then r2 finished. The resets are the environment's: no loop."""
    scheduler = _Scheduler()
    scheduler.preempt("r4")
    scheduler._fc_note_event({"ev": "reset", "running": True, "preempted": ["r4"]})
    scheduler._fc_note_event({"ev": "schedule", "entries": [], "preempted": []})       # the scheduler's own
    scheduler._fc_note_event({"ev": "complete", "batch": 3, "tokens": {"r4": []}})    # quiet
    scheduler.preempt("r4")
    assert scheduler.flightcheck_observations.admission_livelocks == []
    scheduler._fc_note_event({"ev": "complete", "batch": 4, "tokens": {"r4": []}})
    scheduler.preempt("r4")                                   # nothing loud since the last: the loop
    assert [loop["step"] for loop in scheduler.flightcheck_observations.admission_livelocks] == [18]


@pytest.mark.parametrize("event", [
    {"ev": "complete", "tokens": {"a": []}}, {"ev": "complete", "tokens": {"a": [5]}},
    {"ev": "complete", "tokens": {"a": []}, "dropped": ["a"]}, {"ev": "complete", "tokens": {}, "next_drafts": {"a": [1]}},
    {"ev": "complete", "tokens": {"a": []}, "stale": ["a"]}])
def test_the_ground_truth_and_check_trace_call_the_same_completions_quiet(event: dict[str, Any]) -> None:
    assert loud_event(event) is not quiet_completion(event)
    assert not loud_event({"ev": "schedule", "entries": [], "preempted": ["a"]})
    assert all(loud_event({"ev": kind}) for kind in ("arrive", "abort", "finish", "input", "reset", "pause",
                                                      "kv_failed", "grammar_compiled"))


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
@pytest.mark.parametrize("name", CASES)
def test_vllm_loops_on_the_lookahead_block_and_the_ground_truth_names_it(running: Workers, name: str) -> None:
    case = LIVELOCK[name]
    version, asynchronous = name.split("-")[0], name.endswith("-async")
    replayed = replay_kept_workload(running[version], case, version, asynchronous)
    kept = case.result()
    assert replayed.result["batches"] == kept["batches"] and replayed.result["ending"] == "step_limit"
    assert replayed.result["ground_truth"]["admission_livelocks"] == kept["ground_truth"]["admission_livelocks"]
    # check-trace takes every step, and rejects the run where the spec's state comes back (L4)
    assert replayed.category == "rejected, real bug", replayed.detail
    assert replayed.detail.endswith("rejected, L4_no_livelock") and "a livelock" in replayed.detail
