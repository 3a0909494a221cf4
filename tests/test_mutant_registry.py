"""The spec's mutants live in verification/mutants, not in the spec: the spec
names none of them; each replaces spec functions whose source is fingerprinted,
so a change to one fails loudly here; `applied` swaps them in and always puts
the originals back; the registry's kills are the golden file's; and every
mutant switch of the Z3 encodings is a registered mutant."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import sys
from pathlib import Path

import pytest

import flightcheck.spec as spec_package
from flightcheck.verification.models import TIGHT_K2, Model
from flightcheck.verification.mutants import MUTANTS, MutantNoLongerApplies, active, applied, stale_fingerprints
from flightcheck.verification.mutants import registry
from flightcheck.verification.mutants.patching import no_longer_applies_message
from flightcheck.verification.z3.param.model import PARAM_MUTANTS

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "verify-before-layout-move.json"
RENAMED = {"S7_fates_only_age": "S13_fates_only_age", "L2_every_run_terminates": "L4_every_run_terminates"}
spec_schedule = registry.spec_function("schedule.schedule").__globals__      # the module's namespace


@pytest.mark.parametrize("name", list(MUTANTS))
def test_every_function_a_mutant_replaces_is_unchanged_since_the_mutant_was_derived(name):
    m = MUTANTS[name]
    stale = stale_fingerprints(m)
    assert not stale, no_longer_applies_message(m, stale)


def test_a_changed_original_refuses_the_mutant_and_names_the_function(monkeypatch):
    m = MUTANTS["overlapping_chunks"]
    drifted = dataclasses.replace(m, fingerprints={**m.fingerprints, "schedule._add_entry": "0" * 16})
    monkeypatch.setitem(registry.MUTANTS, m.name, drifted)
    with pytest.raises(MutantNoLongerApplies,
                       match=r"mutant overlapping_chunks no longer applies: spec.schedule._add_entry changed; "
                             r"re-derive the mutant and update its fingerprint"):
        with applied(m.name):
            pass
    assert active() is None


def test_no_file_of_the_spec_names_a_mutant():
    for path in sorted((ROOT / "spec").rglob("*")):
        if not path.is_file():
            continue
        text = path.read_text()
        names = [n for n in MUTANTS if re.search(rf"\b{n}\b", text)]
        assert not names, f"{path.name} names the mutants {names}"
        if path.suffix == ".py":
            assert "mutant" not in text.lower(), f"{path.name} mentions mutants"


def test_the_spec_config_has_no_field_naming_a_bug():
    fields = {f.name for f in dataclasses.fields(spec_package.Config)}
    assert "mutant" not in fields and not fields & set(MUTANTS)


@pytest.mark.parametrize("name", list(MUTANTS))
def test_each_replacement_takes_the_parameters_of_the_function_it_replaces(name):
    for target, replacement in MUTANTS[name].replaces.items():
        original = registry.ORIGINALS[target]
        assert list(inspect.signature(replacement).parameters) == list(inspect.signature(original).parameters), \
            (name, target)
        assert replacement.__doc__ and name in replacement.__doc__, f"{replacement.__name__} does not say it is {name}"


def test_applied_swaps_every_holder_of_the_function_and_puts_the_originals_back():
    m = MUTANTS["admit_after_preemption"]
    original, replacement = registry.ORIGINALS["schedule.schedule"], m.replaces["schedule.schedule"]
    transitions = vars(sys.modules["flightcheck.spec.transitions"])      # imported schedule by name
    with applied(m.name):
        assert active() == m.name
        assert spec_schedule["schedule"] is replacement
        assert spec_package.schedule is replacement and transitions["schedule"] is replacement
        with applied(m.name):                                          # the same again: nothing to do
            assert active() == m.name
        assert spec_package.schedule is replacement
    assert active() is None
    assert spec_schedule["schedule"] is original
    assert spec_package.schedule is original and transitions["schedule"] is original


def test_applied_puts_the_originals_back_after_an_exception():
    with pytest.raises(KeyError):
        with applied("no_block_for_last_token"):
            raise KeyError("inside the check")
    assert spec_schedule["_num_required_blocks"] is registry.ORIGINALS["schedule._num_required_blocks"]
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
    assert names <= set(MUTANTS), sorted(names - set(MUTANTS))
    assert set(PARAM_MUTANTS) <= set(MUTANTS)


def test_the_readme_lists_every_mutant_as_the_registry_records_it():
    text = (ROOT / "verification" / "mutants" / "README.md").read_text()
    for m in MUTANTS.values():
        replaces = ", ".join(f"`{target}`" for target in m.replaces)
        assert f"| `{m.name}` | {m.kind} | {replaces} | {m.killed_by} | {m.shortest} |" in text, m.name
