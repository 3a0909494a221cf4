"""What the hunt over fresh seeds 417-423 found (campaigns of
`python -m flightcheck.vllm.campaign ... --reuse-ids --jobs 1 --no-mutants`,
the trace, workload and replay result of each case kept in
tests/data/vllm/hunt423 as 06x_<seed>_..., x the release's minor: 064 for
0.34.0).

* A check-trace false rejection, 0.34.0 sync and async: seed 422 index 42
  (`--versions 0.34.0 --all-features --spec-tokens 3 --lookahead --stages
  1`; `max_num_batched_tokens` 4, three drafts with a draft input slot, a
  KV connector). r0 (3 tokens, 2 offered by a sync load) arrives and is
  aborted in engine step 0, before any `schedule()` call. Alone, r0 stalls
  vLLM (its one token padded to 1 + 3 is over `input_budget - draft_slots`,
  0.34.0 `Scheduler.schedule`: "Prefer to not schedule than schedule
  un-padded"), and L2 as safety (spec/deadlock.py) rejected the state after
  its arrival at line 2; but vLLM's engine handles every queued input
  before it steps (0.34.0 `EngineCoreProc.run_busy_loop`:
  `_process_input_queue`, then `_process_engine_step`), so no call ever
  met that state: the run ends done, the ground truth names nothing. L2
  is now judged of the state after the last input of a step (the next
  event another input with the same `step` and no empty batch noted before
  it leaves the check to that input: verification/traces/step_inputs.py).
* A check-trace false rejection (a spec error), 0.34.0 and 0.33.0 async:
  seed 423 index 93 (`--versions 0.34.0,0.33.0 --kv-connector
  --spec-tokens 2 --stages 3`; the fail policy). r0's sync load of its
  first block and r4's of its second and third are carried by batch 1; r4
  holds r0's block (trace block 1) through its prefix hit. r0 is aborted
  (line 10); batch 1's output reports both loads failed (lines 16 and 18),
  and vLLM's `_handle_invalid_blocks` scans `running` once over every
  invalid block (0.34.0 `_update_requests_with_invalid_blocks(evict_blocks=
  True)`): r4's first invalid block is r0's, so r4's whole table leaves the
  prefix cache. The spec (kv_reports.py `fail_kv_output`) took the
  failures one by one in scan order: r4's own first (from its second
  block, r4 finished by it), then r0's, whose scan then found no running
  holder, and r0's block stayed cached: r2 (same first block) hit it in the
  spec at line 21 and not in vLLM (`schedule_decision`, external 8 against
  12). The fail policy's eviction is now one scan over the output's invalid
  blocks before any request finishes (`_evict_invalid_tails`).
* A check-trace false rejection of seed 422 index 42's kind after a KV
  report, 0.34.0 and 0.33.0 async: seed 418 index 151 (the fifth pass,
  `--kv-connector --spec-tokens 3 --lookahead --stages 1`): r3's stall
  waited on r0's send; r0's `kv_sent` and r3's abort share a `step`, no
  call between. A KV report's L2 check may wait for an input of its step
  too (step_inputs.py `DEFERRABLE`).
* A check-trace false rejection, 0.33.0 async: seed 419 index 95 (the
  sixth pass, `--all-features --spec-tokens 3 --lookahead --stages 1`).
  Under PAUSED_NEW vLLM's `get_num_unfinished_requests()` counts the
  running and KV-holding requests less the parked sessions, -1 here (a
  session parked in `waiting`, nothing running), and
  `has_unfinished_requests()` asks `> 0` (0.33.0
  v1/core/sched/interface.py); L2 (spec/deadlock.py) read any non-zero
  count as a request unfinished. It asks `> 0` now (`_has_unfinished`).
* A check-trace miss, 0.33.0 sync: seed 422 index 122 (`--versions
  0.34.0,0.33.0 --all-features --spec-tokens 3 --lookahead --stages 1`,
  the third pass; blocks of 8, 4 usable, one draft and one lookahead slot,
  the prefill cadence at interval 2). r1, a session its client does not
  end, parks holding a block; r0 (24 tokens, 3 blocks) is admitted past
  the gate (`full_sequence_must_fit` counts no lookahead), computes, and
  preempts itself for the fourth block its draft and lookahead slots need
  (line 15), is admitted again past its 16-token hit and preempts itself
  again (line 18); r1's next input (line 19) breaks the loop, and r0 then
  waits behind r1's blocks to the end. The ground truth names the loop
  (`admission_livelocks`, step 15); check-trace's lasso
  (verification/traces/lasso.py) compared the whole states after the two
  preemptions, which differ only in r0's `is_prefill_chunk` (r0 had sampled
  before the first, was mid-prefill before the second): vLLM keeps the flag
  through a preemption and reads it only of running requests, and the
  spec likewise. The lasso now compares states but for the flag of
  requests not running (`_recurs`): L4_no_livelock at line 18.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from flightcheck.spec import State, Status, invariants_for, step
from flightcheck.spec.reset_pause import num_unfinished_requests
from flightcheck.spec.state import Pause
from flightcheck.spec.blocks import cached_block
from flightcheck.spec.kv_reports import fail_kv_output
from flightcheck.spec.transitions import FailKvLoad
from flightcheck.verification.traces.check import IncrementalChecker, check_events, check_trace
from flightcheck.verification.traces.lasso import _recurs
from flightcheck.verification.traces.reading import read_trace_file
from flightcheck.verification.traces.step_inputs import another_input_follows
from flightcheck.verification.traces.stream import check_lines
from flightcheck.vllm.replay import findings

from .vllm_support import DATA, KeptCase, Workers, workers

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

HUNT = DATA / "hunt423"
ABORTED_BEFORE_A_CALL = KeptCase(HUNT / "064_422_sync_arrival_aborted_before_any_schedule_call_below_the_padding_"
                                        "budget_seed422_42")
SENT_THEN_ABORTED = KeptCase(HUNT / "064_418_async_stalled_request_aborted_after_the_send_before_any_call_"
                                    "seed418_151")
PAUSED_PARKED = KeptCase(HUNT / "063_419_async_paused_with_a_parked_session_and_a_new_request_seed419_95")
LASSO_BUT_FOR_A_FLAG = KeptCase(HUNT / "063_422_sync_lasso_back_but_for_a_preempted_request_s_prefill_flag_"
                                       "seed422_122")
EVICTED_WITH_ITS_SHARER = KeptCase(HUNT / "064_423_async_fail_policy_evicts_an_aborted_loader_s_block_its_sharer_"
                                          "holds_seed423_93")


def _verdicts(events: list[dict]) -> tuple[tuple, tuple]:
    """(whole-trace, streaming) check-trace verdicts: (ok, property, line)."""
    whole = check_events([dict(e) for e in events])
    streamed = list(check_lines([json.dumps(e) for e in events]))[-1].result
    assert streamed is not None
    return (whole.ok, whole.property, whole.line), (streamed.ok, streamed.property, streamed.line)


def test_the_kept_run_aborts_r0_before_any_schedule_call_and_is_accepted() -> None:
    events = read_trace_file(str(ABORTED_BEFORE_A_CALL.trace))
    config = events[0]
    assert (config["max_num_batched_tokens"], config["num_spec_tokens"], config["draft_input_slots"]) == (4, 3, 1)
    arrive, abort = events[1], events[2]
    assert (arrive["ev"], arrive["req"], abort["ev"], abort["req"]) == ("arrive", "r0", "abort", "r0")
    assert arrive["step"] == abort["step"] == 0 and "empty_batches_before" not in abort
    result = ABORTED_BEFORE_A_CALL.result()
    assert (result["ending"], findings(result), result["stalls"]) == ("done", [], [])
    assert _verdicts(events) == ((True, None, None),) * 2


def _r0_alone(events: list[dict]) -> list[dict]:
    """The kept run's config and r0's arrival, then the end after five empty calls (vLLM 0.34.0 with
    r0 never aborted ends so: stuck)."""
    calls = [{"ev": kind, "empty_batch": n, "step": 2 * n - (kind == "schedule")}
             for n in range(1, 6) for kind in ("schedule", "complete")]
    return [events[0], events[1], {"ev": "end", "empty_batches_before": calls}]


def test_r0_alone_stalls_and_l2_rejects_it_at_its_arrival() -> None:
    events = read_trace_file(str(ABORTED_BEFORE_A_CALL.trace))
    assert _verdicts(_r0_alone(events)) == ((False, "L2_no_deadlock", 2),) * 2


def test_an_abort_after_a_schedule_call_leaves_the_stall_rejected_at_the_arrival() -> None:
    events = read_trace_file(str(ABORTED_BEFORE_A_CALL.trace))
    called = [{"ev": "schedule", "empty_batch": 1, "step": 1}, {"ev": "complete", "empty_batch": 1, "step": 2}]
    later = [events[0], events[1], dict(events[2], step=2, empty_batches_before=called), dict(events[3], step=2),
             {"ev": "end"}]
    assert _verdicts(later) == ((False, "L2_no_deadlock", 2),) * 2


def test_an_abort_that_changes_nothing_owes_the_check_at_its_own_line() -> None:
    events = read_trace_file(str(ABORTED_BEFORE_A_CALL.trace))
    no_op = [events[0], events[1], dict(events[2], req="r9"), {"ev": "end"}]     # r9 never arrived
    assert _verdicts(no_op) == ((False, "L2_no_deadlock", 3),) * 2


def test_a_trace_without_step_numbers_is_judged_after_every_event() -> None:
    events = read_trace_file(str(ABORTED_BEFORE_A_CALL.trace))
    unnumbered = [{k: v for k, v in e.items() if k != "step"} for e in events]
    assert _verdicts(unnumbered) == ((False, "L2_no_deadlock", 2),) * 2


@pytest.mark.parametrize("event, following, follows", [
    ({"ev": "arrive", "step": 0}, {"ev": "abort", "step": 0}, True),
    ({"ev": "abort", "step": 3}, {"ev": "arrive", "step": 3}, True),
    ({"ev": "arrive", "step": 0}, {"ev": "abort", "step": 2}, False),              # calls between
    ({"ev": "arrive", "step": 0}, {"ev": "abort", "step": 0,
                                   "empty_batches_before": [{"ev": "schedule", "empty_batch": 1, "step": 1}]}, False),
    ({"ev": "arrive", "step": 0}, {"ev": "schedule", "step": 1}, False),
    ({"ev": "arrive", "step": 0}, {"ev": "finish", "step": 0}, False),             # no input
    ({"ev": "complete", "step": 4}, {"ev": "abort", "step": 4}, True),           # after update_from_output
    ({"ev": "finish", "step": 4}, {"ev": "arrive", "step": 4}, True),
    ({"ev": "schedule", "step": 4}, {"ev": "abort", "step": 4}, False),          # a call's own state
    ({"ev": "arrive"}, {"ev": "abort"}, False),                                     # no steps
    ({"ev": "kv_sent", "step": 17}, {"ev": "abort", "step": 17}, True),          # a report, then an input
    ({"ev": "abort", "step": 17}, {"ev": "kv_sent", "step": 17}, False),         # an input, then a report
    ({"ev": "arrive", "step": 0}, None, False)])
def test_another_input_of_the_step_follows(event: dict, following: dict | None, follows: bool) -> None:
    assert another_input_follows(event, following) is follows


def test_a_send_reported_and_the_stalled_request_aborted_before_a_call_is_accepted() -> None:
    """Seed 418 index 151 (the fifth pass, 0.34.0 and 0.33.0 async): r3 (one token past its hit,
    padded to 1 + 3 over a budget of 4 less a draft slot) can never be admitted; r0's send kept L2
    waiting until its `kv_sent` (line 25), and r3's abort (line 26, the same `step`) came before
    any call. After a call between, the stall is rejected at the report."""
    events = read_trace_file(str(SENT_THEN_ABORTED.trace))
    sent, abort = events[24], events[25]
    assert (sent["ev"], sent["req"], abort["ev"], abort["req"]) == ("kv_sent", "r0", "abort", "r3")
    assert sent["step"] == abort["step"] and "empty_batches_before" not in abort
    result = SENT_THEN_ABORTED.result()
    assert (result["ending"], findings(result), result["stalls"]) == ("done", [], [])
    assert _verdicts(events) == ((True, None, None),) * 2
    called = [{"ev": "schedule", "empty_batch": 5, "step": sent["step"] + 1}]
    later = events[:25] + [dict(abort, step=sent["step"] + 1, empty_batches_before=called)] + events[26:27] + \
        [{"ev": "end"}]
    assert [v[:2] for v in _verdicts(later)] == [(False, "L2_no_deadlock")] * 2
    assert {v[2] for v in _verdicts(later)} == {25}


def test_a_pause_with_a_parked_session_and_a_new_request_counts_nothing_unfinished() -> None:
    """Seed 419 index 95 (the sixth pass, 0.33.0 async): under PAUSED_NEW (line 23) nothing runs,
    r1 is a session parked in `waiting` and r2 a new request: vLLM's count, the running and
    KV-holding requests less the parked sessions, is -1, and `has_unfinished_requests()` asks
    `> 0`; L2 read -1 as a request unfinished and called the pause a stall (line 26, line 24
    before the inputs' rule)."""
    events = read_trace_file(str(PAUSED_PARKED.trace))
    assert (events[22]["ev"], events[22]["state"]) == ("pause", "new")
    assert (events[26]["ev"], events[26]["state"]) == ("pause", "none")
    state = _states_after(events, (26,))[26]
    assert state.pause is Pause.PAUSED_NEW and num_unfinished_requests(state) == -1 and not state.running
    checker = IncrementalChecker(events)
    assert all(inv.holds(state, checker.cfg) for inv in invariants_for(checker.cfg) if inv.name == "L2_no_deadlock")
    result = PAUSED_PARKED.result()
    assert (result["ending"], findings(result), result["stalls"]) == ("done", [], [])
    assert _verdicts(events) == ((True, None, None),) * 2


# --- seed 423 index 93: the fail policy's eviction, one scan over the output's invalid blocks


def test_the_kept_run_has_r0_aborted_before_its_failure_and_r4_holding_its_block() -> None:
    events = read_trace_file(str(EVICTED_WITH_ITS_SHARER.trace))
    assert events[0]["kv_connector"]["load_failure_policy"] == "fail" and events[0]["async_scheduling"]
    first = {e["req"]: e for e in events[7]["entries"]}
    assert first["r0"]["block_ids"][0] == first["r4"]["block_ids"][0] == 1     # r4's prefix hit on r0's load
    assert [(e["ev"], e["req"]) for e in events[9:11]] == [("abort", "r0"), ("finish", "r0")]
    failed = [(e["req"], e["from_block"]) for e in events if e["ev"] == "kv_failed"]
    assert failed == [("r0", 0), ("r3", 0), ("r4", 1)]
    r2 = events[20]["entries"][0]
    assert (r2["req"], r2["cached"], r2["external"]) == ("r2", 12, 12)          # no local hit left
    result = EVICTED_WITH_ITS_SHARER.result()
    assert (result["ending"], findings(result)) == ("done", [])
    checked = check_trace(EVICTED_WITH_ITS_SHARER.trace)
    assert checked.ok, checked


def test_the_joint_failure_evicts_the_aborted_loader_s_block_the_sharer_holds() -> None:
    events = read_trace_file(str(EVICTED_WITH_ITS_SHARER.trace))
    checker = IncrementalChecker(events)
    for event in events[1:15]:                   # up to batch 1's output (line 16)
        checker.feed(event)
    state, cfg = checker.state, checker.cfg
    r0, r4 = checker.slot["r0"], checker.slot["r4"]
    shared = state.requests[r4].block_table[0]
    label = state.pool.labels[shared]
    assert state.requests[r0].status.is_finished and cached_block(state.pool, label) == shared
    joint = fail_kv_output(state, cfg, ((r0, 0), (r4, 1)))
    assert joint is not None and cached_block(joint.pool, label) is None
    assert joint.requests[r4].status is Status.FINISHED_ERROR
    # r0's failure alone evicts its holder r4 from there and finishes it: what the joint output
    # reaches (r4's own report then is a finished request's, which changes nothing)
    loader_first = step(state, cfg, FailKvLoad(r0, 0))
    assert loader_first is not None and loader_first.pool == joint.pool
    assert loader_first.requests[r4].status is Status.FINISHED_ERROR
    # r4's own failure first finishes r4, and r0's then finds no holder: the label stayed cached
    sharer_first = step(state, cfg, FailKvLoad(r4, 1))
    assert sharer_first is not None and cached_block(sharer_first.pool, label) == shared
    assert step(sharer_first, cfg, FailKvLoad(r0, 0)) is None


# --- seed 422 index 122: a lasso back but for a preempted request's prefill flag


def _states_after(events: list[dict], lines: tuple[int, ...]) -> dict[int, State]:
    checker = IncrementalChecker(events)
    states = {}
    for line, event in enumerate(events[1:], start=2):
        checker.feed(event)
        if line in lines:
            states[line] = checker.state
    return states


def test_the_kept_loop_is_rejected_where_the_state_comes_back_but_for_r0_s_flag() -> None:
    events = read_trace_file(str(LASSO_BUT_FOR_A_FLAG.trace))
    assert (events[0]["prefill_schedule_interval"], events[0]["num_lookahead_tokens"]) == (2, 1)
    preempting = [line for line, e in enumerate(events, start=1) if e["ev"] == "schedule" and e["preempted"]]
    assert preempting == [15, 18] and all(events[line - 1]["preempted"] == ["r0"] for line in preempting)
    assert (events[18]["ev"], events[18]["req"]) == ("input", "r1")       # the client breaks the loop
    states = _states_after(events, (15, 18))
    before, after = states[15], states[18]
    r0 = 0
    assert before != after and before.requests[r0].is_prefill_chunk != after.requests[r0].is_prefill_chunk
    assert _recurs(before, after) and r0 not in after.running
    result = LASSO_BUT_FOR_A_FLAG.result()
    assert [loop["req"] for loop in result["ground_truth"]["admission_livelocks"]] == ["r0"]
    checked = check_trace(LASSO_BUT_FOR_A_FLAG.trace)
    assert (checked.ok, checked.property, checked.line) == (False, "L4_no_livelock", 18), checked
    assert "after line 15's preemption comes back at line 18" in checked.message


def test_a_running_request_s_prefill_flag_still_tells_states_apart() -> None:
    events = read_trace_file(str(LASSO_BUT_FOR_A_FLAG.trace))
    running = _states_after(events, (16,))[16]                  # r0 readmitted, a prefill chunk
    assert running.running == (0,) and running.requests[0].is_prefill_chunk
    flipped = running.with_request(0, is_prefill_chunk=False)
    assert not _recurs(running, flipped) and _recurs(running, running)


# --- on vLLM itself (slow): the kept workloads, the ground truth and check-trace together


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("case, version, asynchronous", [
    (ABORTED_BEFORE_A_CALL, "0.34.0", False),       # r0 aborted before any call: no stall
    (ABORTED_BEFORE_A_CALL, "0.34.0", True),
    (EVICTED_WITH_ITS_SHARER, "0.34.0", True),     # r2 misses the evicted block
    (EVICTED_WITH_ITS_SHARER, "0.33.0", True),
    (SENT_THEN_ABORTED, "0.34.0", True),           # r3 aborted after the send, before a call
    (SENT_THEN_ABORTED, "0.33.0", True),
    (PAUSED_PARKED, "0.33.0", True),               # paused, a parked session and a new request: no stall
], ids=["aborted_sync", "aborted_async", "evicted_034", "evicted_033", "sent_034", "sent_033", "paused_033"])
def test_vllm_replays_the_correct_run_and_check_trace_accepts_it(
        running: Workers, case: KeptCase, version: str, asynchronous: bool) -> None:
    from flightcheck.vllm.campaign import ReplayJob, replay_workload

    raw = dict(case.raw(), config=dict(case.raw()["config"], async_scheduling=asynchronous))
    replayed = replay_workload(running[version], ReplayJob(version, asynchronous, 0, raw, raw.get("seed", 0)))
    if version == "0.34.0" and asynchronous == bool(case.raw()["config"].get("async_scheduling")):
        assert replayed.result["batches"] == case.result()["batches"]      # the kept run, batch for batch
    assert replayed.result["ending"] == "done" and findings(replayed.result) == []
    assert replayed.category == "accepted, correct run", replayed.detail


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_goes_round_the_loop_again_and_both_name_it(running: Workers) -> None:
    from flightcheck.vllm.campaign import ReplayJob, replay_workload

    raw = LASSO_BUT_FOR_A_FLAG.raw()
    replayed = replay_workload(running["0.33.0"], ReplayJob("0.33.0", False, 0, raw, raw.get("seed", 0)))
    assert replayed.result["batches"] == LASSO_BUT_FOR_A_FLAG.result()["batches"]
    assert replayed.result["ground_truth"]["admission_livelocks"] \
        == LASSO_BUT_FOR_A_FLAG.result()["ground_truth"]["admission_livelocks"]
    assert replayed.category == "rejected, real bug" and "L4_no_livelock" in replayed.detail, replayed.detail
