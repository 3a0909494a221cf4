"""The disagreements between flightcheck and vLLM's real scheduler with a KV
connector that `flightcheck vllm campaign --all-features` found, each read in
vLLM's source and settled (docs/kv-connector.md, "Disagreements read"):

* the fail policy's error finish under the step fence (0.33.0 sync, seed 6
  index 75, seed 3 index 28): vLLM frees the failed request's blocks at once
  (its processed_step_seq already counts the failing batch), the reference
  waits for the fence, and completes where vLLM schedules; the differential
  named it `engine_blocked_in_flight`, a 0.8.x deviation, unexplained on
  0.33: now `kv_error_finished_at_once`, the conforming run equal to vLLM;
* a landed load promoted by a schedule() call that forms nothing (0.33.0
  async, seed 3 index 14 and 150, seed 2 index 114): a false S9_kv_ownership;
* a parked load cut by a sharer's failure, then failing whole itself (0.34.0
  sync, seed 1 index 173, cache-aware admission on, and the same without it):
  a false KV3;
* #49250's placeholders on a request sharing the failed blocks, aborted
  before its next entry (0.33.0 async, seed 1 index 64): the bug missed,
  until the recorder wrote such requests' counters (`kv_failed.holders`).

The first group's vLLM traces are kept (tests/data/kv/vllm/open_cases), so
the differential is checked without vLLM; every workload is replayed on
vLLM too (`vllm`, `slow`). The check-trace verdicts of the others' traces
are tests/test_trace_kv_vllm.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flightcheck.vllm.differential import compare, profile_for, read_trace, run_reference

from .vllm_support import require_venv

pytestmark = pytest.mark.usefixtures("both_checkers")   # the campaign checks traces

DATA = Path(__file__).parent / "data" / "kv" / "vllm" / "open_cases"
FENCED_ERROR_FREES = ["033_fail_policy_fenced_free_seed6_75", "033_fail_policy_fenced_free_seed3_28"]
# stem -> the vLLM version whose run it is
REPLAYED = {stem: "0.33.0" for stem in FENCED_ERROR_FREES} | {
    "033_async_failed_load_seed3_150": "0.33.0",
    "033_async_failed_load_seed3_14": "0.33.0",
    "033_async_failed_load_seed2_114": "0.33.0",
    "034_cache_aware_parked_load_cut_seed1_173": "0.34.0",
    "034_parked_load_cut_seed1_173_no_cache_aware": "0.34.0",
    "033_async_sharer_placeholders_seed1_64": "0.33.0",
}
# vLLM wrong (#49250 on a request sharing the failed blocks): rejected, as its ground truth says
REJECTED = {"033_async_sharer_placeholders_seed1_64"}


def _saved(stem: str) -> dict:
    return json.loads((DATA / f"{stem}.workload.json").read_text())


def test_every_saved_case_is_replayed():
    assert {p.name.removesuffix(".workload.json") for p in DATA.glob("*.workload.json")} == set(REPLAYED)


@pytest.mark.parametrize("stem", FENCED_ERROR_FREES)
def test_fail_policy_free_under_the_fence_is_the_named_error_finish(stem):
    saved = _saved(stem)
    raw, result = saved["workload"], saved["vllm_result"]
    events = read_trace(DATA / f"{stem}.jsonl")
    profile = profile_for(result["vllm_version"], False)
    comparison = compare(raw["name"], result, events, run_reference(raw, profile),
                         run_reference(raw, profile, vllm_outputs=True))
    assert not comparison.equal
    # the reference completes a batch where vLLM schedules into the failed request's freed blocks
    assert "reference ('complete', (), ())" in comparison.first_difference
    assert (comparison.deviation, comparison.explained) == ("kv_error_finished_at_once", True), \
        comparison.describe()


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_each_case_replayed_on_vllm_is_accepted_and_explained(version):
    require_venv(version)
    from flightcheck.vllm.campaign import ReplayJob, replay_workload
    from flightcheck.vllm.replay import ReplayWorker

    stems = [stem for stem, of in REPLAYED.items() if of == version]
    with ReplayWorker(version) as worker:
        for index, stem in enumerate(stems):
            raw = _saved(stem)["workload"]
            job = ReplayJob(version, bool(raw["config"].get("async_scheduling")), index, raw, 0)
            replayed = replay_workload(worker, job)
            expected = "rejected, real bug" if stem in REJECTED else "accepted, correct run"
            assert replayed.category == expected, (stem, replayed.detail)
            assert replayed.comparison is not None and replayed.comparison.explained, \
                (stem, replayed.comparison.describe())
