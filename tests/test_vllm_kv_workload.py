"""The KV connector's workload fields, its timing rule and its generated
family, without vLLM (flightcheck/vllm/kv_workload.py, kv_transfers.py,
kv_generate.py)."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest

from flightcheck.vllm.campaign import differential_runs
from flightcheck.vllm.generate import FAMILIES, campaign_workloads
from flightcheck.vllm.kv_transfers import KVTransfers
from flightcheck.vllm.kv_workload import (KVConnectorConfig, KVRequestSpec, failed_blocks, has_kv_connector,
                                          offered_tokens, with_default_connector)
from flightcheck.vllm.workload import WorkloadError, workload_from_json

pytestmark = pytest.mark.usefixtures("both_checkers")

PLAIN = {"config": {"num_stages": 2, "max_num_batched_tokens": 16, "max_num_seqs": 2, "block_size": 4,
                    "num_blocks": 20, "max_model_len": 64},
         "requests": [{"id": "a", "prompt_len": 10, "max_tokens": 2}]}


def _request(req_id: str, num_tokens: int) -> SimpleNamespace:
    return SimpleNamespace(request_id=req_id, num_tokens=num_tokens)


def test_an_old_workload_has_no_connector_and_a_new_one_reads_every_field():
    assert workload_from_json(PLAIN).config.kv_connector is None
    raw = {**PLAIN, "kv_connector": {"producer": True, "load_failure_policy": "fail", "max_inflight_loads": 2},
           "requests": [{"id": "a", "prompt_len": 10, "kv": {"hit": 8, "async": True, "load_steps": 3,
                                                              "fail_from_block": 1, "send_steps": 2}}]}
    workload = workload_from_json(raw)
    assert workload.config.kv_connector == KVConnectorConfig(True, True, "fail", 2)
    assert workload.config.kv_connector.kv_role == "kv_both"
    assert workload.requests[0].kv == KVRequestSpec(8, True, 3, 1, False, 2)


@pytest.mark.parametrize("bad", [
    {"requests": [{"id": "a", "prompt_len": 4, "kv": {"hit": 4}}]},                 # kv without a connector
    {"kv_connector": {"consumer": False, "producer": False}},
    {"kv_connector": {"load_failure_policy": "retry"}},
    {"kv_connector": {"max_inflight_loads": 0}},
    {"kv_connector": {}, "requests": [{"id": "a", "prompt_len": 4, "kv": {"load_steps": 0}}]},
    {"kv_connector": {}, "requests": [{"id": "a", "prompt_len": 4, "kv": {"hits": 4}}]},
    {"kv_connector": {}, "config": {**PLAIN["config"], "kv_connector": {}}},          # given twice
])
def test_a_bad_connector_or_kv_is_refused(bad):
    with pytest.raises(WorkloadError):
        workload_from_json({**PLAIN, **bad})


def test_the_offer_leaves_a_sync_load_a_token_to_compute_on_a_block_boundary_and_fails_from_the_named_block():
    sync, load_async = KVRequestSpec(hit=16), KVRequestSpec(hit=16, load_async=True)
    assert offered_tokens(sync, 4, 12, 4) == 4 and offered_tokens(load_async, 4, 12, 4) == 8
    assert offered_tokens(sync, 0, 40, 4) == 16 and offered_tokens(sync, 0, 8, 4) == 4
    assert list(failed_blocks(KVRequestSpec(fail_from_block=0), range(1, 4))) == [1, 2, 3]
    assert list(failed_blocks(KVRequestSpec(fail_from_block=2), range(1, 4))) == [2, 3]
    assert list(failed_blocks(KVRequestSpec(fail_from_block=4), range(1, 4))) == []
    assert list(failed_blocks(KVRequestSpec(fail_whole=True), range(1, 4))) == [1, 2, 3]


def test_the_timing_rule_counts_every_update_from_the_step_that_started_the_transfer():
    transfers = KVTransfers(KVConnectorConfig(producer=True), block_size=4)
    a, b = _request("a", 20), _request("b", 20)
    transfers.bind("a", KVRequestSpec(hit=8, load_async=True, load_steps=2, fail_from_block=1))
    transfers.bind("b", KVRequestSpec(hit=8, fail_from_block=0, send_steps=3))
    assert transfers.offer(a, 4) == (8, True) and transfers.offer(b, 0) == (8, False)
    transfers.allocated(a, [10, 11, 12, 13, 14], 8)           # loads blocks 1 and 2 of its table
    transfers.allocated(b, [20, 21], 8)
    started = transfers.take_started()
    assert transfers.offer(a, 0) == (0, False)                  # promised once per incarnation
    first = transfers.report(started)                           # update 1: b's batch, its sync failure
    assert first.invalid_block_ids == {20, 21} and not first.finished_recving
    assert transfers.finished(b, "FINISHED_LENGTH_CAPPED", [20, 21])    # held, sent at update 1 + 3
    assert not transfers.finished(a, "FINISHED_ABORTED", [10, 11, 12, 13, 14])
    second = transfers.report([])                               # update 2 = 0 + load_steps
    assert second.finished_recving == {"a"} and second.invalid_block_ids == {11, 12}
    assert not transfers.report([]) and transfers.report([]).finished_sending == {"b"}
    assert transfers.pending() == 0


def test_the_family_sets_a_connector_on_valid_workloads_and_stays_out_of_every_versions_families():
    workloads = campaign_workloads(3, 40, family="kv-connector")
    assert "kv-connector" not in FAMILIES
    for raw in workloads:
        workload_from_json(raw)
    with_connector = [raw for raw in workloads if has_kv_connector(raw)]
    assert 0 < len(with_connector) < len(workloads)            # one in eight is the control
    kinds = {(r["kv"]["async"], r["kv"]["fail_whole"], r["kv"]["fail_from_block"] is not None)
             for raw in with_connector for r in raw["requests"]}
    assert len(kinds) >= 5
    assert campaign_workloads(3, 40, family="kv-connector") == workloads


def test_the_differential_is_not_run_where_the_reference_lacks_a_connector(monkeypatch):
    from flightcheck.vllm import reference_run

    raw = with_default_connector(PLAIN)
    assert has_kv_connector(raw) and workload_from_json(raw).config.kv_connector == KVConnectorConfig()
    monkeypatch.setattr(reference_run, "SUPPORTS_KV_CONNECTOR", False, raising=False)
    assert differential_runs(PLAIN) and not differential_runs(raw)
    monkeypatch.setattr(reference_run, "SUPPORTS_KV_CONNECTOR", True)
    assert differential_runs(raw)


def test_campaign_kv_connector_refuses_a_version_without_the_connector_api(capsys):
    from flightcheck.vllm.campaign import add_options, run_campaign

    parser = argparse.ArgumentParser()
    add_options(parser)
    args = parser.parse_args(["--kv-connector", "--versions", "0.8.5", "--workloads", "1"])
    assert run_campaign(args, parser.error) == 2
    assert "0.33.0 or 0.34.0" in capsys.readouterr().err


def test_replay_kv_connector_gives_a_connector_and_refuses_it_on_0_8_and_bad_json(tmp_path, capsys):
    import json

    from flightcheck.cli import main

    workload = tmp_path / "w.json"
    workload.write_text(json.dumps({**PLAIN, "requests": [{"id": "a", "prompt_len": 10, "kv": {"hit": 8}}]}))
    # a request's kv without a connector: refused, unless --kv-connector gives one
    assert main(["vllm", "replay", str(workload), "--vllm-version", "0.33.0"]) == 2
    assert "no kv_connector" in capsys.readouterr().err
    assert main(["vllm", "replay", str(workload), "--vllm-version", "0.8.5", "--kv-connector"]) == 2
    assert "0.33.0 or 0.34.0" in capsys.readouterr().err
    assert main(["vllm", "replay", str(workload), "--vllm-version", "0.34.0", "--kv-connector", "[1]"]) == 2
    assert "a JSON object" in capsys.readouterr().err
    assert main(["vllm", "replay", str(workload), "--vllm-version", "0.34.0", "--kv-connector",
                 '{"consumer": false}']) == 2                 # a producer-less non-consumer: no connector
    assert "consumer, a producer or both" in capsys.readouterr().err
