"""The differential against vLLM 0.33.0 (issue 21 point 8): generated
workloads, some reusing an aborted request's id, run through vLLM 0.33.0's
real scheduler (its own engine loop, `BatchQueueEngineV033`) and through the
reference under the `vllm-0.33` profile on the same loop and model, compared
batch for batch. Every difference must be the named deviation
`reused_id_output_dropped` and, switched to vLLM's behaviour (the released
0.33 profile, `outputs_by_id_alone`), the only one: vLLM's hang and its
assertion then happen to the reference too.

Long runs: `python -m flightcheck.vllm.campaign --workloads N --versions 0.33.0 --reuse-ids`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from flightcheck.vllm.campaign import compare_workload
from flightcheck.vllm.differential import profile_for, read_trace, run_reference
from flightcheck.vllm.generate import campaign_workloads, generate_workload
from flightcheck.vllm.workload import workload_from_json

from .test_vllm_differential import HypothesisPicker
from .vllm_support import DATA, Workers, workers

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

VERSION = "0.33.0"
NAMED = json.loads((DATA / "workloads-0.33.json").read_text())
REUSE = ("id-reuse-wrong-binding", "id-reuse-hang", "id-reuse-assertion")


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


def replay_and_compare(running: Workers, raw: dict[str, Any], tmp: Path) -> Any:
    trace = tmp / f"{raw['name']}.jsonl"
    result = running[VERSION].replay(raw, trace=str(trace))
    return result, compare_workload(raw, result, read_trace(trace), profile_for(VERSION))[0]


def test_the_0_33_reference_profile_serves_vllm_0_33_0():
    assert profile_for(VERSION) == "vllm-0.33"


def test_generated_id_reuse_leaves_the_other_workloads_of_a_seed_unchanged():
    plain, reusing = campaign_workloads(4, 40), campaign_workloads(4, 40, reuse_ids=True)
    assert plain == campaign_workloads(4, 40)
    reused = [w for w in reusing if any("reuse_id" in r for r in w["requests"])]
    assert reused, "no generated workload reuses an id"
    for workload in reused:
        workload_from_json(workload)                        # valid
        by_id = {r["id"]: r for r in workload["requests"]}
        for r in workload["requests"]:
            if "reuse_id" in r:
                assert r["arrival_step"] >= by_id[r["reuse_id"]]["abort_step"]


@pytest.mark.vllm
@pytest.mark.parametrize("raw", NAMED, ids=[w["name"] for w in NAMED])
def test_the_named_0_33_workloads_are_identical_or_deviate_by_the_reused_id_only(
        running: Workers, raw: dict[str, Any], tmp_path: Path):
    result, comparison = replay_and_compare(running, raw, tmp_path)
    if raw["name"] in REUSE:
        assert not comparison.equal and comparison.explained, comparison.describe()
        assert comparison.deviation == "reused_id_output_dropped", comparison.describe()
        # The reference itself finishes: its guard keeps the new request's counters.
        assert run_reference(raw, "vllm-0.33").ending == "done"
    else:
        assert comparison.equal, comparison.describe()
        assert result["ending"] == "done"


@pytest.mark.vllm
def test_the_reference_equals_vllm_0_33_batch_for_batch_but_for_named_deviations(
        running: Workers, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("differential-033")
    running[VERSION]                              # start the worker outside Hypothesis' clock
    seen: dict[str, int] = {"identical": 0}

    @settings(max_examples=15, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(st.data())
    def check(data: st.DataObject) -> None:
        raw = generate_workload(HypothesisPicker(data), "hypothesis-033",
                                data.draw(st.integers(0, 10**6)), reuse_ids=True)
        note(json.dumps(raw))
        _, comparison = replay_and_compare(running, raw, tmp)
        assert comparison.explained, comparison.describe()
        assert comparison.equal or comparison.deviation == "reused_id_output_dropped", comparison.describe()
        key = "identical" if comparison.equal else str(comparison.deviation)
        seen[key] = seen.get(key, 0) + 1

    check()
    assert seen["identical"] > 0, seen


@pytest.mark.vllm
def test_a_reused_id_that_drifts_a_counter_without_a_token_hangs_vllm_and_is_named(
        running: Workers, tmp_path: Path):
    """Campaign seed 1, workload 31: old r2's partial prefill chunk is in
    flight when a new request takes the id r2; its completion applies no
    token but takes 3 off the new r2's num_in_flight_tokens, so when the new
    r2 is preempted its stale count is -3: truthy, never drained. vLLM skips
    r2 forever (stuck), the reference resumes it; the conforming run (bound
    by id) sticks exactly as vLLM does."""
    raw = campaign_workloads(1, 32, reuse_ids=True)[31]
    result, comparison = replay_and_compare(running, raw, tmp_path)
    assert result["ending"] == "stuck" and not result["ground_truth"]["stale_tokens"]
    assert comparison.explained and comparison.deviation == "reused_id_output_dropped", comparison.describe()
    assert run_reference(raw, "vllm-0.33").ending == "done"
    assert run_reference(raw, "vllm-0.33", vllm_outputs=True).ending == "stuck"
