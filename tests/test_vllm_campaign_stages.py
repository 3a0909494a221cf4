"""The campaign's `--stages N`: every workload with N pipeline stages, set
after the draw, so a seed's workloads without the flag are exactly what they
were (tests and found workloads replay (seed, index)), and with it differ
only in `num_stages` and the name. Fast: no vLLM."""

from __future__ import annotations

import argparse
import hashlib
import json

import pytest

from flightcheck.cli import main
from flightcheck.vllm.campaign import add_options
from flightcheck.vllm.generate import campaign_workloads

pytestmark = pytest.mark.usefixtures("both_checkers")

# sha256 of json.dumps(campaign_workloads(3, 30, ...), sort_keys=True) as the
# generator drew before `--stages` existed (main at 508e2f6): the flag must
# not move a seed's draws.
DRAWN_BEFORE = {
    "plain": "b12ad9da51b3278ed0f673e2959a3c2b61337602f9db762774dd181ce1090da0",
    "spec2": "a214a3ae531ce9062c266fca427fc39eb9807dea377f4eb471e08e3211f5bafc",
}


def _digest(workloads: list[dict]) -> str:
    return hashlib.sha256(json.dumps(workloads, sort_keys=True).encode()).hexdigest()


def test_without_stages_a_seed_draws_what_it_drew_before():
    assert _digest(campaign_workloads(3, 30)) == DRAWN_BEFORE["plain"]
    assert _digest(campaign_workloads(3, 30, spec_tokens=2)) == DRAWN_BEFORE["spec2"]
    assert campaign_workloads(3, 30, stages=None) == campaign_workloads(3, 30)


@pytest.mark.parametrize("options", [{}, {"spec_tokens": 2, "features_of": "0.34.0", "mid_step_inputs": True},
                                     {"reuse_ids": True, "features_of": "0.8.5"}])
def test_stages_changes_only_the_stage_count_and_the_name(options):
    drawn, one_stage = campaign_workloads(7, 25, **options), campaign_workloads(7, 25, stages=1, **options)
    assert {w["config"]["num_stages"] for w in drawn} <= {2, 3, 4}
    for before, after in zip(drawn, one_stage, strict=True):
        assert after["config"]["num_stages"] == 1 and after["name"].startswith("diff-stages1-")
        assert {**after, "name": before["name"], "config": {**after["config"], "num_stages":
                before["config"]["num_stages"]}} == before


def test_the_campaign_parses_stages():
    parser = argparse.ArgumentParser()
    add_options(parser)
    assert parser.parse_args([]).stages is None
    assert parser.parse_args(["--stages", "1"]).stages == 1
    assert parser.parse_args(["--stages", "3"]).stages == 3


@pytest.mark.parametrize("value, said", [("0", "must be at least 1"), ("-2", "must be at least 1"),
                                         ("x", "not an integer"), ("1025", "must be at most 1024")])
def test_a_bad_stage_count_is_refused_in_one_line(capsys, value, said):
    with pytest.raises(SystemExit) as exited:
        main(["vllm", "campaign", "--stages", value, "--workloads", "1"])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("flightcheck: error: argument --stages:") and said in err[-1]


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.8.4", "0.8.5"])
def test_a_one_stage_workload_replays_on_0_8(version):
    """0.8.x built no one-stage engine (its V0 async output check asked the
    platform: NotImplementedError); the worker turns that processor off."""
    from flightcheck.vllm.campaign import DISAGREEMENTS, ReplayJob, replay_workload
    from flightcheck.vllm.replay import ReplayWorker

    from .vllm_support import require_venv

    require_venv(version)
    raw = campaign_workloads(1, 1, stages=1)[0]
    with ReplayWorker(version) as worker:
        replayed = replay_workload(worker, ReplayJob(version, False, 0, raw, 1))
    assert replayed.category not in DISAGREEMENTS, replayed.detail
    assert replayed.comparison is not None and replayed.comparison.explained, replayed.comparison.describe()
