"""`flightcheck simulate` and `flightcheck plot`: output, JSON keys, pictures,
and bad input refused with exit 2 and a message naming the problem."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from flightcheck.cli import main

SMALL = ["simulate", "--num-prompts", "12", "--request-rate", "4"]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flightcheck.cli", *args],
                          capture_output=True, text=True, timeout=300)


def test_simulate_prints_the_report_block(capsys):
    assert main(SMALL) == 0
    out = capsys.readouterr().out
    assert "============ Serving Benchmark Result ============" in out
    assert "Successful requests:                     12" in out
    assert "P99 TTFT (ms):" in out and "Mean TPOT (ms):" in out


def test_simulate_json_has_vllm_keys(capsys):
    assert main([*SMALL, "--json", "--policy", "one-batch-per-request"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["completed"] == 12 and doc["policy"] == "one-batch-per-request"
    for key in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms",
                "request_throughput", "output_throughput", "total_token_throughput",
                "duration", "total_input_tokens", "total_output_tokens", "ttfts", "itls"):
        assert key in doc


def test_simulate_names_the_profile_it_ran(capsys):
    assert main([*SMALL, "--pp", "2", "--profile", "vllm-0.33-async", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["profile"] == "vllm-0.33-async" and doc["completed"] == 12
    assert main([*SMALL, "--pp", "2", "--profile", "vllm-0.33-async"]) == 0
    assert "profile vllm-0.33-async, at most 3 batches in flight" in capsys.readouterr().err
    assert main([*SMALL, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["profile"] == "vllm-0.8.5"


def test_simulate_seeds_reports_median_and_spread(capsys):
    assert main([*SMALL, "--seeds", "3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["seeds"] == [0, 1, 2] and len(doc["per_seed"]) == 3
    values = sorted(s["mean_ttft_ms"] for s in doc["per_seed"])
    assert doc["mean_ttft_ms"] == values[1]
    assert doc["spread"]["mean_ttft_ms"]["min"] == values[0]
    assert main([*SMALL, "--seeds", "3"]) == 0
    assert "Median of 3 seeds" in capsys.readouterr().out


def test_plot_draws_a_timeline_and_perfetto_from_a_simulated_trace(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    trace = tmp_path / "run.jsonl"
    assert main(["simulate", "--dataset", "random", "--random-input-len", "5000",
                 "--random-output-len", "4", "--num-prompts", "2", "--request-rate", "inf",
                 "--trace", str(trace)]) == 0
    assert main(["plot", str(trace)]) == 0
    png, perfetto = tmp_path / "run.timeline.png", tmp_path / "run.perfetto.json"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = json.loads(perfetto.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert {e["tid"] for e in slices} == {0, 1} and all(e["dur"] > 0 for e in slices)


def test_plot_draws_cdfs_of_two_results(tmp_path):
    pytest.importorskip("matplotlib")
    files = []
    for policy in ("continue-prefill", "one-batch-per-request"):
        f = tmp_path / f"{policy}.json"
        assert main([*SMALL, "--policy", policy, "--save-result", str(f)]) == 0
        files.append(str(f))
    out = tmp_path / "cdf.png"
    assert main(["plot", *files, "--out", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("args, fragment", [
    (["simulate", "--gpu", "V100"], "unknown --gpu 'V100'; known: L4, A100, H100, H200"),
    (["simulate", "--model", "gpt-5"], "unknown --model 'gpt-5'; known: llama-3.1-8b"),
    (["simulate", "--request-rate", "0"], "must be positive"),
    (["simulate", "--request-rate", "-2"], "must be positive"),
    (["simulate", "--dataset", "burstgpt", "--dataset-path", "/nonexistent.csv"],
     "dataset file not found: /nonexistent.csv"),
    (["simulate", "--dataset", "sharegpt"], "needs --dataset-path"),
    (["simulate", "--policy", "greedy"], "invalid choice"),
    (["simulate", "--profile", "vllm-9"], "invalid choice"),
    (["plot", "/nonexistent.jsonl"], "file not found"),
])
def test_bad_input_exits_2_with_a_clear_message(args, fragment):
    p = cli(*args)
    assert p.returncode == 2, p.stderr
    assert fragment in p.stderr and len(p.stderr.strip().splitlines()) <= 2


def test_malformed_csv_row_is_named_by_line(tmp_path):
    path = tmp_path / "b.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "1,GPT-4,10,5,15,API log\n2,GPT-4,10,x,15,API log\n")
    p = cli("simulate", "--dataset-path", str(path), "--num-prompts", "1")
    assert p.returncode == 2
    assert f"{path}:3: column 'Response tokens' is not a number" in p.stderr


def test_plot_refuses_a_trace_without_stage_events(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"ev":"config","num_stages":2}\n{"ev":"end"}\n')
    p = cli("plot", str(path))
    assert p.returncode == 2 and "no stage events" in p.stderr
