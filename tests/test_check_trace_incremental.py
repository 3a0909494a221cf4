"""The incremental checker (verification/traces/incremental.py) gives the full
replay's verdict, property, event and message: on every golden reference run
(the correct scheduler and every mutant, both policies), on long generated
traces where slots are reused, and on long traces damaged at random places.
Every other test that checks a trace runs both checkers too (conftest.py)."""

from __future__ import annotations

import io
import json
import random
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from flightcheck.verification.traces import check as check_module
from flightcheck.verification.traces.check import (
    IncrementalChecker,
    MalformedTrace,
    check_events,
    read_events,
)

from flightcheck.cli import main

from .conftest import differential_check_events
from .reference_trace_runs import run_cases, traced_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from long_traces import write_long_trace


def outcome(events: list[dict], full: bool) -> tuple:
    try:
        result = check_events([dict(e) for e in events], full=full)
    except MalformedTrace as err:
        return ("malformed", str(err))
    return (result.ok, result.events, result.event_index, result.property, result.message,
            tuple(result.unchecked))


def assert_same_verdict(events: list[dict]) -> tuple:
    incremental, full = outcome(events, full=False), outcome(events, full=True)
    assert incremental == full
    return incremental


def events_of(text: str) -> list[dict]:
    return read_events(line for line in text.split("\n") if not line.startswith("#"))


def long_events(concurrency: int, num_events: int, seed: int = 0, continue_prefill: bool = True) -> list[dict]:
    sink = io.StringIO()
    write_long_trace(sink, concurrency, num_events, seed=seed, continue_prefill=continue_prefill)
    return events_of(sink.getvalue())


def test_every_check_in_the_suite_runs_both_checkers():
    assert check_module.check_events is differential_check_events


@pytest.mark.parametrize("case", run_cases(), ids=[case[0] for case in run_cases()])
def test_incremental_checker_agrees_with_full_replay_on_golden_reference_run(case):
    _, mutant, continue_prefill, seed = case
    assert_same_verdict(events_of(traced_run(mutant, continue_prefill, seed)))   # outside finishes make some illegal


@pytest.mark.parametrize("continue_prefill", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_incremental_checker_agrees_on_a_long_trace_and_reuses_slots(continue_prefill):
    events = long_events(12, 1500, seed=3, continue_prefill=continue_prefill)
    assert assert_same_verdict(events)[0] is True
    checker = IncrementalChecker(events)
    num_arrivals = sum(1 for e in events if e["ev"] == "arrive")
    assert len(checker.state.requests) < num_arrivals / 2      # finished requests' slots are reused


DAMAGES = ("drop_event", "shift_start", "grow_n", "drop_entry", "drop_finish_reason", "extra_token",
           "swap_preempted")


def damaged(events: list[dict], rng: random.Random) -> list[dict]:
    """A copy of `events` with one plausible scheduler bug or writer slip somewhere past the middle."""
    events = [json.loads(json.dumps(e)) for e in events]
    for _ in range(100):
        index = rng.randrange(len(events) // 2, len(events) - 1)
        event, damage = events[index], rng.choice(DAMAGES)
        if damage == "drop_event" and event["ev"] in ("finish", "complete", "schedule"):
            del events[index]
            return events
        if event["ev"] == "schedule" and event["entries"]:
            entry = rng.choice(event["entries"])
            if damage == "shift_start":
                entry["start"] += 1
                return events
            if damage == "grow_n":
                entry["n"] += 1
                return events
            if damage == "drop_entry" and len(event["entries"]) > 1:
                event["entries"].remove(entry)
                return events
            if damage == "swap_preempted" and event.get("preempted"):
                event["preempted"] = []
                return events
        if event["ev"] == "finish" and damage == "drop_finish_reason":
            event["reason"] = "stop" if event["reason"] != "stop" else "length"
            return events
        if event["ev"] == "complete" and damage == "extra_token" and event.get("tokens"):
            name = rng.choice(sorted(event["tokens"]))
            event["tokens"][name] = event["tokens"][name] + [1001]
            return events
    raise AssertionError("no damage applied")


@pytest.mark.parametrize("seed", [0, 1, *(pytest.param(seed, marks=pytest.mark.slow) for seed in range(2, 8))])
def test_incremental_checker_agrees_on_damaged_long_traces(seed):
    events = long_events(10, 1200, seed=seed, continue_prefill=seed % 2 == 0)
    verdict = assert_same_verdict(damaged(events, random.Random(seed)))
    assert verdict[0] is not True or verdict == ("malformed",)  # a damage is caught or refused


def test_full_flag_gives_the_same_report(tmp_path):
    path = tmp_path / "run.jsonl"
    sink = io.StringIO()
    write_long_trace(sink, 4, 300, seed=1)
    path.write_text(sink.getvalue())
    reports = []
    for flag in ((), ("--full",)):
        out = io.StringIO()
        with redirect_stdout(out):
            code = main(["check-trace", str(path), "--json", *flag])
        reports.append((code, json.loads(out.getvalue())))
    assert reports[0] == reports[1]
    assert reports[0][0] == 0 and reports[0][1]["ok"] is True


def test_progress_is_reported_every_thousand_events():
    events = long_events(4, 2100, seed=2)
    calls: list[tuple[int, int]] = []
    check_events(events, progress=lambda done, total: calls.append((done, total)))
    assert calls == [(n, len(events)) for n in range(1000, len(events), 1000)]
