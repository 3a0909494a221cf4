"""`flightcheck bench` on the PyTorch runtime (CPU): same report, JSON and
trace as the simulator. Skipped without torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

pytest.importorskip("torch")

SMALL = ["bench", "--dataset", "random", "--random-input-len", "300", "--random-output-len", "4",
         "--num-prompts", "3", "--request-rate", "inf", "--max-num-batched-tokens", "128",
         "--max-model-len", "512", "--num-blocks", "64"]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flightcheck.cli", *args], capture_output=True,
                          text=True, timeout=600)


def test_bench_runs_the_runtime_in_process_with_vllm_metrics(tmp_path):
    trace = tmp_path / "b.jsonl"
    p = cli(*SMALL, "--pp", "1", "--json", "--trace", str(trace))
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["completed"] == 3 and doc["total_output_tokens"] == 12 and not doc["simulator"]
    stages = [json.loads(x) for x in trace.read_text().splitlines() if '"ev":"stage"' in x]
    assert stages and all(s["t1"] >= s["t0"] >= 0 for s in stages)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["continue-prefill", "one-batch-per-request"])
def test_bench_drives_two_stage_processes_and_the_trace_is_legal(tmp_path, policy):
    from flightcheck.verification.traces.check import check_trace

    trace = tmp_path / "b.jsonl"
    p = cli(*SMALL, "--pp", "2", "--policy", policy, "--trace", str(trace))
    assert p.returncode == 0, p.stderr
    assert "Successful requests:                     3" in p.stdout
    assert check_trace(str(trace)).ok
    assert {json.loads(x)["stage"] for x in trace.read_text().splitlines()
            if '"ev":"stage"' in x} == {0, 1}


def test_bench_runs_async_scheduling_and_names_the_profile(tmp_path):
    trace = tmp_path / "b.jsonl"
    p = cli(*SMALL, "--pp", "1", "--profile", "vllm-0.33-async", "--json", "--trace", str(trace))
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["profile"] == "vllm-0.33-async"
    assert doc["completed"] == 3 and doc["total_output_tokens"] == 12
    config = json.loads(trace.read_text().splitlines()[0])
    assert config["async_scheduling"] is True and config["batch_queue_depth"] == 2
    assert config["notes_empty_batches"] is True
    from flightcheck.verification.traces.check import check_trace

    result = check_trace(str(trace), "vllm-0.33-async")
    assert result.ok, (result.property, result.message)
