"""flightcheck at a deployment's scale, on vLLM's real scheduler.

The campaign's generator (flightcheck/vllm/generate.py) draws tiny engines:
budgets of 4-32 tokens, blocks of 2-8, a handful of requests. A deployment
records block size 16, budgets of 512-8192 tokens, dozens of seats,
prompts of hundreds of tokens behind shared prefixes, a queue of requests
arriving over time, and a pool small enough to preempt. These workloads are
drawn at that scale and go through the campaign's own path
(`campaign.replay_workload`: vLLM's replay, the differential against the
reference, check-trace's verdict against vLLM's ground truth), per release
and mode; check-trace's verdict must equal the ground truth and the
differential must leave nothing unexplained.

(vLLM 0.8.x draws two or more stages: its replay cannot build a one-stage
engine, see `realistic_workload`.)
"""

from __future__ import annotations

import random
from typing import Any, Iterator

import pytest

from .vllm_support import Workers, workers

pytestmark = pytest.mark.usefixtures("both_checkers")   # check-trace verdicts on vLLM's traces

BLOCK_SIZE = 16


def _requests(rng: random.Random, count: int, prefixes: dict[str, int]) -> list[dict[str, Any]]:
    """Requests arriving over time, most behind a shared prefix, some aborted, some ending by EOS."""
    requests, step = [], 0
    for index in range(count):
        step += rng.choice([0, 0, 1, 2, 3, 5])
        prompt_len = rng.randint(50, 600)
        request: dict[str, Any] = {"id": f"r{index}", "prompt_len": prompt_len,
                                   "max_tokens": rng.randint(10, 60), "arrival_step": step}
        prefix = rng.choice([None, "system", "system", "fewshot"])
        if prefix and prefixes[prefix] < prompt_len:
            request["prefix"] = prefix
        if rng.random() < 0.1:
            request["abort_step"] = step + rng.randint(0, 40)
        if rng.random() < 0.3:
            request["eos_probability"] = rng.choice([0.01, 0.03])
        requests.append(request)
    return requests


def realistic_workload(seed: int, version: str, async_scheduling: bool) -> dict[str, Any]:
    """One workload at a deployment's scale. vLLM 0.8.x gets 2-4 stages: its
    `VllmConfig` asks the platform about async output processing when there
    is one stage, which the replay's CPU platform cannot answer."""
    rng = random.Random(seed)
    recent = not version.startswith("0.8")
    chunked = not recent or rng.random() < 0.8
    prefixes = {"system": rng.choice([64, 128, 256]), "fewshot": rng.choice([300, 500])}
    requests = _requests(rng, rng.randint(40, 70), prefixes)
    max_model_len = 1024
    one_request = -(-max_model_len // BLOCK_SIZE)
    config: dict[str, Any] = {
        "num_stages": rng.choice([1, 2, 3, 4] if recent else [2, 3, 4]),
        "max_num_batched_tokens": max_model_len if not chunked else rng.choice([512, 1024, 2048, 4096]),
        "max_num_seqs": rng.choice([16, 32, 64, 128]), "block_size": BLOCK_SIZE,
        # one request's worth and a little (preemptions), or several
        "num_blocks": rng.choice([one_request + rng.randint(0, 20), one_request * 4]) + 1,
        "max_model_len": max_model_len, "long_prefill_token_threshold": rng.choice([0, 0, 256]),
        "prefix_caching": rng.random() < 0.7}
    if recent:
        config["enable_chunked_prefill"] = chunked
        if rng.random() < 0.4:
            config["policy"] = "priority"
            for request in requests:
                request["priority"] = rng.randint(0, 2)
        config["async_scheduling"] = async_scheduling
    workload: dict[str, Any] = {"name": f"realistic-{version}-{seed}", "seed": seed, "config": config,
                                "prefixes": prefixes, "requests": requests, "max_steps": 20000}
    spec_tokens = rng.choice([0, 0, 1, 2, 4])
    if spec_tokens:
        config["num_spec_tokens"] = spec_tokens
        workload["draft_acceptance"] = rng.choice([0.5, 0.8])
    return workload


def test_the_workloads_are_at_a_deployments_scale() -> None:
    for seed in range(20):
        for version in ("0.34.0", "0.8.4"):
            workload = realistic_workload(seed, version, async_scheduling=False)
            config = workload["config"]
            assert config["block_size"] == 16 and config["max_num_batched_tokens"] >= 512
            assert config["max_num_seqs"] >= 16 and 40 <= len(workload["requests"]) <= 70
            assert config["num_blocks"] - 1 >= -(-config["max_model_len"] // 16)   # the reference's bound
            assert version != "0.8.4" or config["num_stages"] >= 2


# (release, async scheduling, seed): seeds drawn to cover one stage, drafts,
# priorities, chunked prefill off and tight pools between them. Seed 12 on
# 0.8.4 draws the open false rejection of held drafts
# (tests/test_check_trace_held_drafts_084.py keeps its minimal case).
CASES = [("0.34.0", False, 1), ("0.34.0", False, 2), ("0.34.0", True, 3), ("0.34.0", True, 4),
         ("0.33.0", False, 5), ("0.33.0", False, 6), ("0.33.0", True, 7), ("0.33.0", True, 8),
         ("0.8.5", False, 9), ("0.8.5", False, 10), ("0.8.4", False, 11), ("0.8.4", False, 33)]


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version,async_scheduling,seed", CASES)
def test_check_trace_agrees_with_vllms_ground_truth_at_scale(running: Workers, version: str,
                                                              async_scheduling: bool, seed: int) -> None:
    from flightcheck.vllm.campaign import DISAGREEMENTS, ReplayJob, replay_workload

    workload = realistic_workload(seed, version, async_scheduling)
    replayed = replay_workload(running[version], ReplayJob(version, async_scheduling, seed, workload, seed))
    assert replayed.result["ending"] == "done", replayed.result["ending"]
    assert replayed.category not in DISAGREEMENTS, replayed.detail
    comparison = replayed.comparison
    assert comparison is not None and (comparison.equal or comparison.explained), comparison.describe()
