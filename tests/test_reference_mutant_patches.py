"""The reference mutants are kept apart from the policy: each is a small edit
of named `Scheduler` steps (verification/mutants/reference.py), put in force
from outside by the one mechanism every mutant uses (the module recompiled,
the method's code swapped, for the class, its subclasses and every instance,
for the length of a block); a mutant whose step changed so that its edit no
longer applies is reported, loudly, instead of drifting; and the reference
itself holds no mutant plumbing."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
from pathlib import Path

import pytest

from flightcheck.reference import (Scheduler, SchedulerConfig, TraceWriter, TracingScheduler,
                                   make_scheduler)
from flightcheck.reference import batch, completion, scheduler, update
from flightcheck.reference.completion import Fate
from flightcheck.reference.profiles import PROFILES
from flightcheck.reference.request import Request, SamplingParams
from flightcheck.verification.mutants import (MutantNoLongerApplies, active_reference, drifted, patch, patching,
                                              reference_applied)
from flightcheck.verification.mutants.reference import (ALL_MUTANTS, KV_MUTANTS, MUTANTS, PROFILE_MUTANTS, REFERENCE_MODULES,
                                                        REFERENCE_MUTANTS, check_mutant, profile_of_mutant)

from .fixtures import read_module_as_rewritten

pytestmark = pytest.mark.usefixtures("both_checkers")

ROOT = Path(__file__).resolve().parent.parent


def config() -> SchedulerConfig:
    return SchedulerConfig(max_model_len=64, num_blocks=16)


def test_every_named_mutant_has_edits_of_the_reference_and_a_profile_it_runs_under():
    assert set(ALL_MUTANTS) == set(MUTANTS) | {name for own in PROFILE_MUTANTS.values() for name in own}
    # the KV connector's are not fuzzed (no fuzzer run has a connector): tests/test_kv_mutants.py;
    # nor are streaming sessions' (no fuzzer run has a session): tests/test_sessions_lockstep.py;
    # the priority policy's, structured output's, reset-and-pause's, LoRA's and the priority-sessions
    # pair's run in their own fuzzers: tests/test_priority_refinement.py, test_grammar_refinement.py,
    # test_reset_pause_refinement.py, test_refinement_lora.py, test_refinement_priority_sessions.py
    from flightcheck.verification.mutants.reference import (GRAMMAR_MUTANTS, LORA_MUTANTS, PRIORITY_MUTANTS,
                                                            PRIORITY_SESSION_MUTANTS, RESET_PAUSE_MUTANTS,
                                                            SESSION_MUTANTS)
    own_fuzzers = (set(KV_MUTANTS) | set(SESSION_MUTANTS) | set(PRIORITY_MUTANTS) | set(GRAMMAR_MUTANTS)
                   | set(RESET_PAUSE_MUTANTS) | set(LORA_MUTANTS) | set(PRIORITY_SESSION_MUTANTS))
    assert set(REFERENCE_MUTANTS) == set(ALL_MUTANTS) | own_fuzzers
    assert not set(ALL_MUTANTS) & own_fuzzers
    for m in REFERENCE_MUTANTS.values():
        assert m.edits and m.history, m.name
        assert {e.module for e in m.edits} <= set(REFERENCE_MODULES.values()), m.name
        assert m.profile is None or m.profile in PROFILES, m.name
        assert profile_of_mutant(m.name) == m.profile
    check_mutant(None)
    with pytest.raises(ValueError, match="unknown mutant 'no_such_bug'"):
        check_mutant("no_such_bug")
    with pytest.raises(ValueError, match="unknown mutant 'no_such_bug'"):
        reference_applied("no_such_bug").__enter__()


@pytest.mark.parametrize("name", list(REFERENCE_MUTANTS))
def test_every_edit_of_every_reference_mutant_still_applies(name):
    failures = drifted(REFERENCE_MUTANTS[name])
    assert not failures, "\n".join(failures)


def _with_update_source(monkeypatch, edit) -> None:
    """Make the mechanism read reference/update.py as `edit` rewrites it."""
    read_module_as_rewritten(monkeypatch, patching._REFERENCE, "flightcheck.reference.update", edit)


def test_a_changed_step_makes_its_mutants_fail_loudly(monkeypatch):
    _with_update_source(monkeypatch, lambda text: text.replace(
        "        return SUPERSEDED                     # rescheduled since, or an older request of its name\n",
        "        return Fate.SUPERSEDED\n"))
    failing = {name: drifted(m) for name, m in REFERENCE_MUTANTS.items() if drifted(m)}
    assert set(failing) == {"stale_output_applied_to_resumed", "output_bound_by_name"}
    for name, (message,) in failing.items():
        assert message.startswith(f"mutant {name} no longer applies: reference.update.OutputUpdate._fate "
                                  f"holds its old text 0 times, not once"), message
    with pytest.raises(MutantNoLongerApplies, match="mutant output_bound_by_name no longer applies"):
        with reference_applied("output_bound_by_name"):
            pass
    assert active_reference() is None


def test_a_docstring_comment_or_layout_edit_is_not_a_change(monkeypatch):
    _with_update_source(monkeypatch, lambda text: text.replace(
        '''        """Whether the entry sampled: its snapshot says (it reached the
        request's known tokens when it was scheduled)."""
        return entry.samples''', '''        """Reworded."""
        return (entry
                .samples)                     # a new comment'''))
    assert "Reworded" in patch.module_source(update)[1]
    assert not drifted(REFERENCE_MUTANTS["final_chunk_from_live_counter"])


def _functions(name: str) -> list:
    return list(patch.edited_code(name, REFERENCE_MUTANTS[name].edits))


@pytest.mark.parametrize("name", list(REFERENCE_MUTANTS))
def test_a_mutant_is_in_force_for_its_class_subclasses_and_instances_inside_its_block_only(name):
    functions = _functions(name)
    originals = {f: f.__code__ for f in functions}
    traced = TracingScheduler(config(), TraceWriter(io.StringIO()))
    with reference_applied(name):
        assert active_reference() == name
        for function in functions:
            assert function.__code__ is not originals[function]
            # a step of the scheduler, or (the prompt-logprobs limit) of its cache manager
            owner, owner_class = ((traced, Scheduler) if hasattr(Scheduler, function.__name__)
                                  else (traced.kv_cache_manager, type(traced.kv_cache_manager)))
            method = getattr(owner, function.__name__)
            assert getattr(method, "__func__", method) is function     # (a static method has none) and getattr(owner_class, function.__name__) is function
        with pytest.raises(RuntimeError, match=f"reference mutant {name} is applied"):
            with reference_applied("shared_snapshot" if name != "shared_snapshot" else "output_bound_by_name"):
                pass
    assert active_reference() is None
    assert all(f.__code__ is code for f, code in originals.items())


def test_a_traced_mutant_run_names_its_mutant_and_runs_its_edit():
    request = Request("a", [1, 2, 3], SamplingParams(max_tokens=4))
    sink = io.StringIO()
    with reference_applied("rejections_not_subtracted"):
        traced = make_scheduler(config(), TraceWriter(sink, extra={"mutant": "rejections_not_subtracted"}))
        assert isinstance(traced, TracingScheduler)
        request.num_computed_tokens = 5
        traced._subtract_rejections(request, Fate.LIVE, 2)
        assert request.num_computed_tokens == 5              # the bug: nothing subtracted
    assert '"mutant":"rejections_not_subtracted"' in sink.getvalue()
    traced._subtract_rejections(request, Fate.LIVE, 2)
    assert request.num_computed_tokens == 3                  # the correct step again
    plain = io.StringIO()
    make_scheduler(config(), TraceWriter(plain))
    assert '"mutant"' not in plain.getvalue()               # only a harness's extra names one


def _names_in(node: ast.AST) -> set[str]:
    """Identifiers of code (names, attributes, arguments, definitions, fields),
    not docstrings or comments."""
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            names.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            names.add(sub.attr)
        elif isinstance(sub, ast.arg):
            names.add(sub.arg)
        elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(sub.name)
        elif isinstance(sub, ast.alias):
            names.add(sub.asname or sub.name)
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str) and len(sub.value) < 40:
            names.add(sub.value)                  # a key or attribute name spelt as a string
    return names


def test_the_reference_holds_no_mutant_plumbing():
    """No config field, class registry, switch, side-effect import or module
    of mutants in reference/: no identifier of its code names a mutant."""
    assert "mutant" not in {f.name for f in dataclasses.fields(SchedulerConfig)}
    assert not [n for n in dir(Scheduler) if "mutant" in n.lower()]
    files = sorted((ROOT / "reference").glob("*.py"))
    assert len(files) >= 10 and not [p.name for p in files if "mutant" in p.name]
    for path in files:
        names = {n.lower() for n in _names_in(ast.parse(path.read_text()))}
        assert not {n for n in names if "mutant" in n}, path.name


def test_the_policy_writes_no_trace():
    """No step of the policy, nor the helpers it calls, mentions a trace."""
    tree = ast.parse(inspect.getsource(scheduler))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Scheduler"]
    for function in cls.body:
        if isinstance(function, ast.FunctionDef):
            assert not {n for n in _names_in(function) if "trace" in n.lower()}, function.name
    for module in (batch, completion):
        assert "mutant" not in inspect.getsource(module).lower(), module.__name__
    assert "TraceWriter" not in inspect.getsource(scheduler)


def test_the_mutants_readme_lists_every_reference_mutant_as_registered():
    text = (ROOT / "verification" / "mutants" / "README.md").read_text()
    for m in REFERENCE_MUTANTS.values():
        edits = ", ".join(f"`{where.removeprefix('reference.')}`" for where in dict.fromkeys(e.where for e in m.edits))
        assert f"| `{m.name}` | {edits} | {m.profile or 'every profile'} |" in text, m.name
