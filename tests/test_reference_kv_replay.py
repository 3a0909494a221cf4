"""Replay workloads with a KV connector on the reference
(flightcheck/vllm/reference_run.py, `split_kv_connector`): the workload
format the vLLM side's fabricated connector reads (`kv_connector`, a
request's `kv`), run under every profile that has a connector, with the
timing rule (an async load reports with the `load_steps`-th output
processed after the schedule() that parked it)."""

from __future__ import annotations

import copy

import pytest

from flightcheck.reference.connector import KvConnectorConfig, KvOffer
from flightcheck.vllm.reference_run import run_reference, split_kv_connector

CONNECTOR = {"consumer": True, "producer": True, "load_failure_policy": "recompute", "max_inflight_loads": None}


def _kv(hit: int, load_async: bool, load_steps: int = 1, fail_from_block: int | None = None,
        fail_whole: bool = False, send_steps: int = 1) -> dict:
    return {"hit": hit, "async": load_async, "load_steps": load_steps, "fail_from_block": fail_from_block,
            "fail_whole": fail_whole, "send_steps": send_steps}


WORKLOAD = {
    "name": "kv-replay", "seed": 1,
    "config": {"num_stages": 2, "max_num_batched_tokens": 32, "max_num_seqs": 4, "block_size": 4,
               "num_blocks": 40, "max_model_len": 64, "long_prefill_token_threshold": 0,
               "prefix_caching": True, "kv_connector": CONNECTOR},
    "requests": [
        {"id": "a", "prompt_len": 20, "max_tokens": 4, "kv": _kv(8, False, send_steps=2)},
        {"id": "b", "prompt_len": 20, "max_tokens": 4, "arrival_step": 1, "kv": _kv(16, True, 2, fail_from_block=2)},
        {"id": "c", "prompt_len": 12, "max_tokens": 3, "arrival_step": 2, "abort_step": 3, "kv": _kv(8, True, 2)},
        {"id": "d", "prompt_len": 9, "max_tokens": 2, "arrival_step": 2},
    ]}


def test_the_connector_and_its_offers_are_read_from_the_workload():
    raw, connector, offers = split_kv_connector(WORKLOAD)
    assert "kv_connector" not in raw["config"] and "kv_connector" in WORKLOAD["config"]
    assert connector == KvConnectorConfig(consumer=True, producer=True)
    assert offers["b"] == KvOffer(hit=16, load_async=True, load_steps=2, fail_from_block=2)
    assert set(offers) == {"a", "b", "c"}
    top_level = copy.deepcopy(WORKLOAD)
    top_level["kv_connector"] = top_level["config"].pop("kv_connector")
    assert split_kv_connector(top_level)[1] == connector
    assert split_kv_connector({"requests": [{"id": "x"}]})[1:] == (None, {})


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.33-async", "vllm-0.34", "vllm-0.34-async"])
def test_a_connector_workload_runs_to_the_end_with_every_kind_of_report(profile):
    run = run_reference(WORKLOAD, profile)
    assert run.ending == "done" and run.exception is None
    config = run.events[0]
    assert config["kv_connector"] == CONNECTOR
    kinds = {e["ev"] for e in run.events}
    assert {"kv_received", "kv_failed", "kv_sent"} <= kinds
    arrive = {e["req"]: e for e in run.events if e["ev"] == "arrive"}
    assert (arrive["b"]["external_hit"], arrive["b"]["load_async"]) == (16, True)
    assert (arrive["d"]["external_hit"], arrive["d"]["load_async"]) == (0, False)
    loads = [load for e in run.events if e["ev"] == "schedule" for load in e.get("kv_loads", [])]
    assert [load["req"] for load in loads] == ["b", "c"]
    assert [e for e in run.events if e["ev"] == "abort"][0].get("held") is True
    finishes = {e["req"]: e for e in run.events if e["ev"] == "finish"}
    assert finishes["a"].get("held") and finishes["d"].get("held")
    entries = [x for e in run.events if e["ev"] == "schedule" for x in e["entries"]]
    assert [x["external"] for x in entries if x["req"] == "a"][0] == 8


def test_without_a_connector_the_trace_has_no_connector_keys():
    plain = copy.deepcopy(WORKLOAD)
    del plain["config"]["kv_connector"]
    run = run_reference(plain, "vllm-0.34")
    assert run.ending == "done"
    assert "kv_connector" not in run.events[0]
    assert not any("external" in x for e in run.events if e["ev"] == "schedule" for x in e["entries"])
    assert not any("external_hit" in e for e in run.events)
