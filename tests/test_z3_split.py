"""Sharing BMC's paths among processes (`z3.bmc.parallel.bmc_split`) changes the wall
time and nothing else: the cubes hold every step label exactly once, and the
merged result has the rows, depths and shortest counterexamples of one BMC."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import z3

from flightcheck.verification import models
from flightcheck.verification.z3.encoding.actions import ABORT, ARRIVE, COMPLETE, SCHEDULE
from flightcheck.verification.z3.bmc.engine import (
    BmcOptions,
    applicable_sometimes,
    bmc,
    default_properties,
)
from flightcheck.verification.z3.bmc.cubes import split
from flightcheck.verification.z3.bmc.parallel import bmc_split
from flightcheck.verification.z3.results import replay
from flightcheck.verification.z3.encoding.system import System
from flightcheck.verification.z3.encoding.terms import V, arithmetic


@pytest.mark.parametrize("parts", [2, 3, 5, 8])
def test_every_label_of_the_cut_step_is_in_exactly_one_part(parts):
    model = models.SHARED_K3
    cubes = split(model, parts)
    assert len(cubes) == parts and len({c.at for c in cubes}) == 1
    width = System(model).layout.width
    with arithmetic(width):
        for act in (ARRIVE, SCHEDULE, COMPLETE, ABORT):
            for req in range(model.num_requests + 1):       # one past the last request too
                step = SimpleNamespace(choices=SimpleNamespace(act=V(act), req=V(req)))
                holders = [i for i, c in enumerate(cubes) if z3.is_true(z3.simplify(c.formula(step)))]
                assert len(holders) == 1, (act, req, holders)


def test_more_parts_than_labels_are_refused():
    with pytest.raises(ValueError, match="at most 8 parts"):
        split(models.SHARED_K3, 9)


def _rows(res):
    return {p.name: (p.status, p.depth) for p in res.properties}


def test_split_bmc_has_the_rows_of_one_bmc():
    model = models.PRESSURE_K2
    one = bmc(model, 5)
    two = bmc_split(model, 5, jobs=2)
    assert two.depth == one.depth == 5
    assert _rows(two) == _rows(one)
    for p in two.properties:
        if p.status == "reached":
            replay(model, p.trace, p.states)


def test_split_bmc_finds_a_mutant_at_its_shortest_depth():
    model = models.mutant_model("preempt_keeps_counter")      # killed at 5 steps, breadth-first too
    res = bmc_split(model, 6, BmcOptions(sometimes=[], stop_at_first=True), jobs=2)
    bad = [p for p in res.properties if p.status == "violated"]
    assert bad and min(p.depth for p in bad) == 5
    for p in bad:
        replay(model, p.trace, p.states)


def test_a_failing_part_is_reported_with_its_traceback():
    with pytest.raises(RuntimeError, match=r"BMC part \d failed:(.|\n)*no_such_property"):
        bmc_split(models.SINGLE_SEQ, 2, BmcOptions(properties=["no_such_property"]), jobs=2)


@pytest.mark.slow
def test_reduced_bmc_in_two_processes_reaches_depth_ten_within_ten_minutes():
    """The acceptance bar: every feature on, 3 requests, K = 3, depth 10 in
    10 minutes (435 s on the 2-core machine, benchmarks/bmc_depth.py --jobs 2)."""
    model = models.SHARED_K3
    res = bmc_split(model, 10, BmcOptions(time_budget=600, reduce=True), jobs=2)
    assert res.depth == 10
    rows = res.by_name()
    assert all(rows[n].status == "bounded" for n in default_properties())
    assert all(rows[n].status == "reached" for n in applicable_sometimes(model))
