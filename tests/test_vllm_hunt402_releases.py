"""What the hunt over fresh seeds 396-402 (releases alone) found: campaigns
of `python -m flightcheck.vllm.campaign ... --jobs 1 --no-mutants`, the
trace, workload and replay result of each case kept in tests/data/vllm/hunt402.

* A ground-truth gap, 0.8.5 sync: seed 396 index 76 (`--versions
  0.8.5,0.8.4 --reuse-ids`; four pipeline stages, blocks of 4, 8 usable).
  r2 decodes holding six blocks; each time r0 is admitted (its prefix hit
  and one chunk, blocks 1 and 8), the next `schedule()` finds no block for
  r2's next token and preempts r0 (0.8.5 `Scheduler.schedule`, the running
  loop's "preempt the lowest-priority request"), and r0 is admitted again:
  a batch every engine step, two of three of them r0's chunk alone, whose
  completions drop its tokens. r2's sampling entries are in flight all the
  while and append a token every third preemption, so the run moves on and
  ends `done`: check-trace accepted it, rightly. The ground truth's
  livelock check (ground_truth.py `_fc_check_livelock`) compares only the
  requests' state, which repeats over three preemptions while r2's token is
  on its way, and names a livelock: a miss that is none. The kept result is
  the replay's with that state holding what each batch in flight schedules
  (a change to the ground truth, not here: its owner's). A check-trace rule
  for livelocks must accept this run.
* A differential gap, 1 unexplained, 0.34.0 sync: seed 402 index 37
  (`--versions 0.34.0 --all-features --reuse-ids --spec-tokens 1`, inputs
  during waits; four stages). r5, re-added under the aborted r0's id, fails
  its grammar; vLLM finishes it at the end of the update of an empty batch
  (0.34.0 `Scheduler.update_from_output`: `grammar_compile_error_reqs` ->
  `finish_requests(..., FINISHED_ERROR)`), so its recorder writes the finish
  with that empty completion in `empty_batches_before`, at its step. The
  differential's reading (differential.py `decisions`, kv_differential.py
  `ErrorFinishes`) took every error finish written after a schedule as one
  of the fail policy's, written within an update before its batch's
  `complete`, and moved it after the next completion (r4's batch 11), where
  the reference, and vLLM, finish r0 first: the conforming run (drafts
  handed over at submission) differed at event 26 and the run was
  unexplained. Index 96 (a KV connector) is the same finish in an empty
  batch's update, at step 5, batch 1's completion at step 9; the conforming
  reference writes it at step 5 as well but notes no empty batch, so the
  note alone cannot be the rule. A pending error finish now waits for the
  next completion only if its step is that completion's update's (the
  completion's step - 1: the recorder counts an update when it returns, and
  writes the fail policy's finishes within it); one an earlier update wrote
  (`ErrorFinishes.settle_before`), or noted in an empty batch's update
  (`in_an_empty_update`), stays before it. Both named
  `drafts_handed_over_at_submission`.
  (vLLM then fails `assert keep_end >= session.num_computed_tokens` in
  `_update_request_as_session` after sampling r4 twice: a real bug,
  rejected, S5.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from flightcheck.verification.traces.check import check_trace
from flightcheck.verification.traces.reading import read_trace_file

from flightcheck.vllm.campaign import compare_workload
from flightcheck.vllm.differential import decisions, profile_for, read_trace
from flightcheck.vllm.kv_differential import ErrorFinishes, in_an_empty_update

from .vllm_support import DATA, KeptCase, Workers, replay_kept_workload, workers

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

HUNT = DATA / "hunt402"
ROTATION = KeptCase(HUNT / "085_sync_preempted_from_one_state_while_a_token_is_in_flight_seed396_76")
EMPTY_UPDATE_ERROR = KeptCase(HUNT / "034_sync_grammar_error_finished_in_an_empty_update_seed402_37")
REPEATS = 3            # the ground truth's LIVELOCK_REPEATS: preemptions in a row from one state


def _appended(event: dict[str, Any]) -> bool:
    """A completion that appends a token to some request (not one it drops)."""
    dropped = set(event.get("dropped", []))
    return any(tokens and req not in dropped for req, tokens in event["tokens"].items())


def test_the_kept_trace_preempts_r0_from_one_state_while_r2s_token_is_in_flight() -> None:
    events = read_trace_file(str(ROTATION.trace))
    assert (events[0]["num_stages"], events[0]["usable_blocks"], events[-1]["ev"]) == (4, 8, "end")
    in_flight: dict[int, list[str]] = {}
    quiet, repeats_with_r2_pending = 0, []
    for event in events:
        if event["ev"] == "schedule" and event["batch"] is not None:
            in_flight[event["batch"]] = [entry["req"] for entry in event["entries"] if entry["samples"]]
        elif event["ev"] == "complete":
            del in_flight[event["batch"]]
            quiet = 0 if _appended(event) else quiet
        if event["ev"] == "schedule" and event["preempted"] == ["r0"]:
            quiet += 1
            if quiet >= REPEATS:            # three preemptions with no token appended between
                repeats_with_r2_pending.append(any("r2" in samplers for samplers in in_flight.values()))
    assert repeats_with_r2_pending and all(repeats_with_r2_pending)   # each time, r2's token on its way
    assert [e["req"] for e in events if e["ev"] == "finish"] == ["r1", "r2", "r0"]


def test_check_trace_accepts_the_run_vllm_ended_done() -> None:
    result = check_trace(ROTATION.trace)
    assert result.ok and result.unchecked == [], result
    kept = ROTATION.result()
    assert kept["ending"] == "done" and kept["unfinished"] == [] and kept["stalls"] == []



def test_the_kept_trace_finishes_r0_by_its_grammar_in_an_empty_batchs_update() -> None:
    events = read_trace_file(str(EMPTY_UPDATE_ERROR.trace))
    failed = next(i for i, e in enumerate(events) if e["ev"] == "finish" and e["reason"] == "error"
                  and e["req"] == "r0")
    finish, after = events[failed], events[failed + 1]
    assert finish["empty_batches_before"][-1] == {"ev": "complete", "empty_batch": 8, "step": finish["step"]}
    assert (after["ev"], after["batch"], after["tokens"]) == ("complete", 11, {"r4": [2227]})
    theirs = decisions(events)
    assert theirs.index(("finish", "r0", "error")) == theirs.index(("complete", (("r4", (2227,)),), ())) - 1


def test_the_conforming_run_equals_vllms_and_the_differential_names_it() -> None:
    case = EMPTY_UPDATE_ERROR
    comparison, _ = compare_workload(case.raw(), case.result(), read_trace(case.trace), profile_for("0.34.0", False))
    assert comparison.explained and comparison.deviation == "drafts_handed_over_at_submission", \
        comparison.describe()


def test_an_error_finish_before_its_batchs_completion_still_waits_for_it() -> None:
    """The fail policy's finish, written within a real batch's update (at
    the completion's step - 1) before its `complete`, after an empty batch
    completed at an earlier step; and one an earlier update wrote."""
    in_update = {"ev": "finish", "req": "r2", "reason": "error", "step": 12,
                 "empty_batches_before": [{"ev": "complete", "empty_batch": 3, "step": 11}]}
    complete = {"ev": "complete", "batch": 4, "tokens": {}, "step": 13}
    assert not in_an_empty_update(in_update) and in_an_empty_update(in_update | {"step": 11})
    errors, finishes = ErrorFinishes(), []
    errors.take(in_update, finishes)
    errors.take({"ev": "finish", "req": "r3", "reason": "error", "step": 9}, finishes)   # unnoted, earlier
    assert finishes == [] and len(errors.pending) == 2
    errors.settle_before(complete, finishes)
    assert finishes == [("finish", "r3", "error")]        # before the completion
    errors.release(finishes)
    assert finishes == [("finish", "r3", "error"), ("finish", "r2", "error")] and errors.pending == []


def test_an_empty_updates_finish_the_reference_writes_unnoted_goes_before_the_completion_too() -> None:
    """Seed 402 index 96 (`--all-features --spec-tokens 1`, 0.34.0 sync, a
    KV connector): r0's grammar fails while it waits for its async load;
    vLLM finishes it in empty batch 1's update (step 5), before batch 1
    completes (step 9), and notes the empty completion; the conforming
    reference writes the finish at step 5 too, with no note."""
    case = KeptCase(HUNT / "034_sync_grammar_error_finished_in_an_empty_update_unnoted_by_the_reference_seed402_96")
    events = read_trace(case.trace)
    finish = next(e for e in events if e["ev"] == "finish" and e["reason"] == "error")
    assert (finish["req"], finish["step"], in_an_empty_update(finish)) == ("r0", 5, True)
    theirs = decisions(events)
    assert theirs[2][0] == "finish" and theirs[3][0] == "complete"
    comparison, _ = compare_workload(case.raw(), case.result(), events, profile_for("0.34.0", False))
    assert comparison.explained and comparison.deviation == "drafts_handed_over_at_submission", \
        comparison.describe()

# --- on vLLM itself (slow): the kept workload


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_rotates_r0_through_the_pipeline_to_the_end(running: Workers) -> None:
    replayed = replay_kept_workload(running["0.8.5"], ROTATION, "0.8.5")
    assert replayed.result["batches"] == ROTATION.result()["batches"]
    assert replayed.result["ending"] == "done" and replayed.result["unfinished"] == []
    assert replayed.comparison is None or replayed.comparison.explained, replayed.comparison.describe()


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_finishes_r0_in_the_empty_update_and_the_differential_names_the_run(running: Workers) -> None:
    replayed = replay_kept_workload(running["0.34.0"], EMPTY_UPDATE_ERROR, "0.34.0")
    assert replayed.result["batches"] == EMPTY_UPDATE_ERROR.result()["batches"]
    assert replayed.comparison is not None and replayed.comparison.explained, replayed.comparison.describe()
    assert replayed.comparison.deviation == "drafts_handed_over_at_submission"
    assert replayed.category == "rejected, real bug", replayed.detail
