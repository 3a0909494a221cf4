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
* A reference gap (and the spec's alike), 0.34.0 and 0.33.0 sync: seed 333
  index 8 (`--all-features --spec-tokens 2 --stages 3`, the priority policy
  and a KV connector), unexplained on both. r3, a session of priority 1,
  parks in `kv_holding_waiting` ahead of r4 (priority 1, arrived after it,
  its async load landed); r3's input gives it the input's arrival time in
  place (`_update_request_as_session`), so the heap is out of order
  ("Finding: a session's input reorders a priority heap"), and a step later
  r0 is preempted: `_preempt_request` pushes it onto `self.waiting`, a heap
  of its own, and `kv_holding_waiting` keeps r3 at its root, so vLLM
  admits r3 (15 cached, 3 new) before r4. The reference re-sorted both
  queues on any push (reference/priority.py `_order_waiting`) and admitted
  r4 first; now a push sorts the queue it went onto (`_order_kv_holding`
  for a load started), as the spec does (spec/priority.py
  `in_priority_order`, `kv_holding_in_rank_order`, sessions.py
  `_in_rank_order`), which had the same re-sort (after SS5's rejection at
  the input, so check-trace's verdicts do not move).
* A ground-truth gap, 0.34.0 and 0.33.0 async: seed 335 index 35
  (`--all-features --async`, a KV connector under the recompute policy).
  r0's load fails whole after r0 was aborted; r4, whose prefix hit shares
  r0's blocks, is rolled back to 0 computed tokens and keeps the 3 output
  placeholders of its batch in flight (`_update_requests_with_invalid_blocks`,
  vLLM #49250 on a sharer), then is aborted at once, so no later breach
  showed it. check-trace rejects the trace at the `kv_failed` (KV3, its
  `holders`), counted a false rejection: the recorder checked the rollback's
  placeholders only on the request whose load failed; now on each holder
  too (kv_recording.py `_fc_write_failures`, `_fc_check_rollback`).
* A reference gap (and the spec's alike), 0.34.0 and 0.33.0 async: seed
  350 index 60 (`--kv-connector --async --spec-tokens 1 --stages 1`, a
  producer under the recompute policy). r0's own load fails from block 0;
  vLLM rolls it back to 0 computed tokens and keeps its placeholders
  (#49250, named), so the next batch's stop token finishes it.
  `_connector_finished` hands the connector the blocks that cover the
  computed tokens (`get_block_ids_for_computed_tokens`, 0.33.0/0.34.0):
  none, so nothing is sent (`held` false); the reference handed it the whole
  table and held it (unexplained after the named deviation). Now the
  reference hands the computed tokens' blocks (reference/kv_transfer.py
  `_connector_finished`) and the spec holds a table for a send only with a
  token computed (spec/kv_fence.py `holds_for_transfer`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from flightcheck.spec import Config, deadlock, priority
from flightcheck.spec.state import Request, State
from flightcheck.spec.schedule import is_empty_step, schedule
from flightcheck.verification.traces.check import check_trace
from flightcheck.verification.traces.reading import read_trace_file
from flightcheck.verification.traces.replay import TraceChecker
from flightcheck.vllm.campaign import Replayed, ReplayJob, replay_workload, with_async_scheduling
from flightcheck.vllm.ground_truth import Observations
from flightcheck.vllm.kv_recording import KVRecordingMixin
from flightcheck.vllm.differential import compare, decisions, first_difference, profile_for, read_trace
from flightcheck.vllm.reference_run import run_reference

from .vllm_support import DATA, Workers, workers

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

HUNT = DATA / "hunt360"
GRAMMAR_SYNC = "034_sync_failed_grammar_behind_a_parked_seat_seed331_12"
GRAMMAR_ASYNC = "034_async_failed_grammar_behind_a_parked_seat_seed332_69"
HEAP_LEFT = "034_sync_preemption_leaves_a_session_heap_unsorted_seed333_8"
SHARER = "034_async_sharer_keeps_placeholders_aborted_at_once_seed335_35"
ROLLED_BACK_SEND = "034_async_send_of_a_request_rolled_back_to_nothing_seed350_60"


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


def test_a_preemption_leaves_the_heap_a_sessions_input_unsorted_as_vllm_does() -> None:
    raw = json.loads((HUNT / f"{HEAP_LEFT}.workload.json").read_text())
    events = read_trace(HUNT / f"{HEAP_LEFT}.jsonl")
    theirs, profile = decisions(events), profile_for("0.34.0", False)
    admitted = next(d for d in theirs[24:] if d[0] == "schedule" and d[1])
    assert theirs[23] == ("schedule", (), ("r0",), ()) and [e[0] for e in admitted[1]] == ["r3"]
    reference, conforming = run_reference(raw, profile), run_reference(raw, profile, vllm_outputs=True)
    assert first_difference(theirs, decisions(conforming.events, block_offset=1)) is None
    # event 6 is a deviation (the name read off vLLM's full result: the slow test); nothing after it differs
    result = {"vllm_version": "0.34.0", "async_scheduling": False, "ending": "done", "ground_truth": {}}
    comparison = compare(raw["name"], result, events, reference, conforming)
    assert comparison.explained and (comparison.first_difference or "").startswith("event 6:"), comparison.describe()


def test_the_specs_push_onto_one_priority_heap_leaves_the_other_as_it_is() -> None:
    """r0 re-keyed in place behind r1 (its input taken in `kv_holding`), r2
    pushed onto `waiting`: `kv_holding` keeps r0 at its head; a push onto
    `kv_holding` sorts it."""
    cfg = Config(num_blocks=8, prefix_caching=False, profile="vllm-0.34", scheduling_policy="priority",
                 streaming_sessions=True)
    state = State(requests=(Request(priority=1),) * 3, waiting=(2,), kv_holding=(0, 1), arrivals=(1, 2, 0))
    assert priority.rank(state, 1) < priority.rank(state, 0)
    assert priority.in_priority_order(state, cfg).kv_holding == (0, 1)
    assert priority.ranked(state, "kv_holding").kv_holding == (1, 0)


class _FailureRecorder(KVRecordingMixin):
    """The recorder as far as `_fc_write_failures` reads it: r0's load
    failed (r0 finished), r4 was rolled back from 15 tokens for sharing its
    blocks (`_update_requests_with_invalid_blocks`' report)."""

    recompute_kv_load_failures = True

    def __init__(self, holder: SimpleNamespace, async_scheduling: bool) -> None:
        self.records_async_scheduling = async_scheduling
        self.flightcheck_step, self.flightcheck_observations = 22, Observations()
        self.requests, self.written = {"r4": holder}, []
        self._fc_kv_failures = [{"ev": "kv_failed", "req": "r0", "from_block": 0}]
        self._fc_kv_computed_before = {"r4": (holder, 15)}
        self._fc_kv_scanned_back, self._fc_in_flight, self._fc_holder_bases = frozenset({"r4"}), {}, {}

    def _fc_write(self, event: dict[str, Any]) -> None:
        self.written.append(event)

    def _fc_check_holder_base(self, *_: object) -> None:
        """(Its own rule: the base a holder's rollback assumed.)"""


@pytest.mark.parametrize("placeholders,async_scheduling,named", [(3, True, True), (0, True, False),
                                                                  (3, False, False)])
def test_a_sharers_rollback_that_keeps_placeholders_is_named(placeholders: int, async_scheduling: bool,
                                                             named: bool) -> None:
    holder = SimpleNamespace(is_finished=lambda: False, num_computed_tokens=0,
                             num_output_placeholders=placeholders)
    recorder = _FailureRecorder(holder, async_scheduling)
    recorder._fc_write_failures()
    (event,) = recorder.written
    assert event["holders"][0]["req"] == "r4"
    assert recorder.flightcheck_observations.kv_rollback_placeholders == (
        [{"step": 22, "req": "r4", "computed": 0, "placeholders": 3}] if named else [])


def test_check_trace_rejects_the_sharers_placeholders_at_the_failure() -> None:
    result = check_trace(HUNT / f"{SHARER}.jsonl")
    assert (result.ok, result.property, result.line) == (False, "KV3_rollback_restores_counters", 27)
    events = _events(SHARER)
    assert events[26]["holders"] == [{"req": "r4", "computed": 0, "placeholders": 3}]
    assert [(e["ev"], e.get("req")) for e in events[28:30]] == [("abort", "r4"), ("finish", "r4")]


def test_a_request_finished_with_nothing_computed_sends_nothing_as_vllm() -> None:
    raw = json.loads((HUNT / f"{ROLLED_BACK_SEND}.workload.json").read_text())
    events = read_trace(HUNT / f"{ROLLED_BACK_SEND}.jsonl")
    failed = next(e for e in events if e["ev"] == "kv_failed" and e["req"] == "r0")
    assert (failed["from_block"], failed["computed"], failed["placeholders"]) == (0, 0, 3)
    assert next(e for e in events if e["ev"] == "finish" and e["req"] == "r0")["held"] is False
    profile = profile_for("0.34.0", True)
    conforming = run_reference(raw, profile, vllm_outputs=True)
    assert first_difference(decisions(events), decisions(conforming.events, block_offset=1)) is None
    finish = next(e for e in conforming.events if e["ev"] == "finish" and e["req"] == "r0")
    assert finish["reason"] == "stop" and not finish.get("held")


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


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
def test_vllm_admits_the_session_its_unsorted_heap_holds_first_and_the_reference_follows(running: Workers,
                                                                                        version: str) -> None:
    replayed = _replayed(running, version, False, HEAP_LEFT)
    assert replayed.comparison is not None and replayed.comparison.explained, replayed.comparison.describe()
    assert replayed.comparison.deviation == "drafts_handed_over_at_submission", replayed.comparison.describe()


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
def test_vllm_keeps_a_sharers_placeholders_and_the_ground_truth_names_it(running: Workers, version: str) -> None:
    replayed = _replayed(running, version, True, SHARER)
    assert replayed.result["ground_truth"]["kv_rollback_placeholders"] == [
        {"step": 22, "req": "r4", "computed": 0, "placeholders": 3}]
    assert replayed.category == "rejected, real bug", replayed.detail


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
def test_vllm_sends_nothing_for_a_request_rolled_back_to_nothing_and_the_reference_follows(running: Workers,
                                                                                         version: str) -> None:
    replayed = _replayed(running, version, True, ROLLED_BACK_SEND)
    assert replayed.comparison is not None and replayed.comparison.explained, replayed.comparison.describe()
    assert replayed.category == "rejected, real bug", replayed.detail
