"""`flightcheck verify`: output shape, exit codes, bad arguments."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from flightcheck.cli import main
from flightcheck.verification.z3.encoding.transitions import SPEC_PROPERTIES


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flightcheck.cli", *args],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("args, fragment", [
    (["verify", "--config", "nope"], "unknown --config"),
    (["verify", "--mutant", "nope"], "unknown --mutant"),
    (["verify", "--depth", "0"], "must be at least 1"),
    (["verify", "--depth", "x"], "not an integer"),
    (["verify", "--inferred", "--no-z3"], "cannot go with --no-z3"),
    (["verify", "--inferred", "--mutant", "shared_snapshot"], "cannot go with --mutant"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_arguments_exit_2_with_one_line(args, fragment):
    p = run(*args)
    assert p.returncode == 2
    assert fragment in p.stderr and len(p.stderr.strip().splitlines()) <= 2


def test_mutant_run_prints_its_counterexample_and_exits_0_when_killed(capsys):
    assert main(["verify", "--mutant", "shared_snapshot"]) == 0
    out = capsys.readouterr().out
    assert "S4_snapshot_immutability" in out and "schedule" in out


def test_mutant_json_carries_a_replayable_trace(capsys):
    assert main(["verify", "--mutant", "advance_at_completion", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["killed"] and data["trace_length"] == len(data["counterexample"]["actions"])
    assert data["counterexample"]["states"][0]["#type"] == "State"


def test_suite_json_has_the_documented_shape_without_z3(capsys):
    code = main(["verify", "--no-z3", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["ok"]
    assert set(data) >= {"seconds", "properties", "mutants"}
    for p in data["properties"]:
        assert set(p) >= {"name", "kind", "status", "method", "depth", "seconds"}
        assert p["kind"] in ("invariant", "sometimes", "liveness")
        assert p["status"] in ("proved", "bounded", "reached", "violated", "unknown")
    assert all(m["killed"] and m["trace_length"] for m in data["mutants"])


@pytest.mark.slow
def test_suite_proves_every_invariant_with_an_inferred_invariant(capsys):
    code = main(["verify", "--config", "single-seq", "--depth", "2", "--inferred", "--json"])
    data = json.loads(capsys.readouterr().out)
    rows = [p for p in data["properties"] if p["method"].startswith("1-induction, invariant inferred")]
    assert code == 0 and {p["name"] for p in rows} == set(SPEC_PROPERTIES)
    assert all(p["status"] == "proved" for p in rows)
