"""What `flightcheck vllm campaign --versions 0.34.0 --all-features` found on
vLLM 0.34.0's real scheduler over seeds 100 on (the flag mixes in each
case's name); each kept trace is vLLM's, its workload beside it.

* sync, `--spec-tokens 3 --stages 1`, seed 103 index 1
  (`034_sync_fail_policy_frees_after_the_outputs`): under the connector's
  fail policy r0's sync load fails in the output where r2 finishes by its
  length. vLLM's `Scheduler.update_from_output` frees r2's table inside its
  output loop and finishes r0 (`finish_requests(error_req_ids,
  FINISHED_ERROR)`) after it, so r0's uncached blocks go to the head of the
  free queue ahead of r2's (`BlockPool.free_blocks` prepends them), and r1
  later gets blocks 4 and 3. The spec freed r0 at the failure, before the
  output: a false S9_kv_ownership. Ours: the fail policy's table waits for
  the end of its output's update (spec/kv_fence.py, `error_frees`).
* 0.33.0 sync, the same flags, seed 103 index 35
  (`033_sync_fail_policy_joint_failures_evict_then_finish`): two sync
  loads fail in one output, r0's from its fourth block and r2's from its
  first, which r0 shares. vLLM's `_update_requests_with_invalid_blocks`
  collects both invalid tails for eviction (r0's own from its fourth
  block) before `finish_requests` frees either; the spec finished r0 as a
  holder of r2's failure and then took r0's own failure as one of a
  finished request, leaving r0's tail cached: its blocks went to the back
  of the free queue (a false S9_kv_ownership, on lead too). Ours:
  `fail_kv_output` evicts every failed load's tail first, then finishes in
  the scan order (spec/kv_reports.py).
* async, `--spec-tokens 2 --stages 3`, seed 105 index 51
  (`034_async_abort_in_wait_before_grammar_error`): r2's grammar failed;
  four empty batches fill the queue (depth 4), and r2's abort arrives while
  the engine waits for the oldest one's output (0.34's `_wait_for_output`),
  before the update that would finish r2 by FINISHED_ERROR. check-trace
  completed that empty batch as soon as the noted calls filled the queue,
  before the abort: a false finish_decision. Ours: calls noted on an event
  that is no schedule leave a full queue full (verification/traces/
  asynchronous.py `_replay_empty_calls(make_room=False)`). The empty
  batches the checker completes there to make room are its own slack and
  finish no failed grammar (`_drain_unnoted_empty_batches`): without that,
  seed 112 index 76 (`--reuse-ids --spec-tokens 2 --stages 2`, async,
  `034_async_grammar_error_after_slack_empty_batches`), accepted before,
  was rejected (finish_decision).
* sync and async, `--spec-tokens 2`, seed 101 index 75
  (`034_sync_stall_ended_by_an_abort`): vLLM never admits r2, an async
  load whose sequence needs the whole pool (4 blocks) beside the one spec
  step it reserves for itself (`Scheduler.schedule`'s `reserved_blocks`:
  `_spec_decode_step_blocks`; `KVCacheManager.allocate_slots` returns
  None), and the waiting loop's `break` holds r1 behind it: nothing runs
  until r2's abort. check-trace rejects L2_no_deadlock; the ground truth
  saw no bug (the abort ended the idle, so the run was not `stuck`): a
  false verdict of the ground truth. Ours: an idle only an input ends is a
  stall (flightcheck/vllm/run_endings.py `stalled_until_input`), and
  vLLM's liveness bug is named (docs/vllm-kv-connector-findings.md,
  Finding 6); cut to two requests
  (`034_async_load_never_fits_beside_its_spec_step`, 0.33.0 and 0.34.0,
  sync and async).
* async, `--spec-tokens 2 --all-features`, seed 49 index 76 (0.33.0 and
  0.34.0, the same trace; `03x_async_finished_ids_keep_paused_calls`):
  under PAUSED_NEW vLLM calls `schedule()` at steps 4 and 7 with only
  queued requests, because a request finished just before (r2 by its
  failed grammar, r3 by its abort): `Scheduler.has_requests` is also true
  while `has_finished_requests` (`_free_request` adds the id to
  `finished_req_ids`, the next `schedule()` clears it). The spec leaves
  that set out, so the checker did not queue those two noted empty batches
  there but at the next batch's catch-up, where they filled the queue: the
  slack completion that made room for batch 2 finished the new r2 (its
  grammar failed, seen by batch 1's waiting loop) an update early, and the
  threshold of 6 was dropped for a lone request (r1@6+8 against vLLM's
  r1@6+6, a false schedule_decision). The checker now queues a noted empty
  call after a finish event with no call since (asynchronous.py
  `_empty_call`); vLLM scheduling 8 there is rejected.
* `--spec-tokens 3 --stages 1`, seed 103 index 29 (sync and async) and
  index 76 (async: an unexplained run of the differential, vLLM having
  crashed where the reference schedules; now the named deviation
  `padded_admission_cut_by_threshold`, tests/test_vllm_padded_admission.py):
  vLLM 0.33.0 and 0.34.0 fail their
  own assertion in `Scheduler.schedule`'s waiting loop (`assert
  num_new_tokens == 1 + self.num_spec_tokens`, 0.34.0 line 1643): an
  admission with one token left after its prefix hit is padded to 1 + k
  tokens and then cut to `long_prefill_token_threshold` (applied with
  chunked prefill and more than one eligible request), which is below
  1 + k. A crash inside `schedule()` leaves nothing wrong in the trace
  before it (check-trace: liveness unchecked, the known miss of such
  crashes); kept as a vLLM finding with its smallest workload
  (`prefix-hit-padded-past-long-prefill-threshold`, slow, `vllm`).
* 0.33.0 async, `--all-features --spec-tokens 3 --stages 1`, seed 103
  index 64 (`033_async_session_end_under_paused_all_calls_once`; 0.34.0
  replays the workload alike): r1's streaming session ends while it waits
  for its client, under PAUSED_ALL. vLLM's `Scheduler.add_request` finishes
  it (`finish_requests(FINISHED_ABORTED)`; `_free_request` adds its id to
  `finished_req_ids`), so `has_requests()` stays true and the engine calls
  `schedule()` once more under PAUSED_ALL (empty batch 4, noted on the
  pause event after). The `input` event stands for that finish and no
  `finish` event follows, so the checker took no call to be due: it queued
  that empty batch at batch 3's catch-up, ahead of batch 3, where the
  queue was full when the call noted before batch 3's completion came; that
  call never met r2's failed grammar, and vLLM's finish of r2 by
  FINISHED_ERROR at batch 3's update was a false finish_decision. Ours: an
  input that ends a session counts as a finish for that call
  (verification/traces/sessions.py `_on_input`).
* 0.33.0 async, the same flags, seed 103 index 27
  (`033_async_short_stall_ended_by_an_abort`; 0.34.0 alike): Finding 6 on
  a one-block pool: r0's async load never fits beside its spec step; after
  r2 finishes, nothing is scheduled for two steps until r0's abort.
  check-trace rejects L2_no_deadlock at r2's completion; the ground truth
  named no stall, the idle being shorter than the busy loop's count (a
  false verdict of the ground truth). Ours: an idle an input ends sooner
  is asked of vLLM itself, by replaying the workload without the inputs
  from there on (flightcheck/vllm/run_endings.py `short_idle`,
  replay_worker.py `_stays_idle`): it ends `stuck`, so the idle is a stall.
* `--reuse-ids`, seeds 104 index 48, 108 index 63 and 112 index 28 (sync
  and async): vLLM's "duplicate request id" assertion, the generator's
  error: the streaming sessions' feature moved the aborted request's
  arrival past its abort, which then aborted nothing, and the request
  reusing its id arrived while it was live. The generator now aborts it as
  it arrives (generate.py `_reuses_after_their_aborts`).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from flightcheck.verification.traces.stream import check_lines, open_lines
from flightcheck.vllm.generate import campaign_workloads
from flightcheck.vllm.run_endings import stalled_until_input

from .vllm_support import require_venv

pytestmark = pytest.mark.usefixtures("both_checkers")   # check-trace on vLLM's traces

DATA = Path(__file__).parent / "data" / "vllm" / "hunt34"
FAIL_POLICY = "034_sync_fail_policy_frees_after_the_outputs_seed103_1"
JOINT_FAILURES = "033_sync_fail_policy_joint_failures_evict_then_finish_seed103_35"
ABORT_IN_WAIT = "034_async_abort_in_wait_before_grammar_error_seed105_51"
SLACK_BATCHES = "034_async_grammar_error_after_slack_empty_batches_seed112_76"
NEVER_FITS = "034_async_load_never_fits_beside_its_spec_step"
STALL_ENDED_BY_ABORT = "034_sync_stall_ended_by_an_abort_seed101_75"
PADDED_PAST_THRESHOLD = "prefix-hit-padded-past-long-prefill-threshold"
FINISHED_IDS = "{}_async_finished_ids_keep_paused_calls_seed49_76"
SESSION_END = "033_async_session_end_under_paused_all_calls_once_seed103_64"
SHORT_STALL = "033_async_short_stall_ended_by_an_abort_seed103_27"


def _events(stem: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (DATA / f"{stem}.jsonl").read_text().splitlines() if line.strip()]


def _verdict(events: list[dict[str, Any]]) -> tuple[bool, str | None, int | None]:
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "trace.jsonl"
        path.write_text("".join(json.dumps(e) + "\n" for e in events))
        with open_lines(str(path)) as lines:
            final = list(check_lines(lines, None))[-1]
    assert final.result is not None, final.malformed
    result = final.result.to_json()
    return result["ok"], result.get("property"), result.get("line")


def test_a_fail_policy_table_is_freed_after_the_outputs_finishes():
    assert _verdict(_events(FAIL_POLICY)) == (True, None, None)


def test_a_fail_policy_table_freed_before_the_outputs_finishes_is_rejected():
    # the order the spec took before: r0's blocks freed at its failure, ahead of r2's
    events = _events(FAIL_POLICY)
    r1 = next(e for e in events if e["ev"] == "schedule" and e["entries"] and e["entries"][0]["req"] == "r1")
    assert r1["entries"][0]["block_ids"] == [4, 3]
    r1["entries"][0]["block_ids"] = [2, 4]
    assert _verdict(events) == (False, "S9_kv_ownership", 15)


def test_joint_fail_policy_failures_evict_every_tail_before_the_frees():
    assert _verdict(_events(JOINT_FAILURES)) == (True, None, None)
    events = _events(JOINT_FAILURES)         # r0's tail left cached would give r1 block 5 first
    r1 = next(e for e in events if e["ev"] == "schedule" and e["entries"] and e["entries"][0]["req"] == "r1")
    assert r1["entries"][0]["block_ids"] == [8, 7, 6, 3, 2, 1]
    r1["entries"][0]["block_ids"] = [5, 4, 3, 2, 1, 8]
    assert _verdict(events) == (False, "S9_kv_ownership", 11)


def test_an_abort_during_the_wait_comes_before_the_grammar_error_finish():
    assert _verdict(_events(ABORT_IN_WAIT)) == (True, None, None)


def test_a_grammar_error_finishes_at_its_noted_completion_behind_slack_empty_batches():
    assert _verdict(_events(SLACK_BATCHES)) == (True, None, None)


def test_an_abort_after_the_empty_batchs_update_finds_the_grammar_error_finished():
    # the oldest empty batch's completion noted before the abort: its update
    # finished r2 by FINISHED_ERROR, so a finish by abort is wrong
    events = _events(ABORT_IN_WAIT)
    abort = next(e for e in events if e["ev"] == "abort" and e["req"] == "r2")
    failed = next(e for e in events if e["ev"] == "kv_failed")
    abort["empty_batches_before"].append(failed["empty_batches_before"].pop(0))
    assert _verdict(events) == (False, "finish_decision", 10)


@pytest.mark.parametrize("version", ["033", "034"])
def test_empty_calls_kept_by_finished_ids_under_paused_new_leave_the_threshold(version):
    assert _verdict(_events(FINISHED_IDS.format(version))) == (True, None, None)


@pytest.mark.parametrize("version", ["033", "034"])
def test_a_chunk_past_the_threshold_while_the_failed_grammar_waits_is_rejected(version):
    # r2 (grammar failed, seen by batch 1's waiting loop) still counts as
    # waiting at batch 2: running + waiting = 2 keeps the threshold of 6
    events = _events(FINISHED_IDS.format(version))
    batch2 = next(e for e in events if e["ev"] == "schedule" and e.get("batch") == 2)
    assert (batch2["entries"][0]["start"], batch2["entries"][0]["n"]) == (6, 6)
    batch2["entries"][0]["n"] = 8
    assert _verdict(events) == (False, "schedule_decision", 17)


@pytest.mark.parametrize("stem,line", [(NEVER_FITS, 2), (STALL_ENDED_BY_ABORT, 7)])
def test_vllms_stall_behind_a_load_that_never_fits_is_rejected(stem, line):
    assert _verdict(_events(stem)) == (False, "L2_no_deadlock", line)


def test_the_end_of_a_waiting_session_calls_schedule_once_under_paused_all():
    assert _verdict(_events(SESSION_END)) == (True, None, None)


def test_a_call_under_paused_all_with_no_finish_to_flush_is_rejected():
    # the session's end after the pause's noted call: nothing was finished
    # when vLLM called, so it would not have called (the checker leaves the
    # call out, and batch 3's update meets no failed grammar)
    events = _events(SESSION_END)
    at = next(i for i, e in enumerate(events) if e["ev"] == "input")
    end = events.pop(at)
    events[at]["empty_batches_before"] = end.pop("empty_batches_before")      # onto the pause (all)
    paused_call = next(i for i, e in enumerate(events)
                       if any(n.get("empty_batch") == 4 for n in e.get("empty_batches_before", [])))
    events.insert(paused_call + 1, end)
    assert _verdict(events) == (False, "finish_decision", 20)


def test_a_grammar_error_finished_with_no_call_meeting_it_is_rejected():
    events = _events(SESSION_END)
    batch3 = next(e for e in events if e["ev"] == "complete" and e.get("batch") == 3)
    assert [n["ev"] for n in batch3.pop("empty_batches_before")] == ["schedule"]
    assert _verdict(events) == (False, "finish_decision", 20)


def test_a_stall_shorter_than_the_idle_count_is_rejected():
    # check-trace's side of seed 103 index 27: after r2's completion nothing
    # is in flight and r0's load never fits (the ground truth's: slow, below)
    assert _verdict(_events(SHORT_STALL)) == (False, "L2_no_deadlock", 17)


def _scheduler(pause: str = "UNPAUSED", session: bool = False) -> SimpleNamespace:
    def request(req_id: str, status: str) -> SimpleNamespace:
        return SimpleNamespace(request_id=req_id, status=SimpleNamespace(name=status))
    waiting = [request("r1", "WAITING")]
    requests = {r.request_id: r for r in waiting}
    if session:
        requests["s"] = request("s", "WAITING_FOR_STREAMING_REQ")
    return SimpleNamespace(waiting=waiting, running=[], requests=requests, pause_state=SimpleNamespace(name=pause))


def test_an_idle_is_a_stall_unless_paused_or_only_sessions_wait_for_their_clients():
    assert stalled_until_input(_scheduler(), 2, 6) == [{"step": 2, "until": 6, "unfinished": ["r1"]}]
    assert stalled_until_input(_scheduler(pause="PAUSED_NEW"), 2, 6) == []
    # a parked session beside r1 holds nothing that stops it here (its seats
    # and blocks: tests/test_vllm_session_idles.py); alone, it is its client's
    assert stalled_until_input(_scheduler(session=True), 2, 6) == [
        {"step": 2, "until": 6, "unfinished": ["r1"], "parked": ["s"]}]
    alone = _scheduler(session=True)
    del alone.requests["r1"]
    alone.waiting = [alone.requests["s"]]          # the parked session waits in `waiting`, alone
    assert stalled_until_input(alone, 2, 6) == []
    # the reference's side wraps its scheduler
    assert stalled_until_input(SimpleNamespace(waiting=[], running=[], scheduler=_scheduler()), 2, 6) == []


@pytest.mark.parametrize("seed,index,spec_tokens", [(104, 48, 0), (108, 63, 3), (112, 28, 2)])
def test_a_reused_id_arrives_after_an_abort_that_finds_its_request(seed, index, spec_tokens):
    workload = campaign_workloads(seed, index + 1, reuse_ids=True, spec_tokens=spec_tokens, features_of="0.34.0",
                                  mid_step_inputs=True)[index]
    by_id = {r["id"]: r for r in workload["requests"]}
    reused = [(by_id[r["reuse_id"]], r) for r in workload["requests"] if "reuse_id" in r]
    assert reused and "streaming-sessions" in workload["features"]
    for old, new in reused:
        assert old["arrival_step"] <= old["abort_step"] <= new["arrival_step"]


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_finding_an_async_load_that_never_fits_stalls_vllm(version, async_scheduling):
    require_venv(version)
    from flightcheck.vllm.campaign import ReplayJob, replay_workload
    from flightcheck.vllm.replay import ReplayWorker

    raw = json.loads((DATA / f"{NEVER_FITS}.workload.json").read_text())
    raw["config"]["async_scheduling"] = async_scheduling
    with ReplayWorker(version) as worker:
        replayed = replay_workload(worker, ReplayJob(version, async_scheduling, 0, raw, 0))
    assert replayed.category == "rejected, real bug", replayed.detail
    # r0 idles from its arrival's own step, whose schedule() read it (run_endings.py
    # `IdleCount.quiet`); r1's arrival at step 1 splits the idle, each part a stall:
    # vLLM replayed without the inputs from step 1 on stays idle too (`short_idle`)
    assert replayed.result["stalls"] == [{"step": 0, "until": 1, "unfinished": ["r0"]},
                                         {"step": 1, "until": 6, "unfinished": ["r0", "r1"]}]
    assert replayed.detail.endswith("L2_no_deadlock")


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
def test_vllms_stall_ended_by_an_abort_before_the_idle_count_is_a_real_bug(version):
    require_venv(version)
    from flightcheck.vllm.campaign import ReplayJob, replay_workload
    from flightcheck.vllm.replay import ReplayWorker

    raw = json.loads((DATA / f"{SHORT_STALL}.workload.json").read_text())
    with ReplayWorker(version) as worker:
        replayed = replay_workload(worker, ReplayJob(version, True, 0, raw, 0))
    assert replayed.category == "rejected, real bug", replayed.detail
    # two idle steps, then r0's abort: vLLM replayed without it ends stuck
    assert replayed.result["stalls"] == [{"step": 10, "until": 12, "unfinished": ["r0"]}]
    assert replayed.detail.endswith("L2_no_deadlock")


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("stem,async_scheduling", [(FAIL_POLICY, False), (ABORT_IN_WAIT, True),
                                                          (JOINT_FAILURES, False),
                                                          (SLACK_BATCHES, True),
                                                          (FINISHED_IDS.format("034"), True),
                                                          (FINISHED_IDS.format("033"), True),
                                                          (SESSION_END, True)])
def test_the_cases_replayed_on_vllm_are_accepted_correct_runs(stem, async_scheduling):
    version = "0.33.0" if stem.startswith("033") else "0.34.0"
    require_venv(version)
    from flightcheck.vllm.campaign import ReplayJob, replay_workload
    from flightcheck.vllm.replay import ReplayWorker

    raw = json.loads((DATA / f"{stem}.workload.json").read_text())
    with ReplayWorker(version) as worker:
        replayed = replay_workload(worker, ReplayJob(version, async_scheduling, 0, raw, 0))
    assert replayed.category == "accepted, correct run", replayed.detail


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version,line", [("0.34.0", 1643), ("0.33.0", 1579)])
def test_finding_a_padded_admission_cut_by_the_long_prefill_threshold_crashes_vllm(version, line):
    require_venv(version)
    from flightcheck.vllm.replay import ReplayWorker

    raw = json.loads((DATA / f"{PADDED_PAST_THRESHOLD}.workload.json").read_text())
    with ReplayWorker(version) as worker:
        result = worker.replay(raw)
    assert result["ending"] == "exception"
    assert f"scheduler.py:{line} in schedule: assert num_new_tokens == 1 + self.num_spec_tokens" \
        in result["exception"]
