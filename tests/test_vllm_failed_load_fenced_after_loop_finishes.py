"""A request the fail policy finishes while a later batch of its own is in
flight is put behind the step fence at the END of the update that reports
the failure, after the requests that update's output loop finished
(campaign `--versions 0.34.0,0.33.0 --all-features --spec-tokens 2
--workloads 120 --seed 2 --async`, index 76, both releases; 0.34.0 kept in
tests/data/vllm/hunt300/).

r0's sync load (3 blocks, shared by r2's prefix hit) fails from its block 2
(block 3) in batch 1's output. vLLM 0.34 `update_from_output` opens with
`processed_step_seq += 1` and `_drain_deferred_frees`, runs its loop over
the outputs (r4 samples its EOS and stops: its batch 3 is still in flight,
so `_free_request_blocks` puts [5, 6] aside), and only then
`finish_requests(failed_kv_load_req_ids, FINISHED_ERROR)`: r0's last batch
is done (freed at once: block 4 to the head), r2 has batch 2 in flight
(`last_sched_seq > processed_step_seq`): [1, 2, 3, 7] put aside AFTER r4's.
When batch 3 completes, `_drain_deferred_frees` frees r4 (6 to the head),
then r2 (7 and the un-hashed 3 to the head, `BlockPool.free_blocks`), so
batch 5 gives r3 block 7. The spec fenced r2 when it took the failure
(`_fail_past_carrier`, before the output), ahead of r4, so it gave block 6
and check-trace rejected the correct run (`S9_kv_ownership` at line 22).
The spec now keeps r2's table in `error_frees` and fences it there
(spec/kv_fence.py `drain_error_frees`).
"""

from __future__ import annotations

import pytest

from flightcheck.spec import kv_reports
from flightcheck.verification.traces.check import check_events
from flightcheck.vllm.campaign import check_verdict, verdict
from flightcheck.vllm.differential import compare, profile_for, read_trace, run_reference

from .vllm_support import DATA, KeptCase, replay_kept_case, workers

pytestmark = pytest.mark.usefixtures("both_checkers")       # judges check-trace's verdict

CASE = KeptCase(DATA / "hunt300" / "034_async_failed_load_fenced_after_loop_finishes_seed2_76")
STEM = CASE.stem
_raw, _result = CASE.raw, CASE.result
PROFILE = profile_for("0.34.0", True)


def test_vllm_reuses_r2s_tail_block_before_r4s_after_the_fence() -> None:
    events = read_trace(STEM.with_suffix(".jsonl"))
    failed = [e for e in events if e["ev"] == "kv_failed"]
    assert [(e["req"], e["from_block"]) for e in failed] == [("r0", 2)]
    errors = [e["req"] for e in events if e["ev"] == "finish" and e["reason"] == "error"]
    assert errors == ["r0", "r2"]
    first = {e["batch"]: e for e in events if e["ev"] == "schedule" and e.get("batch")}
    assert [x["block_ids"] for x in first[1]["entries"]] == [[1, 2, 3, 4], [5, 6]]
    assert first[2]["entries"][0]["block_ids"] == [1, 2, 3, 7]
    load = next(e for e in events if e["ev"] == "schedule" and e.get("kv_loads"))
    assert load["kv_loads"] == [{"req": "r3", "start": 22, "block_ids": [4, 8, 9]}]
    assert first[5]["entries"][0]["block_ids"] == [7]          # r2's tail, not r4's 6


def test_check_trace_accepts_the_run_as_the_ground_truth_saw_it() -> None:
    checked = check_events(read_trace(STEM.with_suffix(".jsonl")))
    assert checked.ok, (checked.property, checked.message)
    category, detail = verdict(_result(), check_verdict(STEM.with_suffix(".jsonl")))
    assert category == "accepted, correct run", detail


def test_fencing_the_failed_request_when_the_failure_is_taken_rejects_the_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule this run tells apart: r2 fenced at its failure (the spec
    before), ahead of r4's fenced stop, and block 6 comes back first."""
    defer = kv_reports.defer_to_output_end

    def fencing_at_the_failure(state, r, carrier, fenced=False):    # type: ignore[no-untyped-def]
        return state if fenced else defer(state, r, carrier)

    monkeypatch.setattr(kv_reports, "defer_to_output_end", fencing_at_the_failure)
    checked = check_events(read_trace(STEM.with_suffix(".jsonl")))
    assert not checked.ok and checked.property == "S9_kv_ownership", (checked.property, checked.message)
    assert checked.line == 22 and "r3 gets block 7" in checked.message, checked.message


def test_the_differential_names_the_references_known_deviation() -> None:
    """The reference finishes a failed load's requests at once (a named
    deviation, `kv_error_finished_at_once`), not what this fix is about."""
    raw, events = _raw(), read_trace(STEM.with_suffix(".jsonl"))
    comparison = compare(raw["name"], _result(), events, run_reference(raw, PROFILE),
                         run_reference(raw, PROFILE, vllm_outputs=True))
    assert comparison.explained and comparison.deviation == "kv_error_finished_at_once", comparison.describe()


def test_the_kept_workload_is_the_campaigns_index_76() -> None:
    from flightcheck.vllm.campaign import with_async_scheduling
    from flightcheck.vllm.generate import campaign_workloads

    drawn = campaign_workloads(2, 77, spec_tokens=2, features_of="0.34.0")[76]
    assert with_async_scheduling(drawn) == _raw()


@pytest.fixture(scope="module")
def running():
    yield from workers()


@pytest.mark.slow
@pytest.mark.vllm
def test_the_kept_workload_replays_on_vllm_to_an_accepted_correct_run(running, tmp_path) -> None:
    comparison, (category, detail) = replay_kept_case(running["0.34.0"], CASE, PROFILE, tmp_path / "trace.jsonl")
    assert comparison.explained, comparison.describe()
    assert category == "accepted, correct run", detail
