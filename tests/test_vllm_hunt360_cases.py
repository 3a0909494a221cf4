"""What the hunt over fresh seeds 331-360 found (campaigns of
`python -m flightcheck.vllm.campaign ... --reuse-ids --jobs 2 --no-mutants`,
the trace and workload of each case kept in tests/data/vllm/hunt360).

* A ground-truth gap, 0.34.0 and 0.33.0 alike, sync and async: a request
  whose grammar failed waits behind the one seat a parked streaming session
  holds (seed 331 index 12, `--versions 0.34.0,0.33.0 --all-features
  --spec-tokens 0 --stages 1`, sync: r1's grammar fails on arrival at engine
  step 10 while r2 runs on the one seat, r2 parks at step 11, r1 finishes
  with its error only after r2's session ends at step 13; seed 332 index 69,
  `--spec-tokens 1 --stages 2`, async: the new r0's grammar fails, r1 is
  parked). `Scheduler.schedule`'s waiting loop (0.33.0/0.34.0) admits nobody
  while `len(self.running) + self.num_waiting_for_streaming_input >=
  max_num_active_reqs`, so it never reaches r1, and it is
  `_handle_blocked_waiting_request`, on reaching it, that records the error
  (`grammar_compile_error_reqs`) the next `update_from_output` finishes it
  with. So the idle is the session's client's (docs/request-states.md,
  "Idles beside a parked session"), as check-trace's L2 read it; the ground
  truth took a failed grammar for held back, found no head for the seat to
  stop, and called the idle a stall (a miss). session_idles.py now reads a
  failed grammar as the head, held by the seats alone, asking no blocks
  (`_held_back`, `_grammar_failed`; tests/test_vllm_session_idles.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from flightcheck.spec import deadlock
from flightcheck.spec.schedule import is_empty_step, schedule
from flightcheck.verification.traces.check import check_trace
from flightcheck.verification.traces.reading import read_trace_file
from flightcheck.verification.traces.replay import TraceChecker
from flightcheck.vllm.campaign import Replayed, ReplayJob, replay_workload, with_async_scheduling

from .vllm_support import DATA, Workers, workers

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

HUNT = DATA / "hunt360"
GRAMMAR_SYNC = "034_sync_failed_grammar_behind_a_parked_seat_seed331_12"
GRAMMAR_ASYNC = "034_async_failed_grammar_behind_a_parked_seat_seed332_69"


def _events(stem: str) -> list[dict[str, Any]]:
    return read_trace_file(str(HUNT / f"{stem}.jsonl"))


def _last(events: list[dict[str, Any]], ev: str, req: str, **fields: object) -> int:
    return max(i for i, e in enumerate(events) if e["ev"] == ev and e.get("req") == req
               and all(e.get(k) == v for k, v in fields.items()))


@pytest.mark.parametrize("stem,failed,session", [(GRAMMAR_SYNC, "r1", "r2"), (GRAMMAR_ASYNC, "r0", "r1")])
def test_check_trace_accepts_a_failed_grammar_waiting_for_a_parked_sessions_seat(stem: str, failed: str,
                                                                                 session: str) -> None:
    events = _events(stem)
    assert events[0]["max_num_seqs"] == 1
    failed_at = _last(events, "grammar_failed", failed)          # the seed 332 r0's second request's
    end, finish = _last(events, "input", session, end_of_session=True), _last(events, "finish", failed)
    assert failed_at < end < finish and events[finish]["reason"] == "error"
    assert not any(e.get("batch") for e in events[end:])         # nothing but empty batches after the end
    assert check_trace(HUNT / f"{stem}.jsonl").ok
    checker = TraceChecker(events)                 # the state the end of the session found
    for event in events[1:end]:
        checker.feed(event)
    s, cfg = replace(checker.state, in_flight=()), checker.cfg     # only empty batches were in flight
    l2 = deadlock.l2_async_no_deadlock if events[0].get("async_scheduling") else deadlock.l2_no_deadlock
    assert is_empty_step(schedule(s, cfg)) and deadlock.parked_sessions_hold_the_way(s, cfg)
    assert l2(s, cfg)                              # by the session's seat alone


# --- on vLLM itself (slow): the kept workloads, the ground truth and check-trace together


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


def _replayed(running: Workers, version: str, async_scheduling: bool, stem: str) -> Replayed:
    raw = json.loads((HUNT / f"{stem}.workload.json").read_text())
    raw = with_async_scheduling(raw) if async_scheduling else raw
    return replay_workload(running[version], ReplayJob(version, async_scheduling, 0, raw, raw.get("seed", 0)))


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
@pytest.mark.parametrize("async_scheduling,stem", [(False, GRAMMAR_SYNC), (True, GRAMMAR_ASYNC)])
def test_vllm_finishes_the_failed_grammar_once_the_parked_seat_is_given_back(running: Workers, version: str,
                                                                             async_scheduling: bool,
                                                                             stem: str) -> None:
    replayed = _replayed(running, version, async_scheduling, stem)
    assert replayed.result["stalls"] == [] and replayed.result["ending"] == "done"
    assert replayed.category == "accepted, correct run", replayed.detail
