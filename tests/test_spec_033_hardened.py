"""The hardened vLLM 0.33 variant (issue 21, point 7): `vllm-0.33-hardened`
is vLLM 0.33 with the two cheap guards docs/vllm-0.33-id-reuse.md proposes
against a reused request id -- the waiting loop tests the stale count `> 0`
instead of its truthiness, and the in-flight counter is floored at 0. With
unique names it is vLLM 0.33; with names reused it no longer hangs and its
in-flight counter never goes negative (IF0), but outputs are still bound by
name (S7'). Its two guards are mutants (`stale_tested_by_truthiness`,
`in_flight_below_zero`) killed on the name-reuse model by a property the
hardened base keeps there."""

from __future__ import annotations

import importlib
import json
from dataclasses import fields

import pytest
from flightcheck.spec import CompleteOldest, Config, Request, Sample, Schedule, Status, sampling_entries, step
from flightcheck.spec.profiles import PROFILES, VLLM_0_33, VLLM_0_33_HARDENED
from flightcheck.verification.explicit.search import search
from flightcheck.verification.models import (
    NAME_REUSE_MODELS,
    NAME_REUSE_MUTANT_MODELS,
    REUSE_K2,
    REUSE_K3,
    STALE_K3,
)
from flightcheck.verification.mutants import applied, mutant, mutants_of
from flightcheck.verification.results import SOMETIMES_NAMES
from flightcheck.verification.suite import MOOT_MUTANTS, hunt_mutant_against_base
from flightcheck.verification.traces.counterexample import replay

from flightcheck.cli import main

# `flightcheck.spec.schedule` as an attribute is the function the package
# re-exports, so the modules are looked up by their full names.
spec_schedule = importlib.import_module("flightcheck.spec.schedule")
spec_actions = importlib.import_module("flightcheck.spec.actions")

HARDENED = "vllm-0.33-hardened"
GUARD_MUTANTS = ("stale_tested_by_truthiness", "in_flight_below_zero")
LIVENESS = ("L1_L3_every_request_can_finish", "L2_no_deadlock", "L4_every_run_terminates")


def broken(result) -> dict[str, int]:
    """Each violated safety or liveness property and its shortest counterexample's length."""
    return {v.property: len(v.path) for v in result.violations if v.property not in SOMETIMES_NAMES}


# --- the profile --------------------------------------------------------------------------------

def test_the_hardened_profile_is_0_33_with_a_positive_stale_test_and_a_floored_in_flight_counter():
    assert (VLLM_0_33.stale_test, VLLM_0_33.in_flight_floor) == ("truthy", False)
    assert (VLLM_0_33_HARDENED.stale_test, VLLM_0_33_HARDENED.in_flight_floor) == ("positive", True)
    assert PROFILES[HARDENED] is VLLM_0_33_HARDENED
    differ = {f.name for f in fields(VLLM_0_33) if getattr(VLLM_0_33, f.name) != getattr(VLLM_0_33_HARDENED, f.name)}
    assert differ == {"name", "stale_test", "in_flight_floor"}
    for old in ("vllm-0.8.5", "vllm-0.8.4"):
        assert (PROFILES[old].stale_test, PROFILES[old].in_flight_floor) == ("truthy", False)


def test_the_guards_differ_from_0_33_only_on_a_negative_count():
    cfg_033, cfg_hard = Config(profile="vllm-0.33"), Config(profile=HARDENED)
    negative, positive = Request(status=Status.PREEMPTED, num_stale=-2), Request(status=Status.PREEMPTED, num_stale=2)
    assert spec_schedule._has_stale_output(negative) and not spec_schedule._has_positive_stale_output(negative)
    assert spec_schedule._has_stale_output(positive) and spec_schedule._has_positive_stale_output(positive)
    from flightcheck.spec import initial_state
    s = initial_state(1, 2).with_request(0, status=Status.RUNNING, num_in_flight=-3)
    assert spec_actions._floor_in_flight(s, cfg_hard, 0).requests[0].num_in_flight == 0
    assert spec_actions._floor_in_flight(s, cfg_033, 0).requests[0].num_in_flight == -3
    settled = s.with_request(0, num_in_flight=1)
    assert spec_actions._floor_in_flight(settled, cfg_hard, 0) == settled


def test_with_unique_names_the_hardened_variant_reaches_exactly_0_33_s_states():
    """Neither guard binds while names are unique (IF1, IF2): the same graph."""
    plain = search(STALE_K3, check_liveness=False)
    hardened_model = STALE_K3.under_profile(HARDENED)
    hardened = search(hardened_model, check_liveness=False)
    assert plain.ok and hardened.ok
    assert (hardened.num_states, hardened.num_edges) == (plain.num_states, plain.num_edges)


def test_the_guard_mutants_are_moot_with_unique_names_and_hunted_with_names_reused():
    moot = MOOT_MUTANTS[HARDENED]
    for name in GUARD_MUTANTS:
        assert mutant(name).profile == HARDENED and name in mutants_of(HARDENED)
        assert "allow-name-reuse" in moot[name]
        assert name not in mutants_of("vllm-0.33")
    assert set(MOOT_MUTANTS["vllm-0.33"]) <= set(moot)
    assert set(NAME_REUSE_MUTANT_MODELS[HARDENED]) == set(GUARD_MUTANTS)
    assert all(m in NAME_REUSE_MODELS[HARDENED] for m in NAME_REUSE_MUTANT_MODELS[HARDENED].values())


# --- names reused: what the guards fix and what they do not --------------------------------------

@pytest.fixture(scope="module")
def reuse_k3_search():
    return search(REUSE_K3)


def test_0_33_s_hang_and_negative_counter_are_gone_under_the_hardened_variant():
    """reuse-k2, where vLLM 0.33 hangs (L4, a 14-step lasso) with its counter
    below 0 (IF0): the hardened variant keeps every liveness property and IF0;
    the wrong binding (S7') and the counter drift (IF1) stay."""
    hardened = broken(search(REUSE_K2.under_profile(HARDENED)))
    assert not set(hardened) & {*LIVENESS, "IF0_in_flight_never_negative"}, hardened
    assert {"S7p_binding_by_incarnation": 5, "IF1_in_flight_counter": 6}.items() <= hardened.items()


def test_on_reuse_k3_the_hardened_base_keeps_liveness_and_if0_but_not_the_binding(reuse_k3_search):
    found = broken(reuse_k3_search)
    assert REUSE_K3.cfg.profile == HARDENED and "name_reused_in_flight" in reuse_k3_search.reached
    assert not set(found) & {*LIVENESS, "IF0_in_flight_never_negative"}, found
    # binding by name is the root bug: the guards do not touch it; the stale
    # count a reused name drains still goes below 0 (IF2; vLLM would assert)
    assert {"S7p_binding_by_incarnation": 5, "IF2_stale_counter": 8}.items() <= found.items()


@pytest.fixture(scope="module")
def guard_hunts(reuse_k3_search):
    base_broken = set(broken(reuse_k3_search))
    return {name: hunt_mutant_against_base(name, NAME_REUSE_MUTANT_MODELS[HARDENED][name], base_broken)
            for name in GUARD_MUTANTS}


@pytest.mark.parametrize("name", GUARD_MUTANTS)
def test_each_guard_mutant_breaks_a_property_the_hardened_base_keeps(name, reuse_k3_search, guard_hunts):
    m = mutant(name)
    assert m.killed_by not in broken(reuse_k3_search)                  # the base passes it ...
    result = guard_hunts[name]
    assert result.killed and (result.property, result.trace_length) == (m.killed_by, m.shortest)  # ... the mutant not
    cx = result.counterexample
    assert cx.model.mutant == name and replay(cx.model, cx.actions) == cx.states


def _drain(state, cfg):
    """Complete every batch in flight (no stop tokens)."""
    while state.in_flight:
        state = step(state, cfg, CompleteOldest(tuple(Sample() for _ in sampling_entries(state, cfg))))
    return state


def test_the_truthy_stale_test_wedges_a_request_on_a_negative_stale_count(guard_hunts):
    """stale_tested_by_truthiness: from where its counterexample ends, the
    old incarnation's batch drains the new one's stale count to -2; the
    truthy test then defers the PREEMPTED request on every schedule (an
    empty batch), while the hardened base resumes it."""
    cx = guard_hunts["stale_tested_by_truthiness"].counterexample
    cfg = cx.model.cfg
    with applied(cx.model.mutant):
        stuck = _drain(cx.states[-1], cfg)
        wedged = [r for r, q in enumerate(stuck.requests) if q.status is Status.PREEMPTED and q.num_stale < 0]
        assert wedged
        spun = _drain(step(stuck, cfg, Schedule()), cfg)
        assert spun == stuck                       # an empty batch, and back: the spin
    resumed = step(stuck, cfg, Schedule())
    assert resumed.requests[wedged[0]].status is Status.RUNNING


def test_verify_allow_name_reuse_under_the_hardened_variant_kills_both_guard_mutants(capsys):
    assert main(["verify", "--profile", HARDENED, "--allow-name-reuse", "--json"]) == 1   # S7' still breaks
    report = json.loads(capsys.readouterr().out)
    rows = {p["name"]: p["status"] for p in report["properties"]}
    kills = {m["name"]: (m["killed"], m["property"], m["trace_length"], m["model"]) for m in report["mutants"]}
    assert kills == {name: (True, mutant(name).killed_by, mutant(name).shortest, "reuse-k3") for name in GUARD_MUTANTS}
    for name in GUARD_MUTANTS:
        assert rows[mutant(name).killed_by] == "proved"
    assert rows["L4_every_run_terminates"] == "proved" and rows["S7p_binding_by_incarnation"] == "violated"
    found = {cx["property"] for cx in report["counterexamples"]}
    assert "S7p_binding_by_incarnation" in found and not found & {*LIVENESS, "IF0_in_flight_never_negative"}
