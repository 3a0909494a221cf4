"""vLLM's real scheduler (0.34.0 in the default suite, 0.33.0 behind
`slow`), sync and async, with pipeline depth 2 and the fabricated KV
connector (flightcheck/vllm/kv_connector.py): what vLLM did, read from its
own trace (kv_recording.py) — a request parked for an async load and
promoted with the loaded tokens, a sync load's failure rolled back to the
first invalid block, a producer's blocks held until sent, an aborted
load's blocks held until its report, the fail policy, and 0.34's load
limit — and the recorder changing none of vLLM's decisions.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flightcheck.vllm import ASYNC_RECORDER
from flightcheck.vllm.differential import read_trace

from .vllm_support import Workers, workers

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("both_checkers")]

CONFIG = {"num_stages": 2, "max_num_batched_tokens": 32, "max_num_seqs": 4, "block_size": 4, "num_blocks": 40,
          "max_model_len": 256, "prefix_caching": True}

PARK_AND_ROLL_BACK = {
    "name": "kv-park-roll-back", "seed": 1,
    "config": {**CONFIG, "kv_connector": {"consumer": True, "producer": True, "load_failure_policy": "recompute"}},
    "requests": [
        {"id": "a", "prompt_len": 20, "max_tokens": 3, "kv": {"hit": 12, "async": True, "load_steps": 3}},
        {"id": "b", "prompt_len": 18, "max_tokens": 3, "kv": {"hit": 8, "fail_from_block": 1, "send_steps": 2}},
        {"id": "c", "prompt_len": 16, "max_tokens": 2, "arrival_step": 1, "abort_step": 2,
         "kv": {"hit": 16, "async": True, "load_steps": 4}}]}

FAIL_POLICY = {
    "name": "kv-fail", "seed": 2,
    "config": {**CONFIG, "kv_connector": {"consumer": True, "load_failure_policy": "fail"}},
    "requests": [
        {"id": "a", "prompt_len": 12, "max_tokens": 3, "kv": {"hit": 8, "async": True, "fail_whole": True}},
        {"id": "b", "prompt_len": 12, "max_tokens": 3, "kv": {"hit": 8, "fail_from_block": 0}},
        {"id": "c", "prompt_len": 12, "max_tokens": 2}]}

LOAD_LIMIT = {
    "name": "kv-limit", "seed": 3,
    "config": {**CONFIG, "kv_connector": {"consumer": True, "max_inflight_loads": 1}},
    "requests": [{"id": name, "prompt_len": 16, "max_tokens": 2, "kv": {"hit": 8, "async": True, "load_steps": 2}}
                 for name in "abc"]}


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    """One worker per version; 0.34.0's (the default suite's) started at
    setup: importing vLLM takes 10-50 s, once for the module."""
    for shared in workers():
        shared["0.34.0"]
        yield shared


def _replay(running: Workers, version: str, raw: dict[str, Any], async_scheduling: bool,
            tmp_path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    raw = {**raw, "config": {**raw["config"], "async_scheduling": async_scheduling}}
    trace = tmp_path / "trace.jsonl"
    result = running[version].replay(raw, trace=str(trace), scheduler_cls=ASYNC_RECORDER if async_scheduling else None)
    assert result["ending"] == "done" and result["exception"] is None, result
    return result, read_trace(trace)


def _first(events: list[dict[str, Any]], match: Any) -> int:
    return next(i for i, event in enumerate(events) if match(event))


def _entries(events: list[dict[str, Any]], req: str, after: int = 0) -> list[tuple[int, dict[str, Any]]]:
    return [(i, entry) for i, event in enumerate(events) if i > after and event["ev"] == "schedule"
            for entry in event["entries"] if entry["req"] == req]


def _check_park_and_roll_back(running: Workers, version: str, async_scheduling: bool, tmp_path: Path) -> None:
    result, events = _replay(running, version, PARK_AND_ROLL_BACK, async_scheduling, tmp_path)
    assert events[0]["kv_connector"] == {"consumer": True, "producer": True, "load_failure_policy": "recompute",
                                         "max_inflight_loads": None}
    arrive = {e["req"]: e for e in events if e["ev"] == "arrive"}
    assert (arrive["a"]["external_hit"], arrive["a"]["load_async"]) == (12, True)
    # a parks with its 12 loaded tokens, is not scheduled until received, then resumes from them
    parked = _first(events, lambda e: e["ev"] == "schedule" and any(
        (load["req"], load["start"]) == ("a", 12) for load in e.get("kv_loads", [])))
    received = _first(events, lambda e: e == {**e, "ev": "kv_received", "req": "a"})
    (first, entry), *_ = _entries(events, "a")
    assert parked < received < first and entry["start"] == entry["cached"] == 12
    # b's sync load (8 tokens, blocks 0-1) fails from block 1: rolled back to token 4
    (_, loading), *_ = _entries(events, "b")
    assert loading["external"] == 8 and loading["start"] == 8
    failed = _first(events, lambda e: e["ev"] == "kv_failed")
    assert events[failed]["req"] == "b" and events[failed]["from_block"] == 1 and events[failed]["computed"] == 4
    (_, again), *_ = _entries(events, "b", after=failed)
    assert again["start"] == 4
    # c aborted during its load: not held for a send, its load still reported after the abort;
    # a and b finished, held until sent
    finishes = {e["req"]: e for e in events if e["ev"] == "finish"}
    assert finishes["c"]["reason"] == "abort" and not finishes["c"]["held"]
    assert _first(events, lambda e: e is finishes["c"]) < _first(events, lambda e: e == {**e, "ev": "kv_received",
                                                                                          "req": "c"})
    assert result["kv_reports"] and all(load["block_ids"] for e in events for load in e.get("kv_loads", []))
    for req in "ab":
        assert finishes[req]["held"] and finishes[req]["reason"] == "length"
        assert _first(events, lambda e: e is finishes[req]) < _first(
            events, lambda e: e == {**e, "ev": "kv_sent", "req": req})
    assert not any(e["ev"] == "kv_sent" and e["req"] == "c" for e in events)      # an abort sends nothing
    reports = result["kv_reports"]
    assert sum("a" in r["finished_recving"] for r in reports) == 1


def _check_fail_policy(running: Workers, version: str, async_scheduling: bool, tmp_path: Path) -> None:
    _, events = _replay(running, version, FAIL_POLICY, async_scheduling, tmp_path)
    failed = {e["req"]: e["from_block"] for e in events if e["ev"] == "kv_failed"}
    assert failed == {"a": 0, "b": 0}
    finishes = {e["req"]: e["reason"] for e in events if e["ev"] == "finish"}
    assert finishes == {"a": "error", "b": "error", "c": "length"}


def _loads_in_flight_at_most(events: list[dict[str, Any]]) -> int:
    """The most requests parked for a load and not yet scheduled, at any event."""
    parked: set[str] = set()
    most = 0
    for event in events:
        if event["ev"] == "schedule":
            parked -= {entry["req"] for entry in event["entries"]}
            parked |= {load["req"] for load in event.get("kv_loads", [])}
            most = max(most, len(parked))
    return most


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_0_34_parks_promotes_rolls_back_and_holds_blocks_until_sent(running, tmp_path, async_scheduling):
    _check_park_and_roll_back(running, "0.34.0", async_scheduling, tmp_path)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_0_34_fails_both_kinds_of_load_failure_under_the_fail_policy(running, tmp_path, async_scheduling):
    _check_fail_policy(running, "0.34.0", async_scheduling, tmp_path)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_0_34_the_recorder_changes_no_decision_with_a_connector(running, async_scheduling):
    raw = {**PARK_AND_ROLL_BACK, "config": {**PARK_AND_ROLL_BACK["config"], "async_scheduling": async_scheduling}}
    recorded = running["0.34.0"].replay(raw, scheduler_cls=ASYNC_RECORDER if async_scheduling else None)
    plain = running["0.34.0"].replay(raw, recorder=False)
    assert not plain["recorder"] and plain["scheduler_is_vllm_scheduler"]
    for key in ("batches", "outputs", "kv_reports", "ending", "steps"):
        assert plain[key] == recorded[key], key


def test_0_34_keeps_one_load_in_flight_under_the_limit_and_0_33_has_no_limit(running, tmp_path):
    _, events = _replay(running, "0.34.0", LOAD_LIMIT, True, tmp_path)
    assert events[0]["kv_connector"]["max_inflight_loads"] == 1
    assert _loads_in_flight_at_most(events) == 1
    assert sum(len(e.get("kv_loads", [])) for e in events) == 3


@pytest.mark.slow
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_0_33_parks_promotes_rolls_back_fails_and_has_no_load_limit(running, tmp_path, async_scheduling):
    _check_park_and_roll_back(running, "0.33.0", async_scheduling, tmp_path)
    _check_fail_policy(running, "0.33.0", async_scheduling, tmp_path)
    _, events = _replay(running, "0.33.0", LOAD_LIMIT, async_scheduling, tmp_path)
    assert events[0]["kv_connector"]["max_inflight_loads"] is None
    assert _loads_in_flight_at_most(events) == 3


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
def test_the_kv_connector_family_exercises_every_transfer_and_vllm_keeps_its_blocks(running, tmp_path, version):
    """The campaign's family (sync and async): every run ends, vLLM never
    has a parked or held request's block back in the pool nor a leak at the
    end (the ground truth), and the runs together park, promote, fail both
    ways, finish by error, hold for sends and report each transfer."""
    from flightcheck.vllm.generate import campaign_workloads
    from flightcheck.vllm.kv_workload import has_kv_connector

    seen: set[str] = set()
    for raw in campaign_workloads(5, 24, family="kv-connector", mid_step_inputs=version == "0.34.0"):
        for async_scheduling in (False, True):
            result, events = _replay(running, version, raw, async_scheduling, tmp_path)
            truth = result["ground_truth"]
            assert not truth.get("kv_blocks_freed_under_transfer") and not truth.get("kv_blocks_leaked_at_end")
            assert has_kv_connector(raw) == ("kv_connector" in events[0])
            received = [r for report in result.get("kv_reports", []) for r in report["finished_recving"]]
            parked = [load["req"] for e in events for load in e.get("kv_loads", [])]
            assert sorted(received) == sorted(parked)           # each started load reported once
            seen |= {e["ev"] for e in events}
            seen |= {"parked"} if parked else set()
            seen |= {f"finish {e['reason']}" for e in events if e["ev"] == "finish"}
            seen |= {"held" for e in events if e.get("held")}
            seen |= {"external" for e in events for entry in e.get("entries", ()) if entry.get("external")}
    assert {"parked", "kv_received", "kv_failed", "kv_sent", "finish error", "held", "external"} <= seen, seen
