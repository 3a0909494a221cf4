"""`flightcheck verify --json` after the layout move (issue 18) gives the rows
and mutant kills it gave before: the same properties, statuses, methods and
depths, the same mutants killed by the same property with counterexamples of
the same length. Seconds aside; properties renamed by the move are compared
through the rename map (docs/renames.md).

Deliberate updates since (issue 19, version profiles): shared-k3 has 10014
states (duplicate cached blocks), the model forward-k3 adds its rows, and BMC
reaches the new target duplicate_cached_block at depth 4 on shared-k3.
Held drafts (vLLM 0.8.x's `Profile.held_drafts_left_uncached`: a preempted
request keeps its drafts, and an allocation leaves every draft held
uncached): pressure-k2 has 4853 states (4124 before), shared-k3 10228
(10014); every verdict, depth and mutant kill is unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flightcheck.cli import main

from .cpu_time import cpu_seconds

GOLDEN = Path(__file__).parent / "golden" / "verify-before-layout-move.json"
RENAMED = {"S7_fates_only_age": "S13_fates_only_age",
           "L2_every_run_terminates": "L4_every_run_terminates"}


def comparable(report: dict) -> tuple[list[dict], list[dict]]:
    def rename(name):
        return RENAMED.get(name, name)
    rows = [{**{k: v for k, v in p.items() if k != "seconds"}, "name": rename(p["name"])}
            for p in report["properties"]]
    kills = [{**{k: v for k, v in m.items() if k != "seconds"}, "property": rename(m["property"])}
             for m in report["mutants"]]
    return rows, kills


def verify_json(capsys, *args: str) -> dict:
    capsys.readouterr()
    assert main(["verify", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_explicit_rows_and_mutant_kills_equal_the_golden_file(capsys):
    want_rows, want_kills = comparable(json.loads(GOLDEN.read_text()))
    got_rows, got_kills = comparable(verify_json(capsys, "--no-z3"))
    assert got_rows == [r for r in want_rows if r["method"].startswith("exhaustive")]
    assert got_kills == want_kills


# What the default `flightcheck verify --json` costs: 157 s of CPU, the driver
# and its two workers together (154.8 s user + 1.8 s sys, 2026-12-07,
# /usr/bin/time; the README's 2 minutes are its wall time on an idle 2-core
# machine). At load 16 to 19 under `nice -n 10` the same run took 1,654 s of
# wall time, past the old wall-time bound of 300 s: that bound measured the
# host. The bound is on the CPU, about twice the cost, so that it catches a
# regression of several times and not a busy host.
VERIFY_CPU_LIMIT_S = 320


def test_the_default_run_equals_the_golden_file_in_under_two_minutes(capsys):
    want = comparable(json.loads(GOLDEN.read_text()))
    before = cpu_seconds()
    report = verify_json(capsys)
    cpu = cpu_seconds() - before
    assert comparable(report) == want
    assert report["ok"]
    assert cpu < VERIFY_CPU_LIMIT_S, \
        f"flightcheck verify took {cpu:.0f} s of CPU ({report['seconds']:.0f} s of wall time)"


@pytest.mark.parametrize("old,new", sorted(RENAMED.items()))
def test_renamed_properties_exist_under_their_new_name_only(old, new):
    from flightcheck.verification.suite import all_property_names
    names = all_property_names()
    assert new in names and old not in names
