"""Structured output in the Z3 encoding (docs/proofs.md, "Structured output"):
the encoding against the spec on the grammar model's states, G1-G3 as Z3
formulas against the spec's predicates, proved by k-induction with the
grammar's auxiliary invariants and bounded by BMC, and a grammar mutant
caught by BMC with its trace replayed on the spec."""

from __future__ import annotations

from dataclasses import replace

import pytest
import z3
from flightcheck.spec import Status
from flightcheck.spec.state import Grammar
from flightcheck.spec.invariants import GRAMMAR_INVARIANTS
from flightcheck.verification.z3.encoding.crosscheck import CrossChecker, CrossReport, reachable
from flightcheck.verification.z3.encoding.structured_output_invariants import GRAMMAR_AUXILIARY, GRAMMAR_FORMULAS
from flightcheck.verification.z3.encoding.system import System
from flightcheck.verification.z3.grammar_models import (
    GRAMMAR_Z3,
    GRAMMAR_Z3_BMC_DEPTH,
    GRAMMAR_Z3_MUTANT,
    grammar_z3_auxiliary,
    grammar_z3_mutant_model,
)
from flightcheck.verification.z3.kv_engines import kv_bmc, kv_induction

GRAMMAR_NAMES = [inv.name for inv in GRAMMAR_INVARIANTS]


@pytest.fixture(scope="module")
def states() -> list:
    return list(reachable(GRAMMAR_Z3))


def test_the_model_is_small_and_reaches_every_grammar_state(states: list) -> None:
    assert len(states) == 701
    seen = {q.grammar for s in states for q in s.requests}
    assert seen == {Grammar.NONE, Grammar.COMPILING, Grammar.READY, Grammar.FAILED}
    assert any(q.status is Status.FINISHED_ERROR for s in states for q in s.requests)
    assert any(s.grammar_errors for s in states)
    assert any(e.mask is not None for s in states for b in s.in_flight for e in b)


def test_the_encoding_refuses_what_it_leaves_out() -> None:
    from flightcheck.verification.grammar_models import GRAMMAR_SPEC_K1, _under
    for profile in ("vllm-0.34-async", "vllm-0.34"):
        with pytest.raises(ValueError, match="structured output leaves out"):
            System(_under(GRAMMAR_SPEC_K1, profile))


def test_crosscheck_on_a_sample_of_reachable_states(states: list) -> None:
    """Both ways, every 50th reachable state (the whole set: the slow test below)."""
    checker, report = CrossChecker(GRAMMAR_Z3), CrossReport()
    for s in states[::50]:
        checker.check(s, report)
    assert report.problems == []
    assert report.states == len(states[::50])


def test_crosscheck_on_every_reachable_state(states: list) -> None:
    checker, report = CrossChecker(GRAMMAR_Z3), CrossReport()
    for s in states:
        checker.check(s, report)
    assert report.problems == []
    assert (report.states, report.edges) == (701, 1394)


def _holds(system: System, name: str, state) -> bool:
    formula = {**GRAMMAR_FORMULAS, **GRAMMAR_AUXILIARY}[name]
    return z3.is_true(z3.simplify(system.build(formula, system.constant(state))))


def _perturbed(states: list) -> list:
    """States near the reachable ones that break G1-G3: a compiling request
    running, an FSM off by one, a refused grammar."""
    out = []
    for s in states:
        for r, q in enumerate(s.requests):
            if q.grammar is Grammar.READY:
                out.append(s.with_request(r, fsm=q.fsm + 1))
                out.append(s.with_request(r, grammar=Grammar.REJECTED))
                out.append(s.with_request(r, grammar=Grammar.COMPILING))
            if q.grammar is Grammar.COMPILING and q.status is Status.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR:
                out.append(s.with_request(r, num_computed=1))
                out.append(replace(s, waiting=tuple(x for x in s.waiting if x != r)))
    return out


def test_g1_g3_formulas_agree_with_the_spec(states: list) -> None:
    system = System(GRAMMAR_Z3)
    perturbed = _perturbed(states[::15])
    broken = {inv.name: 0 for inv in GRAMMAR_INVARIANTS}
    for s in states[::15] + perturbed:
        for inv in GRAMMAR_INVARIANTS:
            spec = inv.holds(s, GRAMMAR_Z3.cfg)
            assert _holds(system, inv.name, s) == spec, (inv.name, s)
            broken[inv.name] += not spec
    assert all(n > 0 for n in broken.values()), broken     # each is broken somewhere, and the formula sees it


def test_auxiliary_invariants_hold_on_every_reachable_state(states: list) -> None:
    system = System(GRAMMAR_Z3)
    for s in states[::20]:
        for name in GRAMMAR_AUXILIARY:
            assert _holds(system, name, s), (name, s)


def test_bmc_catches_the_grammar_mutant_and_replays_it_on_the_spec() -> None:
    result = kv_bmc(grammar_z3_mutant_model(), 2, properties=["G1_no_run_while_compiling"])
    g1 = next(p for p in result.properties if p.name == "G1_no_run_while_compiling")
    assert (g1.status, g1.depth) == ("violated", 2)
    assert [str(a) for a in g1.trace] == ["arrive r0 (prompt 2, max_tokens 2)", "schedule"]
    assert g1.states[-1].requests[0].status is Status.RUNNING      # replayed on the spec: runs while compiling
    assert GRAMMAR_Z3_MUTANT == "compiling_grammar_scheduled"


def test_bmc_bounds_g1_g3() -> None:
    result = kv_bmc(GRAMMAR_Z3, GRAMMAR_Z3_BMC_DEPTH)
    assert {p.name: (p.status, p.depth) for p in result.properties} == {
        "WF_encoding": ("bounded", GRAMMAR_Z3_BMC_DEPTH),
        **{n: ("bounded", GRAMMAR_Z3_BMC_DEPTH) for n in GRAMMAR_NAMES}}


def test_k_induction_proves_g1_g3() -> None:
    """1-induction keeps every conjunct: WF, G1-G3, GA1-GA5 and the 27
    candidates of the plain scheduler (S10 and the S-formulas reading
    `is_active` count a grammar-waiting request in), so G1-G3 hold in every
    reachable state of the model."""
    result = kv_induction(GRAMMAR_Z3, 1, auxiliary=grammar_z3_auxiliary())
    statuses = {p.name: p.status for p in result.properties}
    assert {n: statuses[n] for n in GRAMMAR_NAMES} == {n: "proved" for n in GRAMMAR_NAMES}
    assert len(statuses) == 1 + 3 + len(GRAMMAR_AUXILIARY) + 27
    assert set(statuses.values()) == {"proved"}, {n: s for n, s in statuses.items() if s != "proved"}


def test_verify_structured_output_searches_hunts_and_refuses_other_profiles() -> None:
    """`flightcheck verify --profile vllm-0.34-async --structured-output --no-z3`:
    both grammar models searched, every property proved, the five grammar
    mutants killed (#29379's and #49694's by G3, #45012's failed grammar left
    waiting by L2); 0.8.x has no structured output."""
    from flightcheck.cli import main
    from flightcheck.verification.suite import SuiteOptions, run_suite

    report = run_suite(SuiteOptions(profile="vllm-0.34-async", structured_output=True, use_z3=False)).to_json()
    assert report["ok"] and report["structured_output"]
    kills = {m["name"]: (m["property"], m["trace_length"]) for m in report["mutants"]}
    assert kills == {"stale_fsm_bitmask_29379": ("G3_fsm_never_refuses", 6),
                     "illegal_draft_verified_49694": ("G3_fsm_never_refuses", 6),
                     "compiling_grammar_scheduled": ("G1_no_run_while_compiling", 2),
                     "fsm_advanced_by_drafts_scheduled": ("G2_fsm_tracks_output", 6),
                     "failed_grammar_left_waiting_pr45012": ("L2_no_deadlock", 2)}
    grammar_rows = [p for p in report["properties"] if p["name"] in GRAMMAR_NAMES]
    assert len(grammar_rows) == 6 and all(p["kind"] == "invariant" and p["status"] == "proved" for p in grammar_rows)
    assert main(["verify", "--profile", "vllm-0.8.5", "--structured-output"]) == 2
    assert main(["verify", "--profile", "vllm-0.34", "--structured-output", "--reset-pause"]) == 2
