"""The trace a traced reference run writes is pinned byte for byte: the
golden file was captured before tracing moved out of the scheduler into
`TracingScheduler` (and the mutants into mutant_steps.py), so any change to
what the reference writes, or to what it or a mutant does, shows here."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest

from flightcheck.tests.reference_trace_runs import digest, run_cases, traced_run

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

    def without_config(run: str) -> list[str]:
        return [line for line in run.splitlines() if not line.startswith('{"ev":"config"')]
    correct = {(cp, seed): without_config(traced_run(None, cp, seed))
               for _, mutant, cp, seed in run_cases() if mutant is None}
    damaging = {mutant for _, mutant, cp, seed in run_cases()
                if mutant is not None and without_config(traced_run(mutant, cp, seed)) != correct[cp, seed]}
    assert len(damaging) >= 8, damaging
