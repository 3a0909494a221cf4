"""Streaming sessions whose client never sends the end of the session
(session_workload.py `"client_ends": false`; session_generate.py draws one
session in CLIENT_GOES_AWAY_ONE_IN so): the run ends with the session parked
in WAITING_FOR_STREAMING_REQ. vLLM 0.33.0/0.34.0 `get_num_unfinished_requests`
leaves parked sessions out, so the engine stops stepping when nothing else
is unfinished (the run ends `done`), or spins idle for ever on requests that
only what the parked session holds (its seat, its blocks) keeps from
admission (the replay ends `stuck`). Both are the client's wait, not a stall
(spec/deadlock.py, L2's rule): the ground truth (run_endings.py
`left_to_clients`) and check-trace (sessions.py `_left_to_clients`, spec
`idles_on_clients`) must both say so, and both must still call a stall
beside such a session a stall.

Before: every replay that ended `stuck` so was a finding of the ground
truth, which check-trace accepted ("accepted, MISSED bug": 16 of the 480
runs of `campaign --versions 0.34.0,0.33.0 --all-features --workloads 120
--seed 1`), with a KV connector KV4's end check counted the parked
session's blocks as leaked, and check-trace accepted a run ending with a
session parked beside a request that schedule would have admitted (the
hand-written `_STALL` trace below).

Kept (tests/data/vllm/session-never-ended/, vLLM 0.34.0 sync, the
workloads as `campaign_workloads(1, ..., features_of="0.34.0")` draws them):
* `034_parked_session_holds_the_blocks_seed1_54`: r1, never ended, parks
  on EOS holding 8 of 15 blocks; the preempted r2 needs its whole 8
  (`scheduler_reserve_full_isl`) with 7 free, and r0 waits behind it.
* `034_kv_parked_session_holds_the_seat_seed1_58`: with a KV connector, r1
  parks on the one seat (max_num_seqs 1) holding 8 blocks; r2's async
  load waits.
* `033_spec2_only_a_parked_session_left_seed1_78` (`--spec-tokens 2`, vLLM
  0.33.0 async; the workload alone): r3, never ended, is left parked after
  r1's KV send is reported. vLLM's engine drained its empty batches and
  ended `done`; the reference's, which counted the step reporting the send
  as idle, reached the busy loop's idle count first and ended `stuck`
  (parked sessions counted unfinished): the differential's one UNEXPLAINED
  on the campaign. run_endings.idle_ending first called any idle end with
  only parked sessions left `done` (an allowance that hid the difference);
  now the reference's engine counts that step as vLLM's does (reference_run
  `_ReferenceSide.kv_reported`) and idle_ending is back to `done` only with
  nothing left.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from flightcheck.verification.traces.check import check_events, check_trace
from flightcheck.verification.traces.ground_truth import expected_verdict
from flightcheck.verification.traces.reading import read_trace_file
from flightcheck.vllm import reference_run, session_generate
from flightcheck.vllm.campaign import Replayed, ReplayJob, replay_workload, with_async_scheduling
from flightcheck.vllm.generate import campaign_workloads
from flightcheck.vllm.inputs import session_inputs
from flightcheck.vllm.replay import findings
from flightcheck.vllm.run_endings import idle_ending, left_to_clients
from flightcheck.vllm.reference_run import run_reference
from flightcheck.vllm.versions import RELEASES
from flightcheck.vllm.workload import WorkloadError, workload_from_json

from .vllm_support import Workers, workers

pytestmark = pytest.mark.usefixtures("both_checkers")

DATA = Path(__file__).parent / "data" / "vllm" / "session-never-ended"
HOLDS_BLOCKS = "034_parked_session_holds_the_blocks_seed1_54"
KV_HOLDS_SEAT = "034_kv_parked_session_holds_the_seat_seed1_58"
ONLY_PARKED_SPEC2 = "033_spec2_only_a_parked_session_left_seed1_78"


# --- the workload format and the generator


def _workload(session: dict[str, Any]) -> dict[str, Any]:
    return {"name": "never-ended", "seed": 3,
            "config": {"num_stages": 1, "max_num_batched_tokens": 8, "max_num_seqs": 2, "block_size": 2,
                       "num_blocks": 9, "max_model_len": 16},
            "requests": [{"id": "s", "prompt_len": 2, "max_tokens": 1, "session": session}]}


def test_a_session_whose_client_never_ends_it_has_no_end_input() -> None:
    ended = workload_from_json(_workload({"inputs": [{"step": 3, "tokens": 2, "max_tokens": 1}], "end_step": 5}))
    never = workload_from_json(_workload({"inputs": [{"step": 3, "tokens": 2, "max_tokens": 1}],
                                          "client_ends": False}))
    assert [inp.ends_session for inp in ended.requests[0].session] == [False, True]
    assert [inp.ends_session for inp in never.requests[0].session] == [False]
    assert [(step, spec.resumable) for step, _, _, spec in session_inputs(never, 2)] == [(3, True)]
    assert never.requests[0].session[0] == ended.requests[0].session[0]
    with pytest.raises(WorkloadError, match="no 'end_step'"):
        workload_from_json(_workload({"inputs": [], "client_ends": False, "end_step": 4}))
    with pytest.raises(WorkloadError, match="true or false"):
        workload_from_json(_workload({"inputs": [], "client_ends": 0}))


def _as_if_every_client_ended(workloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The workloads with each never-ended session's `client_ends` dropped
    and its `end_step` left out (both sides compared so)."""
    plain = json.loads(json.dumps(workloads))
    for workload in plain:
        for request in workload["requests"]:
            session = request.get("session")
            if session is not None:
                session.pop("client_ends", None)
                session.pop("end_step", None)
    return plain


def test_the_generator_leaves_a_small_share_of_sessions_unended_from_its_own_stream(
        monkeypatch: pytest.MonkeyPatch) -> None:
    drawn = campaign_workloads(1, 120, features_of="0.34.0")
    sessions = [r["session"] for w in drawn for r in w["requests"] if "session" in r]
    never = [s for s in sessions if s.get("client_ends") is False]
    assert all("end_step" not in s for s in never) and all("end_step" in s for s in sessions if s not in never)
    assert len(sessions) / 16 <= len(never) <= len(sessions) / 4      # one in CLIENT_GOES_AWAY_ONE_IN = 8
    monkeypatch.setattr(session_generate, "_client_goes_away", lambda workload, request: False)
    every_end = campaign_workloads(1, 120, features_of="0.34.0")
    assert not any(r["session"].get("client_ends") is False for w in every_end for r in w["requests"]
                   if "session" in r)
    assert _as_if_every_client_ended(drawn) == _as_if_every_client_ended(every_end)   # no other draw moved


# --- check-trace on hand-written traces (vLLM 0.34.0's profile, sync, one stage)

_CONFIG = {"ev": "config", "num_stages": 1, "max_num_batched_tokens": 8, "max_num_seqs": 1, "block_size": 2,
           "num_blocks": 9, "usable_blocks": 8, "max_model_len": 8, "long_prefill_token_threshold": 0,
           "num_spec_tokens": 0, "prefix_caching": False, "policy": "continue-prefill", "num_preallocate_tokens": 0,
           "vllm_version": "0.34.0", "writer": "hand", "streaming_sessions": True}
_SESSION = [  # s arrives resumable, runs its one token and parks; its client never sends the end
    {"ev": "arrive", "req": "s", "prompt_len": 2, "max_tokens": 1, "prompt_token_ids": [5336, 93],
     "eos_token_id": None, "ignore_eos": True, "stop_token_ids": [], "resumable": True},
    {"ev": "schedule", "batch": 1, "preempted": [], "entries": [
        {"req": "s", "start": 0, "n": 2, "cached": 0, "drafts": 0, "samples": True, "block_ids": [1]}]},
    {"ev": "complete", "batch": 1, "tokens": {"s": [20570]}}]
_R = {"ev": "arrive", "req": "r", "prompt_len": 3, "max_tokens": 2, "prompt_token_ids": [19456, 31376, 29652],
      "eos_token_id": None, "ignore_eos": True, "stop_token_ids": []}
_END = {"ev": "end"}
_ONLY_PARKED = [_CONFIG, *_SESSION, _END]
_HOLDS_SEAT = [_CONFIG, *_SESSION, _R, _END]                   # r waits for the one seat s holds
_STALL = [{**_CONFIG, "max_num_seqs": 2}, *_SESSION, _R, _END]  # a seat and blocks free: r should run


@pytest.mark.parametrize("events", [_ONLY_PARKED, _HOLDS_SEAT], ids=["only-parked", "holds-the-seat"])
def test_check_trace_accepts_a_run_that_ends_waiting_on_a_never_ended_session(events: list[dict]) -> None:
    result = check_events([dict(e) for e in events], None)
    assert result.ok, result.message


def test_check_trace_rejects_a_stall_beside_a_never_ended_session() -> None:
    result = check_events([dict(e) for e in _STALL], None)
    assert (result.ok, result.property, result.event_index) == (False, "L2_no_deadlock", len(_STALL) - 1)
    assert 'would schedule ["r"@0+3]' in (result.message or "")


@pytest.mark.parametrize("stem", [HOLDS_BLOCKS, KV_HOLDS_SEAT])
def test_check_trace_accepts_vllms_kept_runs_that_end_on_a_never_ended_session(stem: str) -> None:
    events = read_trace_file(str(DATA / f"{stem}.jsonl"))
    raw = json.loads((DATA / f"{stem}.workload.json").read_text())
    (never,) = [r["id"] for r in raw["requests"] if r.get("session", {}).get("client_ends") is False]
    assert not any(e["ev"] == "input" and e["req"] == never and e.get("end_of_session") for e in events)
    assert events[-1]["ev"] == "end"
    assert check_trace(DATA / f"{stem}.jsonl").ok


# --- the ground truth's reading


def _vllm(waiting: list[str], parked: list[str], seats: int, running: list[str] = ()) -> SimpleNamespace:
    """vLLM 0.34's scheduler as run_endings/session_idles read it: block size
    2, 8 blocks free, each request 4 tokens, each parked session 2 blocks."""
    def request(req_id: str, status: str) -> SimpleNamespace:
        return SimpleNamespace(request_id=req_id, status=SimpleNamespace(name=status), num_tokens=4,
                               num_computed_tokens=2 if status != "WAITING" else 0, num_stale_output_tokens=0)
    queued = [request(r, "WAITING") for r in waiting]
    holding = [request(r, "WAITING_FOR_STREAMING_REQ") for r in parked]
    runs = [request(r, "RUNNING") for r in running]
    tables = {r: [SimpleNamespace(block_id=10 * i + b, ref_cnt=1) for b in range(2)] for i, r in enumerate(parked)}
    manager = SimpleNamespace(block_pool=SimpleNamespace(get_num_free_blocks=lambda: 8), max_model_len=16,
                              get_blocks=lambda req_id: SimpleNamespace(blocks=(tables.get(req_id, []),)))
    return SimpleNamespace(waiting=queued, kv_holding_waiting=holding, running=runs,
                           requests={r.request_id: r for r in queued + holding + runs},
                           num_waiting_for_streaming_input=len(holding), max_num_active_reqs=seats, block_size=2,
                           max_num_scheduled_tokens=8, max_model_len=16, num_lookahead_tokens=0,
                           scheduler_config=SimpleNamespace(long_prefill_token_threshold=0),
                           scheduler_reserve_full_isl=True, kv_cache_manager=manager)


def test_the_ground_truth_leaves_an_end_to_the_parked_sessions_clients_only_where_theirs() -> None:
    assert left_to_clients(_vllm([], ["s"], seats=2)) == ["s"]                  # nothing else unfinished
    assert left_to_clients(_vllm(["r"], ["s"], seats=1)) == ["s"]               # s holds the one seat
    assert left_to_clients(_vllm(["r"], ["s"], seats=2)) == []                  # a seat free: r's stall
    assert left_to_clients(_vllm([], ["s"], seats=2, running=["x"])) == []      # x runs: a stall
    assert left_to_clients(_vllm(["r"], [], seats=1)) == []                     # none parked


def test_an_idle_end_is_done_only_with_nothing_unfinished() -> None:
    """The busy loop's idle count ends a run `done` only where nothing is
    left (0.8.4's closed gate); a parked session left is not special there:
    vLLM 0.33/0.34 leaves it out of `has_requests()`, so an engine left
    with parked sessions alone stops at the top of the loop once its queue
    drains, before the idle count, on vLLM's side and now on the
    reference's (the next test)."""
    assert idle_ending(_vllm([], [], seats=2), 0) == ("done", [])
    assert idle_ending(_vllm([], ["s"], seats=2), 0) == ("stuck", ["s"])
    assert idle_ending(_vllm(["r"], ["s"], seats=1), 0) == ("stuck", ["r", "s"])
    assert idle_ending(_vllm([], [], seats=1, running=["x"]), 0) == ("stuck", ["x"])
    assert idle_ending(_vllm([], [], seats=2), 1) == ("stuck", [])


def test_the_reference_counts_the_step_reporting_a_finished_send_as_vllm_does(monkeypatch) -> None:
    """ONLY_PARKED_SPEC2 on the reference alone (0.33.0 async): its engine
    counts the step whose output reports r1's finished send as news, as the
    bridge's does (`KVWorker.attach`; vLLM 0.33 `_update_from_kv_xfer_finished`
    frees the blocks and forgets r1, so `has_requests()` turns false), and
    ends `done` when its queue drains, as vLLM did. With that step counted
    idle (the reference before), the idle count comes first: `stuck`."""
    raw = with_async_scheduling(json.loads((DATA / f"{ONLY_PARKED_SPEC2}.workload.json").read_text()))
    profile = RELEASES["0.33.0"].async_profile
    assert run_reference(raw, profile, vllm_outputs=True).ending == "done"
    assert run_reference(raw, profile).ending == "done"
    update = reference_run._ReferenceSide.update_from_output

    def counted_idle(self: Any, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = update(self, scheduler_output, model_runner_output)
        self.kv_reported = False
        return outputs

    monkeypatch.setattr(reference_run._ReferenceSide, "update_from_output", counted_idle)
    assert run_reference(raw, profile, vllm_outputs=True).ending == "stuck"


def _result(ending: str, parked: list[str]) -> dict[str, Any]:
    return {"ending": ending, "unfinished": ["r", "s"], "batches_in_flight": 0, "left_to_clients": parked,
            "ground_truth": {"stale_tokens": [], "partial_chunk_tokens": [], "in_flight_set_mismatches": []}}


def test_a_stuck_end_left_to_clients_is_no_finding_and_a_legal_trace() -> None:
    events = [dict(e) for e in _HOLDS_SEAT]
    assert findings(_result("stuck", ["s"])) == []
    assert expected_verdict(_result("stuck", ["s"]), events).kind == "legal"
    assert findings(_result("stuck", [])) == ["the run ended stuck (r, s)"]
    assert expected_verdict(_result("stuck", []), events).kind == "stuck"
    assert findings(_result("exception", ["s"])) == ["the run ended exception (r, s)"]   # only a stuck end


# --- on vLLM itself (slow): the kept generated cases, the ground truth and check-trace together


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


def _replayed(running: Workers, async_scheduling: bool, stem: str) -> Replayed:
    raw = json.loads((DATA / f"{stem}.workload.json").read_text())
    raw = with_async_scheduling(raw) if async_scheduling else raw
    return replay_workload(running["0.34.0"], ReplayJob("0.34.0", async_scheduling, 0, raw, raw["seed"]))


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("stem,never,waiting", [(HOLDS_BLOCKS, "r1", ["r0", "r2"]), (KV_HOLDS_SEAT, "r1", ["r2"])])
def test_vllm_idles_on_a_never_ended_session_and_both_sides_call_it_its_clients_wait(
        running: Workers, async_scheduling: bool, stem: str, never: str, waiting: list[str]) -> None:
    replayed = _replayed(running, async_scheduling, stem)
    result = replayed.result
    assert result["ending"] == "stuck" and result["unfinished"] == sorted([never, *waiting])
    assert result["left_to_clients"] == [never] and result["stalls"] == []
    assert not result["ground_truth"].get("kv_blocks_leaked_at_end")       # KV4: the parked session's blocks
    assert findings(result) == []
    assert replayed.category == "accepted, correct run", replayed.detail
    assert replayed.comparison is None or replayed.comparison.equal, replayed.comparison.describe()


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_and_the_reference_end_done_with_only_a_never_ended_session_left(running: Workers) -> None:
    raw = with_async_scheduling(json.loads((DATA / f"{ONLY_PARKED_SPEC2}.workload.json").read_text()))
    replayed = replay_workload(running["0.33.0"], ReplayJob("0.33.0", True, 0, raw, raw["seed"]))
    assert replayed.result["ending"] == "done" and replayed.result["left_to_clients"] == ["r3"]
    assert replayed.category == "accepted, correct run", replayed.detail
    assert replayed.comparison is not None and replayed.comparison.equal, replayed.comparison.describe()
