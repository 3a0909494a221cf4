"""What the hunt over fresh seeds 403-409 found (campaigns of
`python -m flightcheck.vllm.campaign ... --reuse-ids --jobs 1 --no-mutants`,
the trace, workload and replay result of each case kept in
tests/data/vllm/hunt409 as 04x_<seed>_..., x the release's minor: 044 for
0.34.0).

* A miss of check-trace's progress rule, and of the ground truth's own
  livelock watch, 0.34.0 async: seed 403 index 48 (`--versions
  0.34.0,0.33.0 --all-features --spec-tokens 2 --stages 3`; blocks of 2,
  21 usable, 2 drafts, the priority policy). r0, a streaming session whose
  client never ends it, parks holding 9 blocks. r4 (23 tokens, 12 blocks)
  is admitted by `allocate_slots(full_sequence_must_fit=True)` (0.34.0
  `Scheduler.schedule`, the waiting loop: the gate counts
  `request.num_tokens` and no drafts), prefills beside r2 (preempted for r4's
  blocks) and samples; the drafter proposes 2 drafts, and the next
  `schedule()`, r4's token still in flight, finds no block for its 1 + 2
  slots past the placeholder (13 blocks) and preempts r4 itself; the token
  comes back dropped, and r4 is admitted again from 0. Round again to the
  step limit (3,000 steps in the campaign). Both watches counted a
  completion that returned a dropped token or proposed drafts as the
  environment's, so neither closed the lasso; the ground truth named only
  the step limit. A dropped token is applied to nothing, and the drafts a
  request is proposed are the drafter's function of its tokens and
  position, held in the state: both are quiet now
  (verification/traces/lasso.py `quiet_completion`,
  flightcheck/vllm/livelock_recording.py `loud_event`, and the ground
  truth's state holds each request's drafts). Kept with `max_steps` 200:
  the ground truth names the loop at steps 70 (r2) and 78 (r4), check-trace
  rejects L4_no_livelock at line 252.
* A false finding that change made, closed: seed 405 index 125 (0.34.0
  async, `--kv-connector --stages 1`, a producer). r3 is preempted twice
  from one state (steps 26 and 30) for a block r2's send holds, its token
  dropped each time, then admitted once the send is reported (step 33); the
  run ends done. check-trace's L4 waits on the send (spec/deadlock.py
  `waits_on_environment`); the ground truth's watch did not, and with the
  dropped tokens quiet named a loop: a miss by the campaign's count. It now
  names none while a load, a held request's send, a grammar or a failed
  grammar's finish is to come (`_fc_waits_on_environment`).
* A check-trace false rejection, 0.33.0 sync and async: seed 409 index 106
  (`--versions 0.33.0 --all-features --stages 2`). r0, a session whose
  client never ends it, parks holding 3 of 4 blocks; r2 (18 tokens) has its
  grammar compiled at line 15 and waits behind it to the end. The spec's
  r2 is still WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR there, so
  spec/deadlock.py `idles_on_clients` counted the next call's promotion
  (`moves_a_load`: any status change) as moving on, called the idle no
  client's, and the end raised L1_running_request_unblocked (the call
  forms nothing). It now reads the state past the calls that only move a
  wait on (`_past_waits_moved`); the ground truth (`left_to_clients`)
  names nothing.
* A check-trace false rejection, 0.33.0 sync: seed 409 index 108
  (`--versions 0.33.0 --all-features --stages 2`; a consumer connector
  under the recompute policy, `max_loras` 1, the prefill cadence at interval
  2). r1's async load fails whole and lands while r0 (another LoRA) runs;
  the empty schedule() call that follows promotes r1 (its table freed, so
  0.33.0 `Scheduler.schedule`'s `skip_request` puts it back in `waiting`,
  not `kv_holding_waiting`) and skips it for the LoRA cap. The checker took
  that call's `waiting` order (`_reorder_at_empty_calls`, which the cadence
  and grammars turn on) with r1 in it while its own promotion
  (`_promote_at_empty_calls`) left r1 in kv_holding: r1 in both queues, a
  false S10 at line 14. The reorder now keeps `waiting`'s own members
  (verification/traces/replay.py `reordered_waiting`); the ground truth
  names nothing and the run ends done.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flightcheck.verification.traces.check import check_trace
from flightcheck.verification.traces.lasso import quiet_completion
from flightcheck.verification.traces.reading import read_trace_file
from flightcheck.verification.traces.replay import reordered_waiting
from flightcheck.vllm.livelock_recording import loud_event
from flightcheck.vllm.replay import findings

from .test_vllm_hunt395_livelock import _request, _Scheduler
from .vllm_support import DATA, KeptCase, Workers, replay_kept_workload, workers

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

HUNT = DATA / "hunt409"
DROPPED_LASSO = KeptCase(HUNT / "044_403_async_dropped_token_and_drafts_lasso_beside_a_parked_session_seed403_48")
SEND_HOLDS = KeptCase(HUNT / "044_405_async_preempted_twice_for_a_block_a_send_holds_seed405_125")
PROMOTED_AT_END = KeptCase(HUNT / "043_409_sync_grammar_promoted_behind_a_parked_session_at_the_end_seed409_106")
LOAD_PROMOTED_EMPTY = KeptCase(HUNT / "043_409_sync_failed_load_promoted_at_an_empty_call_under_the_lora_cap_seed409_108")


def test_the_kept_trace_goes_round_admit_sample_preempt_with_the_token_dropped() -> None:
    events = read_trace_file(str(DROPPED_LASSO.trace))
    config = events[0]
    assert (config["async_scheduling"], config["num_spec_tokens"], config["usable_blocks"],
            config["block_size"]) == (True, 2, 21, 2)
    self_preempted = [i for i, e in enumerate(events) if e["ev"] == "schedule" and e["preempted"] == ["r4"]
                      and e["batch"] is None]
    assert len(self_preempted) >= 5
    for at in self_preempted:
        drop = next(e for e in events[at:] if e["ev"] == "complete" and "r4" in e.get("dropped", ()))
        assert drop["tokens"]["r4"] and not quiet_completion({**drop, "dropped": []})   # a token, dropped
        assert quiet_completion(drop)
    # nothing but schedules and completions that apply no token after the first round
    later = events[self_preempted[0] + 2:]
    assert {e["ev"] for e in later} == {"schedule", "complete"}
    assert all(quiet_completion(e) for e in later if e["ev"] == "complete")
    assert any(any(e.get("next_drafts", {}).values()) for e in later if e["ev"] == "complete")


def test_check_trace_rejects_the_lasso_of_dropped_tokens_and_drafts() -> None:
    result = check_trace(DROPPED_LASSO.trace)
    assert (result.ok, result.property, result.line) == (False, "L4_no_livelock", 252), result
    assert "after line 48's preemption comes back at line 252" in result.message
    assert '"r4", "r2" are scheduled and preempted round this lasso for ever' in result.message


def test_the_ground_truth_names_the_loop_before_the_step_limit() -> None:
    result = DROPPED_LASSO.result()
    assert result["ending"] == "step_limit"
    loops = result["ground_truth"]["admission_livelocks"]
    assert [(loop["req"], loop["step"], loop["blocks_of_sequence"], loop["free_blocks"]) for loop in loops] \
        == [("r2", 70, 4, 1), ("r4", 78, 12, 12)]
    assert findings(result)[0].startswith("a livelock: r2 was preempted 2 times in a row")


@pytest.mark.parametrize("event, loud", [
    ({"ev": "complete", "tokens": {"a": [5]}, "dropped": ["a"]}, False),            # applied to nothing
    ({"ev": "complete", "tokens": {"a": [5], "b": [6]}, "dropped": ["a"]}, True),   # b's token applied
    ({"ev": "complete", "tokens": {"a": []}, "next_drafts": {"a": 2}}, False),      # drafts: state
    ({"ev": "complete", "tokens": {"a": [5]}, "next_drafts": {"a": 2}}, True)])
def test_a_dropped_token_and_drafts_proposed_are_quiet_to_both_watches(event: dict, loud: bool) -> None:
    assert quiet_completion(event) is not loud
    assert loud_event(event) is loud


@pytest.mark.parametrize("waiting", ["WAITING_FOR_REMOTE_KVS", "FINISHED_LENGTH_CAPPED", "grammar error"])
def test_the_ground_truth_names_no_loop_while_the_environment_has_a_report_to_make(waiting: str) -> None:
    """Seed 405 index 125 (0.34.0 async, `--kv-connector --stages 1`): r3 preempted twice from one
    state for a block r2's send held, its token dropped each time, then admitted when the send was
    reported; the run ends done. With dropped tokens quiet, the ground truth named a loop there (a
    false miss of check-trace, whose L4 waits on the send: spec/deadlock.py `waits_on_environment`)."""
    scheduler = _Scheduler()
    if waiting == "grammar error":
        scheduler.grammar_compile_error_reqs = {"r2": "failed"}
    else:
        scheduler.requests["r2"] = _request(20, waiting)
    for _ in range(3):
        scheduler.preempt("r4")
    assert scheduler.flightcheck_observations.admission_livelocks == []
    scheduler.requests.pop("r2")
    scheduler.__dict__.pop("grammar_compile_error_reqs", None)
    scheduler.preempt("r4")
    scheduler.preempt("r4")                              # the report made: a loop from here is named
    assert [loop["step"] for loop in scheduler.flightcheck_observations.admission_livelocks] == [30]


def test_the_kept_run_of_two_self_preemptions_for_a_send_is_correct_and_accepted() -> None:
    events = read_trace_file(str(SEND_HOLDS.trace))
    self_preempted = [e["step"] for e in events if e["ev"] == "schedule" and e["preempted"] == ["r3"]
                      and e["batch"] is None]
    sent = next(e["step"] for e in events if e["ev"] == "kv_sent" and e["req"] == "r2")
    assert self_preempted == [26, 30] and sent == 33           # r2's send reported after both
    result = SEND_HOLDS.result()
    assert (result["ending"], findings(result)) == ("done", [])
    assert check_trace(SEND_HOLDS.trace).ok


def test_check_trace_takes_a_grammar_promotion_that_admits_nothing_for_the_clients_wait() -> None:
    events = read_trace_file(str(PROMOTED_AT_END.trace))
    assert events[-1]["ev"] == "end" and events[14]["ev"] == "grammar_compiled" and events[14]["req"] == "r2"
    result = PROMOTED_AT_END.result()
    assert (result["ending"], findings(result), result["left_to_clients"]) == ("stuck", [], ["r0"])
    checked = check_trace(PROMOTED_AT_END.trace)
    assert checked.ok, checked


def test_an_empty_call_that_promotes_a_failed_load_leaves_it_in_one_queue() -> None:
    events = read_trace_file(str(LOAD_PROMOTED_EMPTY.trace))
    assert (events[0]["max_loras"], events[0]["prefill_schedule_interval"]) == (1, 2)
    failed = next(i for i, e in enumerate(events) if e["ev"] == "kv_failed" and e["req"] == "r1")
    assert (events[failed + 1]["ev"], events[failed + 1]["req"]) == ("kv_received", "r1")
    assert any(n["ev"] == "schedule" for n in events[13]["empty_batches_before"])   # line 14's note
    result = LOAD_PROMOTED_EMPTY.result()
    assert (result["ending"], findings(result)) == ("done", [])
    checked = check_trace(LOAD_PROMOTED_EMPTY.trace)
    assert checked.ok, checked


@pytest.mark.parametrize("waiting, scheduled, kept", [
    ((), (0,), ()),                       # promoted out of kv_holding by the call: not the reorder's
    ((2, 1), (1, 0, 2), (1, 2)),          # the call's order, its own members
    ((3, 1), (1,), (1, 3))])              # a member the call's queue lacks stays, after
def test_the_reorder_at_an_empty_call_keeps_waiting_s_own_members(waiting: tuple, scheduled: tuple,
                                                                   kept: tuple) -> None:
    assert reordered_waiting(waiting, scheduled) == kept


# --- on vLLM itself (slow): the kept workload, the ground truth and check-trace together


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_goes_round_the_lasso_again_and_both_name_it(running: Workers) -> None:
    replayed = replay_kept_workload(running["0.34.0"], DROPPED_LASSO, "0.34.0", asynchronous=True)
    assert replayed.result["batches"] == DROPPED_LASSO.result()["batches"]
    assert replayed.result["ground_truth"]["admission_livelocks"] \
        == DROPPED_LASSO.result()["ground_truth"]["admission_livelocks"]
    assert replayed.category == "rejected, real bug" and "L4_no_livelock" in replayed.detail, replayed.detail


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("case, version, asynchronous", [
    (SEND_HOLDS, "0.34.0", True),            # vLLM waits on the send; the ground truth names no loop
    (PROMOTED_AT_END, "0.33.0", False),      # r2 left behind the parked session
    (LOAD_PROMOTED_EMPTY, "0.33.0", False),  # the promoted load skipped for the LoRA cap
], ids=["send_holds", "promoted_at_end", "load_promoted_empty"])
def test_vllm_replays_the_correct_run_batch_for_batch_and_check_trace_accepts_it(
        running: Workers, case: KeptCase, version: str, asynchronous: bool) -> None:
    replayed = replay_kept_workload(running[version], case, version, asynchronous=asynchronous)
    assert replayed.result["batches"] == case.result()["batches"]
    assert replayed.category == "accepted, correct run", replayed.detail
