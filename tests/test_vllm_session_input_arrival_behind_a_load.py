"""A streaming session that takes an input is ordered by that input's
arrival against vLLM 0.34's async-load queue (campaign `--versions
0.34.0,0.33.0 --all-features --reuse-ids --spec-tokens 2 --stages 2
--workloads 200 --seed 322 --async`, index 39, 0.34.0 async; `--versions
0.34.0` alone draws it with `--no-mid-step-inputs`).

Session r1's sync KV load fails under the connector's fail policy
(`Scheduler.update_from_output` finishes it with FINISHED_ERROR, batch 3
in flight); the session's next input arrives under the id r1 as a new
request (prompt 1, max_tokens 1), and batch 3's token, looked up by id, is
appended to it (`reused_id_output_dropped`). That token meets its
max_tokens: the new r1, resumable, stops and parks
(`_handle_stopped_request`: WAITING_FOR_STREAMING_REQ). The session's
following input then finds it parked and is taken at once
(`_update_request_as_session`), which sets `session.arrival_time =
update.arrival_time`: r1 now arrived after r0, an async load waiting in
`async_kv_waiting`. `_next_waiting_queue` compares the heads' arrival
times, takes r0 first, r0's allocation does not fit and the waiting loop
ends (`break`): r1 waits two more calls. The reference ordered the heads by
their first add (`first_incarnation`), took r1 first and admitted it at
once; the conforming run differed at event 14 and the campaign left the run
unexplained. The reference now orders them by `Request.arrival_order`,
which a session takes from the input it takes (reference/kv_waiting.py
`_async_goes_first`, reference/sessions.py `_take_input`).

check-trace rejects vLLM's run (IF1_in_flight_counter, batch 3's token on
the new r1), as the ground truth saw it.
"""

from __future__ import annotations

import json

import pytest

from flightcheck.vllm.campaign import check_verdict, verdict
from flightcheck.vllm.differential import compare, decisions, profile_for, read_trace, run_reference

from .vllm_support import DATA, replay_kept_async, workers

pytestmark = pytest.mark.usefixtures("both_checkers")       # judges check-trace's verdict

STEM = DATA / "all-features" / "034_async_session_input_takes_its_arrival_behind_a_load_seed322_39"
PROFILE = profile_for("0.34.0", True)


def _raw() -> dict:
    return json.loads(STEM.with_suffix(".workload.json").read_text())


def _result() -> dict:
    return json.loads(STEM.with_suffix(".result.json").read_text())


def _admissions_of_the_new_r1(events: list[dict]) -> list[int]:
    """The batches that schedule r1 from 0 after its first request finished."""
    finished = next(i for i, e in enumerate(events) if e["ev"] == "finish" and e["req"] == "r1")
    return [e["batch"] for e in events[finished:] if e["ev"] == "schedule"
            for entry in e["entries"] if entry["req"] == "r1" and entry["start"] == 0]


def test_vllm_admits_the_session_only_after_the_load_that_arrived_before_its_input():
    events = read_trace(STEM.with_suffix(".jsonl"))
    assert ("r1", "error") in [(e["req"], e["reason"]) for e in events if e["ev"] == "finish"]
    # batch 3's token went to the new r1, which the input at step 16 then found parked
    assert {"ev": "complete", "batch": 3, "tokens": {"r1": [24370]}}.items() <= next(
        e for e in events if e["ev"] == "complete" and e["batch"] == 3).items()
    r0_load = next(e["batch"] for e in events if e["ev"] == "schedule"
                   and any(load["req"] == "r0" for load in e.get("kv_loads", [])))
    assert _admissions_of_the_new_r1(events) == [r0_load] == [9]


def test_the_conforming_run_takes_the_load_first_as_vllm():
    raw, theirs = _raw(), decisions(read_trace(STEM.with_suffix(".jsonl")))
    conforming = run_reference(raw, PROFILE, vllm_outputs=True)
    assert decisions(conforming.events, block_offset=1) == theirs
    assert _admissions_of_the_new_r1(conforming.events) == [9]


def test_the_differential_explains_the_run_by_the_id_reuse_alone():
    raw, events = _raw(), read_trace(STEM.with_suffix(".jsonl"))
    comparison = compare(raw["name"], _result(), events, run_reference(raw, PROFILE),
                         run_reference(raw, PROFILE, vllm_outputs=True))
    assert comparison.explained and comparison.deviation == "reused_id_output_dropped", comparison.describe()
    assert "still differs" not in comparison.describe()


def test_check_trace_rejects_the_run_as_the_ground_truth_saw_it():
    category, detail = verdict(_result(), check_verdict(STEM.with_suffix(".jsonl")))
    assert category == "rejected, real bug", detail
    assert detail.endswith("IF1_in_flight_counter"), detail


@pytest.fixture(scope="module")
def running():
    yield from workers()


@pytest.mark.slow
@pytest.mark.vllm
def test_the_kept_workload_replays_on_vllm_to_an_explained_rejected_run(running, tmp_path):
    from flightcheck.vllm.campaign import compare_workload

    raw, trace = _raw(), tmp_path / "trace.jsonl"
    result, events = replay_kept_async(running["0.34.0"], raw, STEM.with_suffix(".jsonl"), trace)
    comparison, _ = compare_workload(raw, result, events, PROFILE)
    assert comparison.explained and comparison.deviation == "reused_id_output_dropped", comparison.describe()
    category, detail = verdict(result, check_verdict(trace))
    assert category == "rejected, real bug", detail


def test_the_kept_workload_is_the_campaigns_index_39():
    from flightcheck.vllm.campaign import with_async_scheduling
    from flightcheck.vllm.generate import campaign_workloads

    drawn = campaign_workloads(322, 40, reuse_ids=True, spec_tokens=2, features_of="0.34.0", stages=2)[39]
    assert with_async_scheduling(drawn) == _raw()
