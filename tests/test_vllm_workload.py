"""The parts of flightcheck.vllm that run without vLLM: workloads, the
fabricated model's sampling rule, and `flightcheck vllm replay`'s refusals."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from flightcheck.cli import main
from flightcheck.vllm.engine import FabricatedModel
from flightcheck.vllm.workload import WorkloadError, workload_from_json

BASE = {"config": {"num_stages": 2, "max_num_batched_tokens": 16, "block_size": 4, "num_blocks": 20}}


def test_requests_naming_a_prefix_share_its_tokens_and_differ_after_it():
    workload = workload_from_json({**BASE, "seed": 3, "prefixes": {"sys": 8}, "requests": [
        {"id": "a", "prompt_len": 12, "prefix": "sys"}, {"id": "b", "prompt_len": 10, "prefix": "sys"},
        {"id": "c", "prompt_len": 12}]})
    a, b, c = (r.prompt_token_ids for r in workload.requests)
    assert a[:8] == b[:8] and a[8:10] != b[8:10] and a[:8] != c[:8]
    assert (len(a), len(b), len(c)) == (12, 10, 12)
    assert workload_from_json({**BASE, "seed": 3, "prefixes": {"sys": 8}, "requests": [
        {"id": "a", "prompt_len": 12, "prefix": "sys"}]}).requests[0].prompt_token_ids == a


@pytest.mark.parametrize("bad, why", [
    ({"requests": []}, "non-empty"),
    ({"requests": [{"id": "a", "prompt_len": 4, "prefix": "nope"}]}, "prefix 'nope'"),
    ({"requests": [{"id": "a", "prompt_len": 4}, {"id": "a", "prompt_len": 5}]}, "twice"),
    ({"config": {"num_stages": 0, "max_num_batched_tokens": 8, "num_blocks": 9},
      "requests": [{"prompt_len": 4}]}, "num_stages"),
    ({"config": {"num_stages": 2, "max_num_batched_tokens": 8, "num_blocks": 9, "pool": 3},
      "requests": [{"prompt_len": 4}]}, "unknown keys"),
    ({"requests": [{"prompt_token_ids": [1, "x"]}]}, "token ids"),
    ({"requests": [{"id": "a", "prompt_len": 4}, {"id": "b", "reuse_id": "z", "prompt_len": 4}]},
     "not an earlier request's id"),
    ({"requests": [{"id": "a", "prompt_len": 4, "arrival_step": 5},
                   {"id": "b", "reuse_id": "a", "prompt_len": 4, "arrival_step": 2}]}, "before that request arrives"),
    ({"requests": [{"id": "a", "prompt_len": 4, "abort_step": 1, "abort_via": "later"}]}, "abort_via"),
    ({"config": {**BASE["config"], "async_scheduling": 1}, "requests": [{"prompt_len": 4}]}, "async_scheduling"),
])
def test_malformed_workloads_are_refused_with_the_reason(bad: dict, why: str):
    with pytest.raises(WorkloadError, match=why):
        workload_from_json({**BASE, **bad})


def _new(req_id: str, prompt_len: int, start: int) -> SimpleNamespace:
    return SimpleNamespace(req_id=req_id, prompt_token_ids=list(range(prompt_len)), num_computed_tokens=start)


def _cached(req_id: str, start: int, new_token_ids: list[int]) -> SimpleNamespace:
    return SimpleNamespace(req_id=req_id, num_computed_tokens=start, new_token_ids=new_token_ids)


def _batch(new: list, cached: list, scheduled: dict[str, int], finished: tuple = ()) -> SimpleNamespace:
    return SimpleNamespace(scheduled_new_reqs=new, scheduled_cached_reqs=cached,
                           num_scheduled_tokens=scheduled, finished_req_ids=set(finished))


def test_the_fabricated_model_samples_only_when_a_batch_reaches_the_known_tokens():
    workload = workload_from_json({**BASE, "requests": [{"id": "r", "prompt_len": 12}]})
    model = FabricatedModel(workload, SimpleNamespace)
    first = model.execute(_batch([_new("r", 12, 0)], [], {"r": 10}))
    assert first.sampled_token_ids == [[]]                 # a partial prefill chunk
    final = model.execute(_batch([], [_cached("r", 10, [10, 11])], {"r": 2}))
    assert len(final.sampled_token_ids[0]) == 1            # the last chunk samples
    decode = model.execute(_batch([], [_cached("r", 12, [final.sampled_token_ids[0][0]])], {"r": 1}))
    assert len(decode.sampled_token_ids[0]) == 1
    # A resumed request recomputes from 0: its first chunk knows all 13 tokens, samples nothing.
    resumed = model.execute(_batch([], [_cached("r", 0, list(range(8)))], {"r": 8}))
    assert resumed.sampled_token_ids == [[]]


def test_the_fabricated_model_samples_the_same_token_again_after_recomputation():
    workload = workload_from_json({**BASE, "requests": [{"id": "r", "prompt_len": 4}]})
    once = FabricatedModel(workload, SimpleNamespace).execute(_batch([_new("r", 4, 0)], [], {"r": 4}))
    again = FabricatedModel(workload, SimpleNamespace).execute(_batch([_new("r", 4, 0)], [], {"r": 4}))
    assert once.sampled_token_ids == again.sampled_token_ids != [[]]


def test_an_eos_probability_of_one_samples_eos():
    workload = workload_from_json({**BASE, "eos_token_id": 7,
                                   "requests": [{"id": "r", "prompt_len": 4, "eos_probability": 1.0}]})
    out = FabricatedModel(workload, SimpleNamespace).execute(_batch([_new("r", 4, 0)], [], {"r": 4}))
    assert out.sampled_token_ids == [[7]]


def test_replay_without_the_venv_exits_2_and_names_the_build_script(tmp_path: Path, monkeypatch,
                                                                     capsys: pytest.CaptureFixture[str]):
    monkeypatch.setenv("FLIGHTCHECK_VLLM_CACHE", str(tmp_path / "no-venvs"))
    monkeypatch.delenv("FLIGHTCHECK_VLLM_PYTHON_0_8_5", raising=False)
    workload = tmp_path / "w.json"
    workload.write_text(json.dumps({**BASE, "requests": [{"prompt_len": 4}]}))
    assert main(["vllm", "replay", str(workload)]) == 2
    assert "scripts/build-vllm-venv.sh 0.8.5" in capsys.readouterr().err


def test_replay_of_a_malformed_workload_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    workload = tmp_path / "w.json"
    workload.write_text(json.dumps({**BASE, "requests": [{"prompt_len": 0}]}))
    assert main(["vllm", "replay", str(workload)]) == 2
    assert "prompt_len" in capsys.readouterr().err


def test_a_request_reusing_an_id_keeps_its_own_name_prompt_and_tokens():
    workload = workload_from_json({**BASE, "requests": [
        {"id": "r0", "prompt_len": 6, "abort_step": 1},
        {"id": "r0-again", "reuse_id": "r0", "prompt_len": 6, "arrival_step": 1, "abort_step": 4,
         "abort_via": "aborts_queue"}]})
    old, new = workload.requests
    assert (old.req_id, old.key, old.reuses_id) == ("r0", "r0", False)
    assert (new.req_id, new.key, new.reuses_id, new.abort_via_aborts_queue) == ("r0", "r0-again", True, True)
    assert old.prompt_token_ids != new.prompt_token_ids


@pytest.mark.parametrize("mid_step_inputs", [False, True])
def test_a_reused_id_is_aborted_before_its_reuse_arrives_whatever_moved_its_arrival(mid_step_inputs: bool):
    """The cache-aware family moved r1's arrival (step 1) past its abort
    (step 0) in seed 51 index 56 (`--all-features --reuse-ids`, 0.34.0): r1
    was never aborted and r2, under its id at step 1, met vLLM's "duplicate
    request id" assertion."""
    from flightcheck.vllm.generate import campaign_workloads
    for seed in (51, 52):
        for workload in campaign_workloads(seed, 80, True, 2, mid_step_inputs=mid_step_inputs,
                                           features_of="0.34.0"):
            by_id = {r["id"]: r for r in workload["requests"]}
            for request in workload["requests"]:
                old = by_id.get(request.get("reuse_id", ""))
                if old is not None:
                    assert old["arrival_step"] <= old["abort_step"] <= request["arrival_step"], workload["name"]
    drawn = campaign_workloads(51, 57, True, 2, features_of="0.34.0")[56]["requests"]
    assert [(r["id"], r["arrival_step"], r.get("abort_step")) for r in drawn] == [("r0", 0, None), ("r1", 1, 1),
                                                                                   ("r2", 1, None)]


def test_the_0_33_runner_knows_the_tokens_it_sampled_and_follows_the_scheduler_s_count():
    """vLLM 0.33's last-rank runner appends what it samples at once and cuts
    its outputs back to the scheduler's num_output_tokens."""
    workload = workload_from_json({**BASE, "requests": [{"id": "r", "prompt_len": 8}]})
    model = FabricatedModel(workload, SimpleNamespace, caches_sampled_tokens=True)

    def cached(start: int, outputs: int) -> SimpleNamespace:
        return SimpleNamespace(req_ids=["r"], num_computed_tokens=[start], new_token_ids=[],
                               num_output_tokens=[outputs])

    empty = SimpleNamespace(req_ids=[], num_computed_tokens=[], new_token_ids=[], num_output_tokens=[])
    assert model.execute(_batch([_new("r", 8, 0)], empty, {"r": 8})).sampled_token_ids[0]
    # Known: 8 prompt + 1 sampled. A decode at 8 (scheduler: 1 output) samples.
    assert model.execute(_batch([], cached(8, 1), {"r": 1})).sampled_token_ids[0]
    # The runner now knows 10 tokens; were the scheduler to count 2 outputs but
    # schedule a chunk ending at 9 (a recomputation), the runner does not sample.
    assert model.execute(_batch([], cached(0, 2), {"r": 9})).sampled_token_ids == [[]]
    # A scheduler that dropped an output (count 1): the runner follows it.
    assert model.execute(_batch([], cached(0, 1), {"r": 9})).sampled_token_ids[0]


def test_replay_on_0_33_without_its_venv_exits_2_and_names_the_build_script(tmp_path: Path, monkeypatch,
                                                                             capsys: pytest.CaptureFixture[str]):
    monkeypatch.setenv("FLIGHTCHECK_VLLM_CACHE", str(tmp_path / "no-venvs"))
    monkeypatch.delenv("FLIGHTCHECK_VLLM_PYTHON_0_33_0", raising=False)
    workload = tmp_path / "w.json"
    workload.write_text(json.dumps({**BASE, "requests": [{"prompt_len": 4}]}))
    assert main(["vllm", "replay", str(workload), "--vllm-version", "0.33.0"]) == 2
    assert "scripts/build-vllm-venv.sh 0.33.0" in capsys.readouterr().err
