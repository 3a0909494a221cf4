"""The incremental checker (verification/traces/incremental.py) gives the full
replay's verdict, property, event and message: on every golden reference run
(the correct scheduler and every mutant, both policies), on the same runs
under the other version profiles (vLLM 0.8.4: one batch per request and
preallocation; 0.8.5 without prefix caching: forward release order), on long
generated traces of every profile where slots are reused and labels are
cached twice, and on long traces damaged at random places. Every other test
that checks a trace runs both checkers too (conftest.py), the vLLM traces
of tests/test_vllm_*.py included."""

from __future__ import annotations

import io
import json
import random
import re
from contextlib import redirect_stdout
from pathlib import Path

from typing import Any

import pytest
from flightcheck.spec import BlockPool, Request, State, Status
from flightcheck.spec.blocks import group_duplicates
from flightcheck.verification.traces import check as check_module
from flightcheck.verification.traces.check import (
    IncrementalChecker,
    MalformedTrace,
    check_events,
    read_events,
)

from flightcheck.cli import main

from .conftest import differential_check_events
from .fixtures import load_benchmark
from .reference_trace_runs import run_cases, traced_run

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

write_long_trace = load_benchmark("long_traces").write_long_trace


def outcome(events: list[dict], full: bool, profile: str | None = None) -> tuple:
    try:
        result = check_events([dict(e) for e in events], profile, full=full)
    except MalformedTrace as err:
        return ("malformed", str(err))
    return (result.ok, result.events, result.event_index, result.property, result.message,
            tuple(result.unchecked), result.line, result.state_before, result.profile)


def assert_same_verdict(events: list[dict], profile: str | None = None) -> tuple:
    """Both checkers' outcome, under `profile` (None: the one the trace selects)."""
    incremental, full = outcome(events, False, profile), outcome(events, True, profile)
    assert incremental == full
    return incremental


def events_of(text: str) -> list[dict]:
    return read_events(line for line in text.split("\n") if not line.startswith("#"))


def long_events(concurrency: int, num_events: int, seed: int = 0, continue_prefill: bool | None = True,
                **options: Any) -> list[dict]:
    sink = io.StringIO()
    write_long_trace(sink, concurrency, num_events, seed=seed, continue_prefill=continue_prefill, **options)
    return events_of(sink.getvalue())


def test_this_module_runs_both_checkers():
    assert check_module.check_events is differential_check_events


# What reaches check_events in a test's own process: the checker's functions,
# the check-trace command, the refinement fuzzer, the vLLM bridge's --check.
_CHECKS_TRACES = re.compile(r"check_events|check_trace|check-trace|refinement|fuzz|campaign|--check")
# Modules that name those only in prose or in subprocesses, or (the
# workload module) only the campaign's workload generator.
_NAMES_ONLY = {"test_docs.py", "test_readme_commands.py", "test_walkthrough_outputs.py", "test_vllm_workload.py"}


def test_every_module_that_checks_traces_compares_both_checkers():
    """The comparison is declared, not implied: a test module that could
    check a trace in-process says `usefixtures("both_checkers")`."""
    tests = Path(__file__).resolve().parent
    undeclared = [path.name for path in sorted(tests.glob("test_*.py"))
                  if path.name not in _NAMES_ONLY and _CHECKS_TRACES.search(path.read_text())
                  and 'usefixtures("both_checkers")' not in path.read_text()]
    assert not undeclared, f"these modules check traces without comparing both checkers: {undeclared}"


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


# -- the version profiles ---------------------------------------------------------
# (profile, prefix caching): 0.8.5 with caching (reverse release, duplicate
# cached blocks), 0.8.5 without (forward release), 0.8.4 with and without
# (one batch per request, preallocation ahead of need).
PROFILE_CASES = [("vllm-0.8.5", True), ("vllm-0.8.5", False), ("vllm-0.8.4", True), ("vllm-0.8.4", False)]
# Small blocks, repeated prompts and a tight pool: labels cached twice,
# preemptions, preallocation capped by the free blocks.
DUPLICATING = {"block_size": 4, "repeated_prompts": 0.3, "pool_share": 0.6}


class _RecordingChecker(IncrementalChecker):
    """Notes what the spec did along the trace, to show what a test covered."""

    seen: dict[str, int] = {}

    def _apply(self, action, new_state, what) -> None:
        if new_state is not None:
            self.seen["duplicate_states"] = self.seen.get("duplicate_states", 0) + bool(new_state.pool.duplicates)
        super()._apply(action, new_state, what)


@pytest.mark.parametrize("profile, prefix_caching", PROFILE_CASES, ids=[f"{p}-{'caching' if c else 'no-caching'}"
                                                                     for p, c in PROFILE_CASES])
def test_incremental_checker_agrees_under_every_profile_on_long_traces(profile, prefix_caching, monkeypatch):
    events = long_events(12, 1500, seed=1, continue_prefill=None, profile=profile,
                         prefix_caching=prefix_caching, **DUPLICATING)
    config = events[0]
    assert config["profile"] == profile
    assert config["num_preallocate_tokens"] == (64 if profile == "vllm-0.8.4" else 0)
    assert config["release_order"] == ("reverse" if prefix_caching else "forward")
    assert config["policy"] == ("one-batch-per-request" if profile == "vllm-0.8.4" else "continue-prefill")
    _RecordingChecker.seen = {}
    monkeypatch.setattr(check_module, "IncrementalChecker", _RecordingChecker)
    verdict = assert_same_verdict(events, profile)
    assert verdict[0] is True and verdict[-1] == profile
    assert any(e.get("preempted") for e in events if e["ev"] == "schedule")
    if prefix_caching:
        assert _RecordingChecker.seen["duplicate_states"] > 0       # a label cached twice, slots reused
    checker = IncrementalChecker(events, profile)
    assert (checker.cfg.profile, checker.cfg.num_preallocate_tokens) == (profile, config["num_preallocate_tokens"])
    assert len(checker.state.requests) < sum(1 for e in events if e["ev"] == "arrive") / 2


def _profile_runs() -> list[tuple[str, str, str | None, bool, int, bool]]:
    """The golden runs' cases under vLLM 0.8.4 (its own policy) and under
    0.8.5 without prefix caching: (id, profile, mutant, continue_prefill, seed, prefix caching)."""
    runs = []
    for name, mutant, continue_prefill, seed in run_cases():
        if not continue_prefill:
            runs.append((f"vllm-0.8.4-{name}", "vllm-0.8.4", mutant, False, seed, True))
        runs.append((f"vllm-0.8.5-no-caching-{name}", "vllm-0.8.5", mutant, continue_prefill, seed, False))
    return runs


@pytest.mark.parametrize("case", _profile_runs(), ids=[run[0] for run in _profile_runs()])
def test_incremental_checker_agrees_with_full_replay_on_reference_runs_of_each_profile(case):
    _, profile, mutant, continue_prefill, seed, prefix_caching = case
    events = events_of(traced_run(mutant, continue_prefill, seed, profile, prefix_caching))
    assert events[0]["profile"] == profile
    assert_same_verdict(events, profile)


@pytest.mark.parametrize("seed", [0, 1, *(pytest.param(seed, marks=pytest.mark.slow) for seed in range(2, 8))])
def test_incremental_checker_agrees_on_damaged_long_traces_of_each_profile(seed):
    profile, prefix_caching = PROFILE_CASES[(seed + 1) % len(PROFILE_CASES)]
    events = long_events(10, 1200, seed=seed, continue_prefill=None, profile=profile,
                         prefix_caching=prefix_caching, **DUPLICATING)
    verdict = assert_same_verdict(damaged(events, random.Random(seed)), profile)
    assert verdict[0] is not True or verdict == ("malformed",)


def test_a_reused_slot_evicts_every_copy_of_its_old_output_labels():
    # Slot 0 finished, its output label -1 cached twice (blocks 1 and 3, as
    # after a resume recomputed its last block), block 2 caching another
    # request's label that is duplicated too (4): reuse evicts both copies of
    # -1 and keeps `duplicates` as the spec would have it.
    events = long_events(2, 40, seed=0)
    checker = IncrementalChecker(events)
    labels = (5, -1, 9, -1, 9)
    pool = BlockPool(ref_counts=(0,) * 5, labels=labels, free_queue=(0, 1, 2, 3, 4),
                     duplicates=group_duplicates([1, 3, 2, 4], list(labels)))
    assert pool.duplicates == (1, 3, 2, 4)
    finished = Request(status=Status.FINISHED_STOPPED, prompt_len=4, max_tokens=4, prompt_labels=(5,),
                       num_output=4)
    checker.state = State(requests=(finished,) + checker.state.requests[1:], pool=pool)
    checker.names.append("old")
    checker.slot["old"] = 0
    checker.next_unused = len(checker.state.requests)
    checker.finished_slots[0] = None
    checker.output_labels[0] = {1: -1, 3: -1}
    checker.arrival_number[0] = 0
    assert checker._reusable_slot() == 0
    assert checker.state.pool.labels == (5, None, 9, None, 9)
    assert checker.state.pool.duplicates == (2, 4)
    assert checker.state.requests[0] == Request()


def test_blocks_that_fill_up_in_place_are_checked_for_their_label():
    # Two requests with the same first block, prefilled a token at a time: the
    # block each took at its first chunk becomes full two chunks later, and
    # both cache the same label then (a duplicate), in tables the step did
    # not change. The incremental checker must look at those blocks too
    # (it once looked only at blocks that joined or left a table).
    def entry(req: str, start: int, block_ids: list[int]) -> dict:
        return {"req": req, "start": start, "n": 1, "cached": 0, "drafts": 0, "samples": False,
                "block_ids": block_ids}
    events = [{"ev": "config", "num_stages": 2, "max_num_batched_tokens": 4, "max_num_seqs": 2,
               "block_size": 3, "num_blocks": 5, "max_model_len": 13, "long_prefill_token_threshold": 1,
               "prefix_caching": True}]
    for name, last in (("a", 7), ("b", 8)):
        events.append({"ev": "arrive", "req": name, "prompt_len": 4, "max_tokens": 4,
                       "prompt_token_ids": [100, 101, 102, last]})
    for batch, start in enumerate(range(3), start=1):
        events.append({"ev": "schedule", "batch": batch,
                       "entries": [entry("a", start, [0] if start == 0 else []),
                                   entry("b", start, [1] if start == 0 else [])]})
        events.append({"ev": "complete", "batch": batch, "tokens": {"a": [], "b": []}})
    verdict = assert_same_verdict(events)
    assert verdict[0] is True
    checker = IncrementalChecker(events)
    for event in events[1:]:
        checker.feed(event)
    assert checker.state.pool.duplicates            # the label is cached twice
