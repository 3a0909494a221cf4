"""A streaming session's input sent after its session finished with an error
takes the finished session's output, as vLLM binds it (campaign
`--versions 0.34.0,0.33.0 --all-features --async --spec-tokens 1 --workloads
80 --seed 59`, index 74, both releases; `--spec-tokens 2` the same).

Session r0 (structured, a sync KV load that fails under the connector's fail
policy) has batch 2 (one token and a draft) in flight when batch 1's output
reports its failed load: `Scheduler.update_from_output` finishes it with
FINISHED_ERROR (`finish_requests(error_req_ids, FINISHED_ERROR)`, after the
outputs). The session's end then arrives under the id r0 as a new structured
request (the session is gone), and batch 2's output, an EOS, is looked up by
id (`self.requests.get(req_id)`) and appended to it: the id-reuse binding the
reference drops (`reused_id_output_dropped`). vLLM then asks the new r0's
grammar (`StructuredOutputManager.accept_tokens`, after the stop checks); the
bridge's grammar accepts what the fabricated model may sample for the
request's workload entry (flightcheck/vllm/grammar_replay.py), and the
session's late input is of the session's entry, so it accepts the EOS and r0
finishes by `stop`. The reference's conforming run (vLLM as released)
refused every older request's token and said `error`: the differential named
the binding but left the run unexplained. The reference now asks the
replay's FSMs (reference/grammar.py `grammar_accepts`,
flightcheck/vllm/reference_run.py `reference_fsms`); an older request of
another entry (`--reuse-ids`) is still refused
(tests/test_vllm_all_features_fixes.py, `033_reused_id_output_refused_by_grammar`).

check-trace rejects vLLM's run at that completion (S7_output_binding), as the
ground truth saw the stale token and the negative counter.
"""

from __future__ import annotations

import json

import pytest

from flightcheck.vllm.campaign import check_verdict, verdict
from flightcheck.vllm.differential import compare, decisions, profile_for, read_trace, run_reference

from .vllm_support import DATA, replay_kept_async, workers

pytestmark = pytest.mark.usefixtures("both_checkers")       # judges check-trace's verdict

STEM = DATA / "all-features" / "034_async_session_input_after_kv_error_takes_the_old_stop_seed59_74"
RELEASES = ["0.34.0", "0.33.0"]           # the same trace on both (but its config's vllm_version)


def _raw() -> dict:
    return json.loads(STEM.with_suffix(".workload.json").read_text())


def _result(version: str) -> dict:
    return {**json.loads(STEM.with_suffix(".result.json").read_text()), "vllm_version": version}


def test_vllm_gave_the_old_batchs_eos_to_the_sessions_late_input():
    events = read_trace(STEM.with_suffix(".jsonl"))
    finishes = [(e["req"], e["reason"]) for e in events if e["ev"] == "finish"]
    assert finishes[:3] == [("r2", "abort"), ("r4", "abort"), ("r0", "error")]
    assert ("r0", "stop") in finishes                              # the new r0, by batch 2's EOS
    grammars = _result("0.34.0")["grammars"]
    assert grammars["compiled"] == ["r0", "r4", "r0"] and grammars["refused"] == {}


@pytest.mark.parametrize("version", RELEASES)
def test_the_conforming_run_finishes_the_late_input_by_its_stop(version: str):
    raw, theirs = _raw(), decisions(read_trace(STEM.with_suffix(".jsonl")))
    conforming = run_reference(raw, profile_for(version, True), vllm_outputs=True)
    assert decisions(conforming.events, block_offset=1) == theirs
    # the reference itself drops batch 2's output: the new r0 never sees it
    ours = decisions(run_reference(raw, profile_for(version, True)).events, block_offset=1)
    assert ("finish", "r0", "stop", False) not in ours


@pytest.mark.parametrize("version", RELEASES)
def test_the_differential_explains_the_run_by_the_id_reuse_alone(version: str):
    raw, events = _raw(), read_trace(STEM.with_suffix(".jsonl"))
    profile = profile_for(version, True)
    comparison = compare(raw["name"], _result(version), events, run_reference(raw, profile),
                         run_reference(raw, profile, vllm_outputs=True))
    assert comparison.explained and comparison.deviation == "reused_id_output_dropped", comparison.describe()
    assert "still differs" not in comparison.describe()


def test_check_trace_rejects_the_binding_as_the_ground_truth_saw_it():
    category, detail = verdict(_result("0.34.0"), check_verdict(STEM.with_suffix(".jsonl")))
    assert category == "rejected, real bug", detail
    assert detail.endswith("S7_output_binding"), detail


@pytest.fixture(scope="module")
def running():
    yield from workers()


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("version", RELEASES)
def test_the_kept_workload_replays_on_vllm_to_an_explained_rejected_run(running, tmp_path, version: str):
    from flightcheck.vllm.campaign import compare_workload

    raw, trace = _raw(), tmp_path / "trace.jsonl"
    result, events = replay_kept_async(running[version], raw, STEM.with_suffix(".jsonl"), trace)
    comparison, _ = compare_workload(raw, result, events, profile_for(version, True))
    assert comparison.explained and comparison.deviation == "reused_id_output_dropped", comparison.describe()
    category, detail = verdict(result, check_verdict(trace))
    assert category == "rejected, real bug", detail
