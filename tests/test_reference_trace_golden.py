"""The trace a traced reference run writes is pinned byte for byte: the
golden file was captured before tracing moved out of the scheduler into
`TracingScheduler` (and before the mutants became edits applied from
verification/mutants/reference.py), so any change to what the reference
writes, or to what it or a mutant does, shows here."""

from __future__ import annotations

import difflib
import io
import json
from pathlib import Path

import pytest

from flightcheck.reference import TraceWriter
from flightcheck.tests.reference_trace_runs import digest, drive, run_cases, traced_run

GOLDEN = json.loads((Path(__file__).parent / "golden" / "reference_traces.json").read_text())


def test_the_golden_file_covers_every_run():
    assert set(GOLDEN["sha256"]) == {name for name, *_ in run_cases()}


@pytest.mark.parametrize("name, mutant, continue_prefill, seed", run_cases(),
                         ids=[case[0] for case in run_cases()])
def test_a_traced_run_writes_the_same_bytes_as_before(name, mutant, continue_prefill, seed):
    text = traced_run(mutant, continue_prefill, seed)
    if name in GOLDEN["text"] and text != GOLDEN["text"][name]:
        diff = difflib.unified_diff(GOLDEN["text"][name].splitlines(), text.splitlines(),
                                    "golden", "now", lineterm="", n=1)
        pytest.fail("\n".join(list(diff)[:40]))
    assert digest(text) == GOLDEN["sha256"][name], f"{name}: the trace differs from the golden one"


def test_the_runs_exercise_every_event_kind_and_most_mutants_damage():
    """The golden runs are worth pinning: they preempt, drop, abort, finish
    from outside, hit the prefix cache, propose drafts, and most mutants
    write another trace than the correct scheduler on the same run."""
    text = GOLDEN["text"]["correct-cp-5"] + GOLDEN["text"]["correct-obpr-5"]
    for marker in ('"ev":"abort"', '"ev":"finish"', '"dropped"', '"next_drafts"',
                   '"preempted":["', '"reason":"stop"', '"reason":"length"', '"cached":4'):
        assert marker in text, marker

    without_config = GOLDEN["sha256_without_config"]
    correct = {(cp, seed): without_config[name]
               for name, mutant, cp, seed in run_cases() if mutant is None}
    damaging = {mutant for name, mutant, cp, seed in run_cases()
                if mutant is not None and without_config[name] != correct[cp, seed]}
    assert len(damaging) >= 8, damaging


@pytest.mark.parametrize("mutant", [None, "shared_snapshot", "rejections_not_subtracted"])
def test_tracing_changes_nothing_the_scheduler_does(mutant):
    for continue_prefill in (True, False):
        for seed in (0, 5):
            traced = drive(mutant, continue_prefill, seed, TraceWriter(io.StringIO()))
            assert traced[0]
            assert drive(mutant, continue_prefill, seed, None) == traced
