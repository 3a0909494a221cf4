"""Workloads: BurstGPT CSV, the synthetic generator, ShareGPT, random, arrivals."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from flightcheck.bench.arrivals import send_times
from flightcheck.bench.burstgpt_synth import (OUTPUT_MEAN_TOKENS, PROMPT_MEAN_TOKENS,
                                              synthetic_burstgpt)
from flightcheck.bench.datasets import load_burstgpt_csv, load_sharegpt_json, random_lengths
from flightcheck.bench.workload import WorkloadError
from flightcheck.bench.workload_args import WorkloadArgs, build_workload

HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def write_csv(tmp_path, rows: str):
    path = tmp_path / "BurstGPT_without_fails_2.csv"
    path.write_text(HEADER + rows)
    return path


def test_burstgpt_loader_keeps_gpt4_rows_with_a_response(tmp_path):
    path = write_csv(tmp_path, "5,ChatGPT,472,18,490,Conversation log\n"
                               "118,GPT-4,417,276,693,Conversation log\n"
                               "120,GPT-4,300,0,300,API log\n"
                               "233,GPT-4,586,293,879,Conversation log\n")
    w = load_burstgpt_csv(path, 2, seed=0)
    assert sorted((r.prompt_len, r.output_len) for r in w.requests) == [(417, 276), (586, 293)]
    assert load_burstgpt_csv(path, 2, seed=0) == w                 # seeded


def test_burstgpt_loader_names_the_malformed_line(tmp_path):
    path = write_csv(tmp_path, "118,GPT-4,417,276,693,Conversation log\n"
                               "119,GPT-4,abc,276,693,Conversation log\n")
    with pytest.raises(WorkloadError, match=r"csv:3: column 'Request tokens' is not a number"):
        load_burstgpt_csv(path, 1, seed=0)


def test_burstgpt_loader_names_a_short_row_and_missing_columns(tmp_path):
    path = write_csv(tmp_path, "118,GPT-4,417\n")
    with pytest.raises(WorkloadError, match=r":2: expected 6 fields"):
        load_burstgpt_csv(path, 1, seed=0)
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(WorkloadError, match="missing column"):
        load_burstgpt_csv(bad, 1, seed=0)
    with pytest.raises(WorkloadError, match="not found"):
        load_burstgpt_csv(tmp_path / "nope.csv", 1, seed=0)


def test_synthetic_burstgpt_matches_its_declared_means_and_fits_the_model():
    w = synthetic_burstgpt(20000, seed=1, max_model_len=16384)
    prompts = [r.prompt_len for r in w.requests]
    outputs = [r.output_len for r in w.requests]
    assert statistics.fmean(prompts) == pytest.approx(PROMPT_MEAN_TOKENS, rel=0.04)
    assert statistics.fmean(outputs) == pytest.approx(OUTPUT_MEAN_TOKENS, rel=0.02)
    over = sum(p > 2048 for p in prompts) / len(prompts)
    assert 0.04 < over < 0.075                       # the declared ~5.6 % tail
    assert all(r.prompt_len + r.output_len <= 16384 for r in w.requests)


def test_synthetic_burstgpt_is_seeded():
    assert synthetic_burstgpt(150, 3) == synthetic_burstgpt(150, 3)
    assert synthetic_burstgpt(150, 3) != synthetic_burstgpt(150, 4)


def test_sharegpt_applies_vllms_filters(tmp_path):
    data = [
        {"conversations": [{"from": "human", "value": "x" * 400}, {"from": "gpt", "value": "y" * 800}]},
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "y" * 80}]},
        {"conversations": [{"from": "human", "value": "x" * 8000}, {"from": "gpt", "value": "y"}]},
        {"conversations": [{"from": "human", "value": "x" * 40}]},
    ]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    w = load_sharegpt_json(path, 1, seed=0)
    assert [(r.prompt_len, r.output_len) for r in w.requests] == [(100, 200)]
    with pytest.raises(WorkloadError, match="only 1 valid"):
        load_sharegpt_json(path, 2, seed=0)
    path.write_text("[{")
    with pytest.raises(WorkloadError, match=r"sg.json:1: not valid JSON"):
        load_sharegpt_json(path, 1, seed=0)


def test_random_lengths_fixed_and_ranged():
    w = random_lengths(5, 100, 10, seed=0)
    assert {(r.prompt_len, r.output_len) for r in w.requests} == {(100, 10)}
    w = random_lengths(200, 100, 10, seed=0, range_ratio=0.5)
    assert all(50 <= r.prompt_len <= 150 and 5 <= r.output_len <= 15 for r in w.requests)


def test_poisson_arrivals_have_the_rate_and_gamma_changes_burstiness():
    n = 20000
    times = send_times(n, 2.0, 1.0, seed=0)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert times[0] == 0.0
    assert statistics.fmean(gaps) == pytest.approx(0.5, rel=0.03)
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, rel=0.05)
    bursty = send_times(n, 2.0, 0.25, seed=0)
    bgaps = [b - a for a, b in zip(bursty, bursty[1:])]
    assert statistics.fmean(bgaps) == pytest.approx(0.5, rel=0.06)
    assert statistics.pstdev(bgaps) / statistics.fmean(bgaps) == pytest.approx(2.0, rel=0.1)
    assert send_times(4, math.inf) == [0.0] * 4


@pytest.mark.parametrize("rate", [0.0, -1.0])
def test_non_positive_rate_is_refused(rate):
    with pytest.raises(WorkloadError, match="--request-rate must be positive"):
        send_times(3, rate)


def test_workload_args_build_a_seeded_workload_with_send_times():
    w = build_workload(WorkloadArgs(num_prompts=20), seed=5)
    assert w.name == "burstgpt-synthetic" and len(w.requests) == 20
    assert [r.send_time for r in w.requests] == send_times(20, 2.0, 1.0, 5)
    with pytest.raises(WorkloadError, match="known: burstgpt, sharegpt, random"):
        WorkloadArgs(dataset="lmsys")
