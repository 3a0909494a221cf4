"""Which idles beside a streaming session are the client's wait and which
are stalls (spec/deadlock.py, check-trace's L2; flightcheck/vllm/run_endings.py
and session_idles.py, vLLM's ground truth): the same rule on both sides.

A session parked for input (WAITING_FOR_STREAMING_REQ) keeps its KV blocks
and a seat (vLLM 0.33.0/0.34.0 `Scheduler.schedule`: `len(self.running) +
self.num_waiting_for_streaming_input >= max_num_active_reqs` admits nobody),
no LoRA slot (`scheduled_loras` reads `running` alone). An idle is its
client's when nothing but parked sessions is unfinished
(`get_num_unfinished_requests` leaves them out), or when nothing runs and
only what the parked sessions hold keeps the waiting loop from admitting;
any other idle is a stall. Before, any parked session made L2 hold, and the
ground truth judged no stall in a workload with sessions at all.

The kept traces (tests/data/vllm/session-idles/, vLLM 0.34.0):
* `034_async_only_a_parked_session_seed108_45`: campaign `--versions
  0.34.0,0.33.0 --all-features --async --seed 108` index 45: r1's turn ends
  and it parks; the empty batches still queued keep the engine stepping
  while nothing else is unfinished: a stall to a ground truth that counts
  r1 (it sits in `kv_holding_waiting`) once the workload-wide exemption
  is gone; vLLM's `get_num_unfinished_requests` does not count it.
* `034_async_parked_session_holds_the_blocks_seed108_31`: `--stages 1`
  index 31: r1 parks holding 6 of 17 blocks; r0 needs 12 free for its whole
  sequence (`scheduler_reserve_full_isl`) and 11 are: it waits for r1's
  client to end the session.
* `034_sync_parked_session_holds_the_seat` (session-parked-holds-the-seat.json):
  one seat, the parked session s holds it, r waits until s's end.
* `034_sync_stall_beside_a_parked_session` (session-stall-beside-a-parked-session.json):
  sessions a and b take their next inputs and need 2 more blocks each with
  none free (docs/request-states.md, "Two sessions that fill the pool
  between turns", vLLM's open PR #49439), while c, parked, holds 1 block:
  c's end would not admit either, so the idle is a stall, ended only by b's
  abort. Before, c's parking hid it from both sides.
* `034_sync_grammar_ready_behind_a_parked_seat_seed309_78` and
  `034_async_grammar_ready_behind_a_parked_seat_seed309_12`: campaign
  `--versions 0.34.0,0.33.0 --all-features --reuse-ids --seed 309` indexes
  78 (sync) and 12 (async, 0.34.0 and 0.33.0 alike): one seat, a session
  parked on it, and a structured request whose grammar has compiled. vLLM
  promotes a compiled grammar's request to WAITING only when its waiting
  loop reaches it (`_handle_blocked_waiting_request`), and the seat keeps
  the loop from reaching it, so its status still reads
  WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR: the ground truth took it for held
  back, found no head for the seat to stop, and judged a stall that
  check-trace (rightly) did not.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from flightcheck.spec import deadlock
from flightcheck.spec.schedule import is_empty_step, schedule
from flightcheck.verification.traces.check import check_trace
from flightcheck.verification.traces.reading import read_trace_file
from flightcheck.verification.traces.replay import TraceChecker, _Violation
from flightcheck.vllm.campaign import Replayed, ReplayJob, replay_workload, with_async_scheduling
from flightcheck.vllm.replay import findings
from flightcheck.vllm.run_endings import stalled_until_input
from flightcheck.vllm.session_idles import admission_head

from .vllm_support import Workers, workers

pytestmark = pytest.mark.usefixtures("both_checkers")

DATA = Path(__file__).parent / "data" / "vllm" / "session-idles"
ONLY_PARKED = "034_async_only_a_parked_session_seed108_45"
HOLDS_BLOCKS = "034_async_parked_session_holds_the_blocks_seed108_31"
HOLDS_SEAT = "034_sync_parked_session_holds_the_seat"
STALL = "034_sync_stall_beside_a_parked_session"
GRAMMAR_SYNC = "034_sync_grammar_ready_behind_a_parked_seat_seed309_78"
GRAMMAR_ASYNC = "034_async_grammar_ready_behind_a_parked_seat_seed309_12"


# --- the ground truth's reading, on a stand-in for vLLM's scheduler


class _Pool:
    def __init__(self, free: int) -> None:
        self.free = free

    def get_num_free_blocks(self) -> int:
        return self.free


class _Manager:
    """`kv_cache_manager` as far as session_idles.py reads it."""

    def __init__(self, free: int, tables: dict[str, list[Any]]) -> None:
        self.block_pool, self.tables, self.max_model_len = _Pool(free), tables, 64

    def get_blocks(self, req_id: str) -> Any:
        return SimpleNamespace(blocks=(self.tables.get(req_id, []),))


def _request(req_id: str, status: str, tokens: int = 8, computed: int = 0) -> SimpleNamespace:
    return SimpleNamespace(request_id=req_id, status=SimpleNamespace(name=status), num_tokens=tokens,
                           num_computed_tokens=computed, num_stale_output_tokens=0, drop_stale_output=False)


def _vllm(waiting: list[Any], parked: list[Any], free: int, seats: int = 4, running: list[Any] | None = None,
          held: int = 2) -> SimpleNamespace:
    """vLLM 0.34's scheduler: block size 2, each parked session holding
    `held` blocks no one else references, `free` blocks free."""
    tables = {p.request_id: [SimpleNamespace(block_id=10 * i + b, ref_cnt=1) for b in range(held)]
              for i, p in enumerate(parked)}
    return SimpleNamespace(waiting=waiting, kv_holding_waiting=parked, running=running or [],
                           requests={r.request_id: r for r in waiting + parked + (running or [])},
                           pause_state=SimpleNamespace(name="UNPAUSED"), num_waiting_for_streaming_input=len(parked),
                           max_num_active_reqs=seats, block_size=2, max_num_scheduled_tokens=8, max_model_len=64,
                           scheduler_config=SimpleNamespace(long_prefill_token_threshold=0),
                           scheduler_reserve_full_isl=True, num_lookahead_tokens=0,
                           kv_cache_manager=_Manager(free, tables))


def test_only_parked_sessions_unfinished_is_their_clients_wait() -> None:
    parked = [_request("s", "WAITING_FOR_STREAMING_REQ", computed=4)]
    assert stalled_until_input(_vllm([], parked, free=0), 2, 6) == []


def test_parked_sessions_holding_every_seat_is_their_clients_wait() -> None:
    waiting = [_request("r", "WAITING")]
    parked = [_request("s", "WAITING_FOR_STREAMING_REQ", computed=4)]
    assert stalled_until_input(_vllm(waiting, parked, free=8, seats=1), 2, 6) == []
    assert stalled_until_input(_vllm(waiting, parked, free=0, seats=2, held=1), 2, 6) == [
        {"step": 2, "until": 6, "unfinished": ["r"], "parked": ["s"]}]    # a free seat, and 1 block of 4
    assert stalled_until_input(_vllm(waiting, parked, free=1, seats=1, held=1), 2, 6) == [
        {"step": 2, "until": 6, "unfinished": ["r"], "parked": ["s"]}]    # its seat, but 2 blocks of 4


def test_parked_sessions_blocks_are_their_clients_wait_only_where_they_would_admit_the_head() -> None:
    waiting = [_request("r", "WAITING", tokens=8)]                      # its whole sequence: 4 blocks
    parked = [_request("s", "WAITING_FOR_STREAMING_REQ", computed=4)]
    assert stalled_until_input(_vllm(waiting, parked, free=2, held=2), 2, 6) == []        # 2 + 2 admit it
    assert stalled_until_input(_vllm(waiting, parked, free=1, held=2), 2, 6) == [         # 1 + 2 do not
        {"step": 2, "until": 6, "unfinished": ["r"], "parked": ["s"]}]


def _structured(req_id: str, grammar: Any) -> SimpleNamespace:
    """A request vLLM still reads as waiting for its grammar; `grammar`:
    what `structured_output_request.grammar` gives (None: compiling)."""
    request = _request(req_id, "WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR")
    request.structured_output_request = SimpleNamespace(grammar=grammar)
    return request


def test_a_compiled_grammar_not_yet_promoted_is_the_head_a_parked_seat_stops() -> None:
    parked = [_request("s", "WAITING_FOR_STREAMING_REQ", computed=4)]
    ready = _structured("r", grammar=object())           # compiled: the loop would promote it
    assert admission_head(_vllm([ready], parked, free=8, seats=1)) is ready
    assert stalled_until_input(_vllm([ready], parked, free=8, seats=1), 2, 6) == []
    assert stalled_until_input(_vllm([ready], parked, free=8, seats=2), 2, 6) == [     # a seat free
        {"step": 2, "until": 6, "unfinished": ["r"], "parked": ["s"]}]
    compiling = _structured("r", grammar=None)
    assert admission_head(_vllm([compiling], parked, free=8, seats=1)) is None


def test_a_failed_grammar_is_the_head_a_parked_seat_stops_and_needs_no_blocks() -> None:
    """The loop that reaches a failed grammar records its error and the next
    update finishes it (`_handle_blocked_waiting_request`): no hold, and no
    blocks asked (hunt seeds 331 index 12, 332 index 69)."""
    parked = [_request("s", "WAITING_FOR_STREAMING_REQ", computed=4)]
    behind = _request("w", "WAITING", tokens=8)                      # 4 blocks, none free
    for free in (0, 8):
        failed = _structured("r", grammar=ValueError("bad"))
        assert admission_head(_vllm([failed, behind], parked, free=free, seats=1)) is failed
        assert stalled_until_input(_vllm([failed, behind], parked, free=free, seats=1), 2, 6) == []
    failed = _structured("r", grammar=ValueError("bad"))
    assert stalled_until_input(_vllm([failed], parked, free=0, seats=2), 2, 6) == [        # a seat free
        {"step": 2, "until": 6, "unfinished": ["r"], "parked": ["s"]}]


def test_a_received_remote_load_not_yet_promoted_is_the_head() -> None:
    parked = [_request("s", "WAITING_FOR_STREAMING_REQ", computed=4)]
    load = _request("r", "WAITING_FOR_REMOTE_KVS")
    scheduler = _vllm([load], parked, free=8, seats=1)
    assert admission_head(scheduler) is None                        # its KV still to come
    scheduler.finished_recving_kv_req_ids = {"r"}
    assert admission_head(scheduler) is load and stalled_until_input(scheduler, 2, 6) == []


def test_a_request_that_runs_is_not_held_by_a_parked_session() -> None:
    running = [_request("x", "RUNNING", computed=2)]
    parked = [_request("s", "WAITING_FOR_STREAMING_REQ", computed=4)]
    assert stalled_until_input(_vllm([], parked, free=0, seats=2, running=running), 2, 6) == [
        {"step": 2, "until": 6, "unfinished": ["x"], "parked": ["s"]}]


def _with_prefix_hit(scheduler: SimpleNamespace, hit: list[Any], spec_tokens: int, lookahead: int) -> None:
    """`scheduler` with drafts (k = `spec_tokens`, `lookahead` slots) and a
    prefix cache whose longest hit is `hit` (the coordinator's
    `find_longest_cache_hit`, as session_idles.py reads it)."""
    scheduler.num_spec_tokens, scheduler.num_lookahead_tokens, scheduler.dynamic_sd_lookup = spec_tokens, lookahead, None
    scheduler.kv_cache_manager.enable_caching = True
    scheduler.kv_cache_manager.coordinator = SimpleNamespace(
        find_longest_cache_hit=lambda hashes, most: ((hit,), len(hit) * 2, 0))


@pytest.mark.parametrize("spec_tokens,stall", [(3, False), (0, True)])
def test_a_padded_admission_past_a_prefix_hit_is_what_the_parked_blocks_keep_out(spec_tokens: int,
                                                                                 stall: bool) -> None:
    """Seed 372 index 85 (`--all-features --spec-tokens 3 --lookahead
    --stages 1`, 0.34.0 sync): preempted r4, 13 tokens, hits 12 in the cache
    (6 evictable blocks), so one token is left, which the waiting loop pads
    to 1 + k (`Scheduler.schedule`, "Pad new decode requests"): 12 + 4 + 3
    lookahead slots need 10 blocks, 8 are free and the parked session holds
    8. Unpadded (no drafts) 12 + 1 + 3 fit the 8 free: a stall."""
    head = _request("r4", "PREEMPTED", tokens=13)
    head.block_hashes = list(range(6))
    parked = [_request("s", "WAITING_FOR_STREAMING_REQ", computed=10)]
    scheduler = _vllm([head], parked, free=8, seats=4, held=8)
    scheduler.max_num_scheduled_tokens = 28
    _with_prefix_hit(scheduler, [SimpleNamespace(block_id=b, ref_cnt=0) for b in range(6)], spec_tokens, 3)
    assert stalled_until_input(scheduler, 3, 6) == (
        [{"step": 3, "until": 6, "unfinished": ["r4"], "parked": ["s"]}] if stall else [])


def test_a_hit_on_blocks_a_parked_session_holds_asks_the_free_pool_only_for_the_rest() -> None:
    """The hit's blocks the parked session references are adopted, not taken
    from the free pool (`get_num_blocks_to_allocate` counts only an
    evictable hit block): r's 8 tokens hit 6 on s's 3 blocks, so r asks 1
    block of the pool, and 1 free admits it: s's blocks do not keep it out
    (read as 4 blocks from nothing, they did). With none free, s's end frees
    its 3, which r's whole sequence then asks with 1 more: no admission
    either, so the idle is a stall both ways."""
    head = _request("r", "WAITING", tokens=8)
    head.block_hashes = list(range(3))
    parked = [_request("s", "WAITING_FOR_STREAMING_REQ", computed=6)]
    for free in (1, 0):
        scheduler = _vllm([head], parked, free=free, seats=4, held=3)
        _with_prefix_hit(scheduler, scheduler.kv_cache_manager.tables["s"], 0, 0)
        assert stalled_until_input(scheduler, 2, 6) == [
            {"step": 2, "until": 6, "unfinished": ["r"], "parked": ["s"]}], free
    unread = _vllm([head], parked, free=1, seats=4, held=3)        # no coordinator: the hit not read
    assert stalled_until_input(unread, 2, 6) == []


class _Connector:
    """The workload's KV connector as session_idles.py reads it: what it
    offers (`flightcheck_offer`) and whether it still would load async."""

    def __init__(self, hit: int, load_async: bool) -> None:
        self.hit, self.load_async = hit, load_async

    def flightcheck_offer(self, request: Any) -> tuple[int, bool]:
        return self.hit, self.load_async

    def may_load_async(self, request: Any) -> bool:
        return self.load_async and self.hit > 0


@pytest.mark.parametrize("load_async,margin,stall", [(True, 1, False), (True, 0, True), (False, 1, True)])
def test_an_async_load_asks_its_blocks_beside_the_spec_decode_margin(load_async: bool, margin: int,
                                                                     stall: bool) -> None:
    """Seed 390 index 161 (`--versions 0.34.0 --all-features --spec-tokens 1
    --lookahead --stages 1`): r3's 2 tokens, all offered as an async load,
    need 1 block, and `allocate_slots(reserved_blocks=...)` keeps one
    spec-decode step's blocks (`_spec_decode_step_blocks`) free beside it:
    2 of the 1 free, so the parked session's blocks keep it out (its
    client's wait). Without the margin, or offered a sync load (no
    reservation; vLLM still schedules a token), 1 free admits it: a stall."""
    head = _request("r3", "WAITING", tokens=2)
    parked = [_request("s", "WAITING_FOR_STREAMING_REQ", computed=14)]
    scheduler = _vllm([head], parked, free=1, seats=3, held=2)
    scheduler.block_size, scheduler.scheduler_reserve_full_isl, scheduler.num_lookahead_tokens = 8, False, 0
    scheduler.connector = _Connector(8, load_async)
    scheduler._spec_decode_step_blocks = margin
    scheduler._inflight_prefill_reserved_blocks = lambda: 0
    assert stalled_until_input(scheduler, 7, 10) == (
        [{"step": 7, "until": 10, "unfinished": ["r3"], "parked": ["s"]}] if stall else [])


def test_the_finding_names_the_parked_sessions_beside_the_stall() -> None:
    (found,) = findings({"ending": "done", "stalls": [{"step": 4, "until": 10, "unfinished": ["a", "b"],
                                                       "parked": ["c"]}]})
    assert "a, b unfinished (beside c, parked for input), until an input at step 10" in found


# --- check-trace on vLLM's kept traces


def _events(stem: str) -> list[dict[str, Any]]:
    return read_trace_file(str(DATA / f"{stem}.jsonl"))


def _first(events: list[dict[str, Any]], ev: str, req: str) -> int:
    return next(i for i, e in enumerate(events) if e["ev"] == ev and (
        e.get("req") == req or req in e.get("tokens", {}) or any(x["req"] == req for x in e.get("entries", ()))))


@pytest.mark.parametrize("stem,waiter,session", [(HOLDS_SEAT, "r", "s"), (HOLDS_BLOCKS, "r0", "r1"),
                                                  (GRAMMAR_ASYNC, "r1", "r0")])
def test_check_trace_accepts_a_wait_for_a_parked_sessions_client(stem: str, waiter: str, session: str) -> None:
    events = _events(stem)
    end = next(i for i, e in enumerate(events) if e["ev"] == "input" and e["req"] == session
               and e.get("end_of_session"))
    assert _first(events, "arrive", waiter) < end < _first(events, "schedule", waiter)   # it waited for the end
    assert check_trace(DATA / f"{stem}.jsonl").ok
    checker = TraceChecker(events)                 # the state the end of the session found
    for event in events[1:end]:
        checker.feed(event)
    s, cfg = replace(checker.state, in_flight=()), checker.cfg     # only empty batches were in flight
    l2 = deadlock.l2_async_no_deadlock if events[0].get("async_scheduling") else deadlock.l2_no_deadlock
    assert is_empty_step(schedule(s, cfg)) and deadlock.parked_sessions_hold_the_way(s, cfg)
    assert l2(s, cfg)                              # by the client's wait alone


def test_check_trace_accepts_a_compiled_grammar_waiting_for_a_parked_sessions_seat() -> None:
    events = _events(GRAMMAR_SYNC)
    assert events[0]["max_num_seqs"] == 1 and not events[0].get("async_scheduling")
    parks = _first(events, "complete", "r1")                       # r1's first turn ends: it parks
    assert _first(events, "grammar_compiled", "r2") < parks < _first(events, "schedule", "r2")
    assert events[parks + 1]["ev"] == "input" and events[parks + 1]["req"] == "r1"   # nothing between
    assert check_trace(DATA / f"{GRAMMAR_SYNC}.jsonl").ok
    checker = TraceChecker(events)                 # the state the idle from step 8 sat in
    for event in events[1:parks + 1]:
        checker.feed(event)
    s, cfg = replace(checker.state, in_flight=()), checker.cfg
    assert is_empty_step(schedule(s, cfg)) and deadlock.parked_sessions_hold_the_way(s, cfg)
    assert deadlock.l2_no_deadlock(s, cfg)          # by r1's seat alone


def test_check_trace_accepts_an_idle_with_only_a_parked_session_unfinished() -> None:
    events = _events(ONLY_PARKED)
    parks = _first(events, "complete", "r1")
    assert events[parks + 1]["ev"] == "input" and events[parks + 1]["req"] == "r1"   # nothing between
    assert check_trace(DATA / f"{ONLY_PARKED}.jsonl").ok


def test_check_trace_rejects_a_stall_beside_a_parked_session() -> None:
    result = check_trace(DATA / f"{STALL}.jsonl")
    assert (result.ok, result.property, result.line) == (False, "L2_no_deadlock", 8)
    assert '"c":WSTR' in (result.state_before or "")                 # c was parked all along
    events = _events(STALL)
    checker = TraceChecker(events)
    for event in events[1:7]:                      # through a's input: a waits, b and c are parked
        checker.feed(event)
    s, cfg = checker.state, checker.cfg
    assert not s.in_flight and is_empty_step(schedule(s, cfg))
    assert deadlock.parked_sessions_hold_the_way(s, cfg) and deadlock.l2_no_deadlock(s, cfg)  # b's and c's 3
    with pytest.raises(_Violation, match="L2"):    # b's input: c's end frees 1 block of the 2 a or b needs
        checker.feed(events[7])


def test_the_kept_workloads_are_the_ones_the_traces_ran() -> None:
    for stem, workload in [(HOLDS_SEAT, "session-parked-holds-the-seat.json"),
                           (STALL, "session-stall-beside-a-parked-session.json"),
                           (ONLY_PARKED, f"{ONLY_PARKED}.workload.json"),
                           (HOLDS_BLOCKS, f"{HOLDS_BLOCKS}.workload.json"),
                           (GRAMMAR_SYNC, f"{GRAMMAR_SYNC}.workload.json"),
                           (GRAMMAR_ASYNC, f"{GRAMMAR_ASYNC}.workload.json")]:
        raw = json.loads((DATA / workload).read_text())
        arrivals = [e["req"] for e in _events(stem) if e["ev"] == "arrive"]
        assert sorted(set(arrivals)) == sorted(r["id"] for r in raw["requests"])


# --- on vLLM itself (slow): the kept workloads, the ground truth and check-trace together


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


def _replayed(running: Workers, version: str, async_scheduling: bool, workload: str) -> Replayed:
    raw = json.loads((DATA / workload).read_text())
    raw = with_async_scheduling(raw) if async_scheduling else raw
    return replay_workload(running[version], ReplayJob(version, async_scheduling, 0, raw, raw.get("seed", 0)))


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_vllm_stalls_beside_a_parked_session_and_both_sides_say_so(running: Workers, version: str,
                                                                    async_scheduling: bool) -> None:
    stalled = _replayed(running, version, async_scheduling, "session-stall-beside-a-parked-session.json")
    assert [(s["unfinished"], s.get("parked"), s["until"]) for s in stalled.result["stalls"]] == [
        (["a", "b"], ["c"], 10)]                                      # until b's abort
    assert stalled.category == "rejected, real bug", stalled.detail
    assert stalled.detail.endswith("L2_no_deadlock"), stalled.detail
    waited = _replayed(running, version, async_scheduling, "session-parked-holds-the-seat.json")
    assert waited.result["stalls"] == [] and waited.result["ending"] == "done"
    assert waited.category == "accepted, correct run", waited.detail


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("stem", [ONLY_PARKED, HOLDS_BLOCKS])
def test_vllm_waits_for_a_parked_sessions_client_in_the_kept_campaign_runs(running: Workers, stem: str) -> None:
    replayed = _replayed(running, "0.34.0", True, f"{stem}.workload.json")
    assert replayed.result["stalls"] == [] and replayed.result["ending"] == "done"
    assert replayed.category == "accepted, correct run", replayed.detail
    assert replayed.comparison is not None and replayed.comparison.equal, replayed.comparison.describe()


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("version,async_scheduling,stem", [("0.34.0", False, GRAMMAR_SYNC),
                                                           ("0.34.0", True, GRAMMAR_ASYNC),
                                                           ("0.33.0", True, GRAMMAR_ASYNC)])
def test_vllm_admits_a_compiled_grammar_once_the_parked_seat_is_given_back(running: Workers, version: str,
                                                                           async_scheduling: bool, stem: str) -> None:
    replayed = _replayed(running, version, async_scheduling, f"{stem}.workload.json")
    assert replayed.result["stalls"] == [] and replayed.result["ending"] == "done"
    assert replayed.category == "accepted, correct run", replayed.detail
    assert replayed.comparison is not None and replayed.comparison.equal, replayed.comparison.describe()


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_admits_the_compiled_grammar_as_soon_as_the_seat_is_free(running: Workers, tmp_path: Path) -> None:
    """Seed 309 index 78 with r1's second turn left out, so that its seat
    alone keeps r2 waiting: ended at step 9 (where the input came), r2 is
    the next batch; with a second seat, r2 is the next batch after r1
    parks. (Never ended, the run idles to its step limit.)"""
    raw = json.loads((DATA / f"{GRAMMAR_SYNC}.workload.json").read_text())
    raw["requests"][1]["session"] = {"inputs": [], "end_step": 9}
    two_seats = json.loads(json.dumps(raw))
    two_seats["config"]["max_num_seqs"] = 2
    for workload, after in ((raw, "input"), (two_seats, "complete")):
        trace = tmp_path / f"{workload['config']['max_num_seqs']}.jsonl"
        result = running["0.34.0"].replay(workload, trace=str(trace))
        assert result["ending"] == "done" and result["stalls"] == []
        events = read_trace_file(str(trace))
        admits = _first(events, "schedule", "r2")
        before = [e for e in events[:admits] if e["ev"] in ("schedule", "complete", "input")][-1]
        assert (before["ev"], before.get("req") or [*before.get("tokens", {})]) == (after, "r1" if after == "input"
                                                                                   else ["r1"])
