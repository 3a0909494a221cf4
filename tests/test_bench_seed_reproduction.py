"""The issue's acceptance check: the simulator's two policies against the seed
PR's V1-main vs this-PR tables, as medians over workload seeds 0-19 (declared
in advance), with the cost model calibrated on the one-batch run only.
Slow (~30-40 s on one core): `pytest -m slow tests/test_bench_seed_reproduction.py`."""

from __future__ import annotations

from dataclasses import replace

import pytest

from flightcheck.bench.multiseed import aggregate, gain_points
from flightcheck.bench.seed_results import THIS_PR, V1_MAIN
from flightcheck.bench.simulation import SimConfig, simulate
from flightcheck.bench.workload_args import WorkloadArgs, build_workload

SEEDS = range(20)
LOWER_IS_BETTER = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                   "median_tpot_ms", "mean_itl_ms", "median_itl_ms")


@pytest.fixture(scope="module")
def medians() -> dict[str, dict[str, float]]:
    out = {}
    for policy in ("one-batch-per-request", "continue-prefill"):
        runs = [simulate(build_workload(WorkloadArgs(), s), replace(SimConfig(), policy=policy))
                for s in SEEDS]
        out[policy] = aggregate([r.metrics.summary() for r in runs])[0]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("key", LOWER_IS_BETTER)
def test_every_latency_moves_in_the_seeds_direction(medians, key):
    assert V1_MAIN[key] > THIS_PR[key]
    assert medians["one-batch-per-request"][key] > medians["continue-prefill"][key]


@pytest.mark.slow
def test_mean_ttft_gain_is_14_plus_minus_5_points(medians):
    gain = gain_points(medians["one-batch-per-request"]["mean_ttft_ms"],
                       medians["continue-prefill"]["mean_ttft_ms"])
    assert 9.0 <= gain <= 19.0


@pytest.mark.slow
def test_p99_ttft_gain_is_28_plus_minus_10_points(medians):
    gain = gain_points(medians["one-batch-per-request"]["p99_ttft_ms"],
                       medians["continue-prefill"]["p99_ttft_ms"])
    assert 18.0 <= gain <= 38.0


@pytest.mark.slow
@pytest.mark.parametrize("policy, seed", [("one-batch-per-request", V1_MAIN),
                                          ("continue-prefill", THIS_PR)])
def test_tpot_is_within_25_percent_of_the_seeds(medians, policy, seed):
    for key in ("mean_tpot_ms", "median_tpot_ms"):
        assert medians[policy][key] == pytest.approx(seed[key], rel=0.25)
