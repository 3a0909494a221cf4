"""The spec's mutants live in verification/mutants, not in the spec: the spec
names none of them; each is a small edit of spec functions, matched as code, so
a change to the code it edits fails loudly here and a docstring, comment or
layout change does not; `applied` puts the edited code in force and always
puts the original back; no mutant is a copy of a spec function; the
registry's kills are the golden file's; and every mutant switch of the Z3
encodings is a registered mutant."""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import json
import re
import sys
from pathlib import Path

import pytest

import flightcheck.spec as spec_package
from flightcheck.verification.models import TIGHT_K2, Model
from flightcheck.verification.mutants import (ALL_MUTANTS, MUTANTS, MutantNoLongerApplies, active, applied, drifted,
                                              patch, patching, registry)
from flightcheck.verification.z3.param.model import PARAM_MUTANTS

from .fixtures import read_module_as_rewritten

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "verify-before-layout-move.json"
RENAMED = {"S7_fates_only_age": "S13_fates_only_age", "L2_every_run_terminates": "L4_every_run_terminates"}
spec_schedule = registry.spec_function("schedule.schedule").__globals__      # the module's namespace
SCHEDULE_PY = ROOT / "spec" / "schedule.py"


@pytest.mark.parametrize("name", list(ALL_MUTANTS))
def test_every_edit_of_every_mutant_still_applies(name):
    failures = drifted(ALL_MUTANTS[name])
    assert not failures, "\n".join(failures)


def _with_schedule_source(monkeypatch, edit) -> None:
    """Make the mechanism read spec/schedule.py as `edit` rewrites it."""
    read_module_as_rewritten(monkeypatch, patching._SPEC, "flightcheck.spec.schedule", edit)


def test_a_changed_line_of_the_edited_code_refuses_the_mutant_and_names_it_and_the_function(monkeypatch):
    _with_schedule_source(monkeypatch, lambda text: text.replace("    step.budget -= num_new\n",
                                                                 "    step.budget = step.budget - num_new\n"))
    with pytest.raises(MutantNoLongerApplies,
                       match=r"mutant overlapping_chunks no longer applies: spec.schedule._add_entry holds its "
                             r"old text 0 times, not once .*\n  old: step.budget -= num_new"):
        with applied("overlapping_chunks"):
            pass
    assert active() is None
    assert any("spec.schedule._add_entry" in f for f in drifted(MUTANTS["budget_ignored"]))


def test_old_text_found_twice_is_refused_too(monkeypatch):
    m = MUTANTS["preempt_keeps_counter"]
    twice = dataclasses.replace(m, edits=(dataclasses.replace(m.edits[0], old="Fate", new="Fates"),))
    monkeypatch.setitem(registry.ALL_MUTANTS, m.name, twice)
    with pytest.raises(MutantNoLongerApplies, match=r"spec.schedule._preempt holds its old text 2 times"):
        with applied(m.name):
            pass
    assert active() is None


def test_docstring_comment_and_layout_edits_leave_every_edit_of_the_function_applying(monkeypatch):
    def reword(text: str) -> str:
        text = text.replace('"""The batch records r\'s snapshot from num_computed on, charged to the budget;',
                            '"""Reworded: the batch records a snapshot, charged to the budget;')
        text = text.replace("# async: tokens in flight count as known", "# a reworded comment")
        text = text.replace("ScheduledEntry(r, req.num_computed, num_new, cached, drafts, samples,\n",
                            "ScheduledEntry(\n        r, req.num_computed, num_new, cached, drafts, samples,\n")
        text = text.replace("    step.budget -= num_new\n", "    step.budget -= (num_new)   # the charge\n")
        return text
    assert reword(SCHEDULE_PY.read_text()).count("Reworded") == 1 and "a reworded comment" in reword(
        SCHEDULE_PY.read_text()) and "ScheduledEntry(\n" in reword(SCHEDULE_PY.read_text())
    _with_schedule_source(monkeypatch, reword)
    for name in ("snapshot_omits_prefix_hit", "budget_ignored", "overlapping_chunks", "stale_drafts_on_prefill_chunk"):
        assert not drifted(MUTANTS[name]), name


def test_an_edit_that_changes_nothing_is_refused(monkeypatch):
    m = MUTANTS["draft_cap_ignored"]
    idle = dataclasses.replace(m, edits=(dataclasses.replace(m.edits[0], new="cfg.num_spec_tokens"),))
    monkeypatch.setitem(registry.ALL_MUTANTS, m.name, idle)
    with pytest.raises(MutantNoLongerApplies, match="leave spec.actions.max_next_drafts as it was"):
        with applied(m.name):
            pass


def test_no_file_of_the_spec_names_a_mutant():
    """Every source file of spec/ is read: what `flightcheck verify` leaves
    there (the compiled `.pyc` files under spec's `__pycache__`) is not one."""
    sources = [path for path in sorted((ROOT / "spec").rglob("*")) if path.is_file()
               and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo")]
    assert {p.name for p in sources} >= {"README.md", "schedule.py", "actions.py"}
    for path in sources:
        text = path.read_text()
        names = [n for n in MUTANTS if re.search(rf"\b{n}\b", text)]
        assert not names, f"{path.name} names the mutants {names}"
        if path.suffix == ".py":
            assert "mutant" not in text.lower(), f"{path.name} mentions mutants"


def test_the_spec_config_has_no_field_naming_a_bug():
    fields = {f.name for f in dataclasses.fields(spec_package.Config)}
    assert "mutant" not in fields and not fields & set(MUTANTS)


@pytest.mark.parametrize("name", list(ALL_MUTANTS))
def test_each_edited_function_keeps_its_parameters_and_changes_its_code(name):
    for target, edited in ALL_MUTANTS[name].replaces.items():
        original = registry.ORIGINALS[target]
        assert list(inspect.signature(edited).parameters) == list(inspect.signature(original).parameters), \
            (name, target)
        def code(f):
            return f.__code__.co_code, f.__code__.co_consts, f.__code__.co_names
        assert code(edited) != code(original), (name, target)
        assert name in edited.__doc__


def test_applied_runs_the_edited_code_in_every_holder_and_puts_the_original_back():
    original = registry.ORIGINALS["schedule.schedule"]
    original_code = original.__code__
    transitions = vars(sys.modules["flightcheck.spec.transitions"])      # imported schedule by name
    assert spec_schedule["schedule"] is original and spec_package.schedule is original
    assert transitions["schedule"] is original
    with applied("admit_after_preemption"):
        assert active() == "admit_after_preemption"
        edited_code = original.__code__
        assert edited_code is not original_code
        assert spec_schedule["schedule"] is original and spec_package.schedule is original
        assert transitions["schedule"] is original                     # one object, running the edit
        with applied("admit_after_preemption"):                        # the same again: nothing to do
            assert active() == "admit_after_preemption"
        assert original.__code__ is edited_code
    assert active() is None
    assert original.__code__ is original_code


def test_applied_changes_what_the_spec_does():
    """draft_cap_ignored: the drafter may propose k + 1 drafts."""
    cfg, max_next_drafts = TIGHT_K2.cfg, registry.ORIGINALS["actions.max_next_drafts"]
    assert max_next_drafts(cfg) == cfg.num_spec_tokens
    with applied("draft_cap_ignored"):
        assert max_next_drafts(cfg) == cfg.num_spec_tokens + 1
    assert max_next_drafts(cfg) == cfg.num_spec_tokens


def test_applied_puts_the_originals_back_after_an_exception():
    original = registry.ORIGINALS["schedule._num_required_blocks"]
    original_code = original.__code__
    with pytest.raises(KeyError):
        with applied("no_block_for_last_token"):
            assert original.__code__ is not original_code
            raise KeyError("inside the check")
    assert spec_schedule["_num_required_blocks"] is original and original.__code__ is original_code
    assert active() is None


def test_two_mutants_never_stack_and_unknown_names_are_refused():
    with applied("budget_ignored"):
        with pytest.raises(RuntimeError, match="cannot go on top"):
            with applied("no_length_cap"):
                pass
    with pytest.raises(ValueError, match="unknown mutant"):
        with applied("no_such_bug"):
            pass
    with pytest.raises(ValueError, match="unknown mutant"):
        Model("x", TIGHT_K2.cfg, TIGHT_K2.prompts, mutant="no_such_bug")


def test_the_registry_records_the_kills_of_the_golden_file():
    golden = {m["name"]: m for m in json.loads(GOLDEN.read_text())["mutants"]}
    assert set(golden) == set(MUTANTS)
    for name, m in MUTANTS.items():
        row = golden[name]
        assert (m.killed_by, m.shortest) == (RENAMED.get(row["property"], row["property"]), row["trace_length"]), name


def _z3_switch_names() -> set[str]:
    names: set[str] = set()
    for path in sorted((ROOT / "verification" / "z3").rglob("*.py")):
        text = path.read_text()
        names |= set(re.findall(r'is_mutant\("([a-z_]+)"\)', text))
        names |= set(re.findall(r'mutant\s*[!=]=\s*"([a-z_]+)"', text))
    return names


def test_every_z3_switch_is_a_registered_mutant():
    names = _z3_switch_names()
    assert len(names) >= 20                    # the scan does find the encodings' switches
    # a feature's switch (reset and pause, sessions, grammar, priority) names
    # one of that feature's mutants, registered beside the every-profile ones
    assert names <= set(ALL_MUTANTS), sorted(names - set(ALL_MUTANTS))
    assert set(PARAM_MUTANTS) <= set(MUTANTS)


def _bodies(path: Path) -> dict[str, str]:
    """Each function's body as written (its docstring left out), by name."""
    source = path.read_text()
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = patch.body_without_docstring(node)
            if body:
                lines = source.splitlines()[body[0].lineno - 1:body[-1].end_lineno]
                found[f"{path.name}:{node.name}"] = "\n".join(line.strip() for line in lines)
    return found


def _copies(ours: dict[str, str], theirs: dict[str, str]) -> list[tuple[str, str, float]]:
    """Pairs of a body of ours of six or more lines and a body of theirs
    that are 80 % the same text (difflib's ratio)."""
    copies = []
    for name, body in ours.items():
        if body.count("\n") + 1 < 6:
            continue
        for their_name, their_body in theirs.items():
            matcher = difflib.SequenceMatcher(None, body, their_body, autojunk=False)
            if matcher.real_quick_ratio() >= 0.8 and matcher.quick_ratio() >= 0.8 and matcher.ratio() >= 0.8:
                copies.append((name, their_name, round(matcher.ratio(), 2)))
    return copies


def test_no_mutant_is_a_copy_of_the_function_it_alters():
    """No function body of six or more lines in verification/mutants is 80 %
    the same text as a body in spec/ (difflib's ratio)."""
    spec_bodies = {k: v for p in sorted((ROOT / "spec").glob("*.py")) for k, v in _bodies(p).items()}
    ours = {k: v for p in sorted((ROOT / "verification" / "mutants").glob("*.py")) for k, v in _bodies(p).items()
            if v.count("\n") + 1 >= 6}
    assert len(ours) >= 5 and len(spec_bodies) >= 50          # the scan does read both
    copies = _copies(ours, spec_bodies)
    assert not copies, copies


def test_no_function_of_verification_is_a_copy_of_one_of_the_reference():
    """No function body of six or more lines anywhere in verification/ (the
    reference's mutants included) is 80 % the same text as a body in
    reference/: a reference mutant is an edit, never a copied method."""
    def bodies(folder: Path) -> dict[str, str]:
        return {f"{p.relative_to(ROOT)}:{name.split(':', 1)[1]}": body
                for p in sorted(folder.rglob("*.py")) for name, body in _bodies(p).items()}
    reference_bodies = bodies(ROOT / "reference")
    ours = bodies(ROOT / "verification")
    assert len(reference_bodies) >= 100 and sum(b.count("\n") >= 5 for b in ours.values()) >= 200  # both read
    copies = _copies(ours, reference_bodies)
    assert not copies, copies


def test_the_readme_lists_every_mutant_as_the_registry_records_it():
    text = (ROOT / "verification" / "mutants" / "README.md").read_text()
    for m in MUTANTS.values():
        replaces = ", ".join(f"`{target}`" for target in m.targets)
        assert f"| `{m.name}` | {m.kind} | {replaces} | {m.killed_by} | {m.shortest} |" in text, m.name


def test_the_mechanism_edits_a_method_for_its_class_its_subclasses_and_their_instances(tmp_path, monkeypatch):
    """The path the reference's mutants take: an edit of `Scheduler._clip`
    reaches every subclass and instance, and goes away on exit."""
    (tmp_path / "toy_scheduler.py").write_text(
        "class Scheduler:\n"
        "    def _clip(self, n: int) -> int:\n"
        '        """The budget clips n."""\n'
        "        return min(n, self.budget)   # never past the budget\n"
        "\n"
        "class TracingScheduler(Scheduler):\n"
        "    budget = 4\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import toy_scheduler
    edit = patch.Edit("toy_scheduler", "Scheduler._clip", "min(n, self.budget)", "n")
    tracing = toy_scheduler.TracingScheduler()
    assert tracing._clip(9) == 4
    with patch.swapped(patch.edited_code("budget_ignored_in_the_toy", [edit])):
        assert tracing._clip(9) == 9 and toy_scheduler.TracingScheduler()._clip(9) == 9
    assert tracing._clip(9) == 4
    moved = patch.Edit("toy_scheduler", "Scheduler._clip", "max(n, self.budget)", "n")
    with pytest.raises(MutantNoLongerApplies, match=r"mutant budget_ignored_in_the_toy no longer applies: "
                                                    r"toy_scheduler.Scheduler._clip holds its old text 0 times"):
        patch.edited_code("budget_ignored_in_the_toy", [moved])
