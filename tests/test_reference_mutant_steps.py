"""The reference mutants are kept apart from the policy: each replaces named
steps of `Scheduler` on the one scheduler built for it, and a mutant whose
step changed since it was written is reported, loudly, instead of drifting."""

from __future__ import annotations

import ast
import inspect
import io

import pytest

from flightcheck.reference import (Scheduler, SchedulerConfig, TraceWriter,
                                   TracingScheduler, make_scheduler, mutant_steps)
from flightcheck.reference.mutants import ALL_MUTANTS as MUTANTS   # vLLM 0.33's included
from flightcheck.reference import batch, completion, scheduler
from flightcheck.reference.completion import Fate
from flightcheck.reference.outputs import RequestData
from flightcheck.reference.request import Request


def config(mutant: str | None = None) -> SchedulerConfig:
    return SchedulerConfig(max_model_len=64, num_blocks=16, mutant=mutant)


def test_every_named_mutant_has_steps_and_every_step_belongs_to_a_named_mutant():
    assert set(Scheduler.mutant_steps) == set(MUTANTS)
    assert all(Scheduler.mutant_steps[name] for name in MUTANTS)


def test_every_replaced_step_is_a_step_of_the_scheduler_with_the_same_parameters():
    for name, steps in Scheduler.mutant_steps.items():
        for step_name, step in steps.items():
            correct = getattr(Scheduler, step_name)
            assert list(inspect.signature(step).parameters)[1:] == \
                list(inspect.signature(correct).parameters)[1:], f"{name}: {step_name}"


def test_no_mutant_was_written_against_an_older_version_of_its_step():
    drifted = mutant_steps.drifted_steps()
    assert not drifted, "\n".join(drifted)


def test_a_changed_step_makes_its_mutants_fail_loudly(monkeypatch):
    def _fate(self, entry, request):          # a changed rule
        return Fate.SUPERSEDED
    monkeypatch.setattr(Scheduler, "_fate", _fate)
    drifted = mutant_steps.drifted_steps()
    assert len(drifted) == 2
    assert all(line.startswith(("mutant stale_output_applied_to_resumed no longer applies: "
                                "Scheduler._fate changed",
                                "mutant output_bound_by_name no longer applies: "
                                "Scheduler._fate changed")) for line in drifted)


def test_a_docstring_or_comment_edit_is_not_a_change():
    def _samples(self, entry: RequestData, request: Request, fate: Fate) -> bool:
        """Reworded."""
        return entry.samples                  # a new comment
    original = mutant_steps.fingerprint_of("_samples")
    Scheduler._samples, saved = _samples, Scheduler._samples
    try:
        assert mutant_steps.fingerprint_of("_samples") == original
    finally:
        Scheduler._samples = saved


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_a_mutant_replaces_its_steps_on_its_own_scheduler_only(mutant):
    buggy = Scheduler(config(mutant))
    correct = Scheduler(config())
    steps = Scheduler.mutant_steps[mutant]
    for step_name, step in steps.items():
        assert getattr(buggy, step_name).__func__ is step
        assert getattr(correct, step_name).__func__ is getattr(Scheduler, step_name)
    assert not set(vars(correct)) & {s for all_steps in Scheduler.mutant_steps.values() for s in all_steps}


def test_a_traced_mutant_is_traced_and_mutated():
    sink = io.StringIO()
    traced = make_scheduler(config("rejections_not_subtracted"), TraceWriter(sink))
    assert isinstance(traced, TracingScheduler)
    assert traced._subtract_rejections.__func__ is \
        Scheduler.mutant_steps["rejections_not_subtracted"]["_subtract_rejections"]
    assert '"mutant":"rejections_not_subtracted"' in sink.getvalue()


def _names_in(function: ast.FunctionDef) -> set[str]:
    names = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
    return names


def test_the_policy_writes_no_trace_and_asks_for_no_mutant():
    """Only the constructor reads the selector, to swap a mutant's steps in;
    no step of the policy, nor the helpers it calls, mentions a trace or a mutant."""
    tree = ast.parse(inspect.getsource(scheduler))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Scheduler"]
    for function in cls.body:
        if isinstance(function, ast.FunctionDef) and function.name not in ("__init__", "_swap_in_mutant"):
            names = {n.lower() for n in _names_in(function)}
            assert not {n for n in names if "mutant" in n or "trace" in n}, function.name
    for module in (batch, completion):
        assert "mutant" not in inspect.getsource(module).lower(), module.__name__
    assert "TraceWriter" not in inspect.getsource(scheduler)
