"""benchmarks/scheduler_cost.py: our reference scheduler and vLLM 0.8.5's own
`Scheduler` side by side on the same workloads (issue 19 point 4).

Only shapes and bookkeeping are checked here, never timings: the machines
are noisy. The reference side alone runs in the default suite; both sides
need the vLLM 0.8.5 venv (marker `vllm`, as tests/test_vllm_*.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from . import fixtures
from .vllm_support import require_venv

BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "scheduler_cost.py"
SIDE_KEYS = {"batches", "running", "requests_per_batch", "tokens_per_batch", "schedule_p50_us",
             "update_p50_us", "per_batch_p50_us", "per_batch_p99_us", "per_pair_p50_us"}


def load_benchmark() -> ModuleType:
    return fixtures.load_benchmark("scheduler_cost")


def run_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    assert load_benchmark().main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_reference_side_alone_reports_every_case_in_rounds(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, ["--reference-only", "--cases", "decode-16", "prefill-4",
                               "--rounds", "2", "--batches", "3"])
    assert report["vllm_version"] is None
    assert (report["rounds"], report["batches_per_round"], report["batch_queue_depth"]) == (2, 3, 2)
    assert report["prefix_caching"] is True
    assert [case["case"] for case in report["cases"]] == ["decode-16", "prefill-4"]
    decode, prefill = report["cases"]
    for case in report["cases"]:
        assert set(case["reference"]) == SIDE_KEYS
        assert case["reference"]["batches"] == 2 * 3
        assert case["vllm"] is None and case["ratio"] is None and case["pair_ratio"] is None
        assert case["reference"]["per_batch_p50_us"] > 0
    # decode-16: 16 running, each scheduled request a one-token decode.
    assert decode["reference"]["running"] == 16
    assert 0 < decode["reference"]["requests_per_batch"] == decode["reference"]["tokens_per_batch"] <= 16
    # prefill: the stream of long prompts fills every batch to the budget.
    assert prefill["reference"]["tokens_per_batch"] == 8192


def test_unknown_case_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert load_benchmark().main(["--reference-only", "--cases", "decode"]) == 2
    assert "unknown case" in capsys.readouterr().err


def test_without_the_vllm_venv_it_exits_2_and_names_the_build_command(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FLIGHTCHECK_VLLM_PYTHON_0_8_5", str(tmp_path / "no-such-venv" / "python"))
    assert load_benchmark().main(["--cases", "decode-16", "--rounds", "1", "--batches", "1"]) == 2
    assert "scripts/build-vllm-venv.sh 0.8.5" in capsys.readouterr().err


@pytest.mark.vllm
def test_both_sides_run_the_same_workload_and_the_ratio_is_theirs(
        capsys: pytest.CaptureFixture[str]) -> None:
    require_venv("0.8.5")
    report = run_json(capsys, ["--cases", "decode-16", "--rounds", "2", "--batches", "3"])
    assert report["vllm_version"] == "0.8.5"
    (case,) = report["cases"]
    ours, theirs = case["reference"], case["vllm"]
    assert set(ours) == set(theirs) == SIDE_KEYS
    assert ours["batches"] == theirs["batches"] == 2 * 3
    # The same requests through the same loop: the same batches' shape.
    for key in ("running", "requests_per_batch", "tokens_per_batch"):
        assert ours[key] == theirs[key], key
    assert theirs["per_batch_p50_us"] > 0
    assert case["ratio"] == pytest.approx(ours["per_batch_p50_us"] / theirs["per_batch_p50_us"])
    assert case["pair_ratio"] == pytest.approx(ours["per_pair_p50_us"] / theirs["per_pair_p50_us"])
