"""The findings of docs/vllm-kv-connector-findings.md, each reproduced on
vLLM's real scheduler (0.34.0, and 0.33.0 where the code is the same).

vLLM's scheduler runs in its venv, in one subprocess per version, with the
bridge's fabricated connector (flightcheck/vllm/kv_connector.py, its
ledger kv_transfers.py and its worker side `attach_report`): the driver
below builds the scheduler as the replay worker does
(`SchedulerFactory.build` with the workload's `kv_connector`), then calls
`schedule()` and `update_from_output()` in the order each scenario names, so
that which batches are in flight when a load failure is reported is exact.
The fabricated model samples token 1000 + b for batch b wherever the entry
was not a prefill chunk when scheduled, so every output token names the
batch that produced it. After every call the driver records each request's
counters as vLLM holds them.

The same two workloads are then replayed the project's usual way
(`ReplayWorker`: the replay's copy of the version's engine loop, its
fabricated model, the bridge's connector and worker side, the recorder's
trace and vLLM's ground truth): the engine's own order of `schedule()` and
`update_from_output()` gives the same batches, and vLLM's own state shows
the bug.

Slow (`vllm` and `slow`): a vLLM import is 10-100 s on the shared machine.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

import flightcheck
from flightcheck.vllm import ASYNC_RECORDER
from flightcheck.vllm.replay import ReplayWorker, venv_python

from .vllm_support import require_venv

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

DRIVER = r'''
import json, sys

import flightcheck.vllm.replay_worker as worker
from flightcheck.vllm import compat
from flightcheck.vllm.kv_connector import attach_report
from flightcheck.vllm.kv_transfers import KVTransfers, install
from flightcheck.vllm.kv_workload import KVConnectorConfig, KVRequestSpec
from flightcheck.vllm.workload import ReplayConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.request import Request

FACTORY = worker.SchedulerFactory()


def build(s):
    connector = KVConnectorConfig(consumer=True, producer=False, load_failure_policy=s.get("policy", "recompute"))
    config = ReplayConfig(num_stages=s.get("stages", 1), max_num_batched_tokens=s.get("budget", 64),
                          max_num_seqs=4, block_size=s["block_size"], num_blocks=32, max_model_len=512,
                          long_prefill_token_threshold=0, prefix_caching=False,
                          async_scheduling=s.get("async", False), kv_connector=connector)
    transfers = KVTransfers(connector, config.block_size)
    install(transfers)
    name = worker.PLAIN_ASYNC_SCHEDULER if config.async_scheduling else worker.PLAIN_SCHEDULER
    return FACTORY.build(worker.resolve_obj_by_qualname(name), config), transfers


def request(spec):
    params = SamplingParams(max_tokens=spec["max_tokens"], ignore_eos=True)
    params.update_from_generation_config({}, 2)
    return Request(request_id=spec["id"], prompt_token_ids=list(range(10, 10 + spec["prompt"])),
                   sampling_params=params, pooling_params=None, arrival_time=0.0, block_hasher=None)


def counters(scheduler, req_id):
    r = scheduler.requests.get(req_id)
    if r is None:
        return None
    return {"status": r.status.name, "num_computed_tokens": r.num_computed_tokens,
            "num_output_placeholders": getattr(r, "num_output_placeholders", 0),
            "num_in_flight_tokens": getattr(r, "num_in_flight_tokens", None),
            "output_token_ids": list(r.output_token_ids), "num_tokens": r.num_tokens}


def run(s):
    scheduler, transfers = build(s)
    rollbacks = []
    scan = scheduler._update_requests_with_invalid_blocks

    def observed(requests, invalid, num_scheduled, evict_blocks=True):
        # observation only: what vLLM's own rollback returns
        requests = list(requests)
        before = {r.request_id: r.num_computed_tokens for r in requests}
        affected, tokens, evict = scan(requests, invalid, num_scheduled, evict_blocks)
        if affected:
            rollbacks.append({"affected": sorted(affected), "affected_tokens": tokens,
                              "computed_before": before, "scheduled_in_failing_batch": dict(num_scheduled)})
        return affected, tokens, evict

    scheduler._update_requests_with_invalid_blocks = observed
    for spec in s["requests"]:
        kv = spec.get("kv", {})
        transfers.bind(spec["id"], KVRequestSpec(hit=kv.get("hit", 0), fail_from_block=kv.get("fail_from_block")))
        scheduler.add_request(request(spec))
    batches, log = [], []
    for step in s["steps"]:
        entry = {"do": step}
        if step == "schedule":
            out = scheduler.schedule()
            samples = [r for r in out.num_scheduled_tokens if not scheduler.requests[r].is_prefill_chunk]
            batches.append((out, samples))
            entry.update(batch=len(batches) - 1, scheduled=dict(out.num_scheduled_tokens), samples=samples)
        else:
            index = int(step.split()[1])
            out, samples = batches[index]
            ids = list(out.num_scheduled_tokens)
            runner = compat.model_runner_output(ids, [[1000 + index] if r in samples else [] for r in ids])
            report = attach_report(transfers, out, runner)
            outputs = scheduler.update_from_output(out, runner)
            entry.update(batch=index, invalid_block_ids=sorted(report.invalid_block_ids),
                         delivered={o.request_id: list(o.new_token_ids) for e in outputs.values() for o in e.outputs})
        entry["requests"] = {spec["id"]: counters(scheduler, spec["id"]) for spec in s["requests"]}
        log.append(entry)
    return {"name": s["name"], "log": log, "rollbacks": rollbacks}


for line in sys.stdin:
    scenario = json.loads(line)
    try:
        result = run(scenario)
    except Exception as err:
        import traceback
        result = {"name": scenario["name"], "error": traceback.format_exc()}
    print(json.dumps(result), flush=True)
'''

# A request of 8 prompt tokens whose first block (4 tokens) the connector
# loads synchronously, and whose load fails (block 0 invalid, reported with
# the output of the batch that carried the load). Async scheduling, one
# stage: vLLM schedules the request's first decode (batch 1) before batch 0
# is back.
PLACEHOLDERS_ASYNC = {
    "name": "placeholders-async", "async": True, "block_size": 4,
    "requests": [{"id": "r", "prompt": 8, "max_tokens": 6, "kv": {"hit": 4, "fail_from_block": 0}}],
    "steps": ["schedule", "schedule", "complete 0", "schedule", "complete 1", "schedule", "complete 2",
              "schedule", "complete 3", "complete 4"],
}
# The same request and failure under sync scheduling, one stage: the
# rollback with one batch in flight, the behaviour the spec asks for.
PLACEHOLDERS_SYNC = {**PLACEHOLDERS_ASYNC, "name": "placeholders-sync", "async": False,
                     "steps": ["schedule", "complete 0", "schedule", "complete 1"]}
# Pipeline parallelism, two stages, sync scheduling: 12 prompt tokens, the
# first 4 loaded synchronously (block 0 fails), chunks of 4 (the token
# budget): batch 0 computes tokens 4-8 over the load, batch 1 tokens 8-12
# (the prompt's last chunk: it samples) while batch 0 is in flight.
VALID_PREFIX_PP = {
    "name": "valid-prefix-pp", "stages": 2, "block_size": 4, "budget": 4,
    "requests": [{"id": "r", "prompt": 12, "max_tokens": 3, "kv": {"hit": 4, "fail_from_block": 0}}],
    "steps": ["schedule", "schedule", "complete 0", "schedule", "complete 1", "schedule", "complete 2",
              "schedule", "complete 3", "schedule", "complete 4"],
}
SCENARIOS = [PLACEHOLDERS_ASYNC, PLACEHOLDERS_SYNC, VALID_PREFIX_PP]


def drive(version: str, tmp: Path) -> dict[str, dict[str, Any]]:
    """Every scenario through vLLM `version`'s real scheduler: name -> result."""
    require_venv(version)
    (tmp / "flightcheck").symlink_to(Path(flightcheck.__file__).resolve().parent, target_is_directory=True)
    (tmp / "kv_findings_driver.py").write_text(DRIVER)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(tmp)
    done = subprocess.run([str(venv_python(version)), "-m", "kv_findings_driver"], cwd=tmp, env=env, text=True,
                          input="".join(json.dumps(s) + "\n" for s in SCENARIOS), capture_output=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    results = {r["name"]: r for r in map(json.loads, done.stdout.splitlines())}
    for result in results.values():
        assert "error" not in result, result["error"]
    return results


@pytest.fixture(scope="module", params=["0.34.0", "0.33.0"])
def vllm_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return drive(request.param, tmp_path_factory.mktemp(f"kv-findings-{request.param}"))


def _r(entry: dict[str, Any]) -> dict[str, Any]:
    return entry["requests"]["r"]


def test_49250_the_recompute_rollback_keeps_the_async_placeholders(vllm_run: dict[str, Any]) -> None:
    """Finding 1 (vLLM #49250, open): under async scheduling the rollback
    leaves `num_output_placeholders` as they were, the recompute schedules
    the prompt plus those placeholders, and the decode scheduled on the
    failed prefill's placeholder delivers a token (KV3)."""
    result = vllm_run["placeholders-async"]
    log = result["log"]
    # the valid prefix base: 9 computed - 4 in the failing batch = 5 (4 were
    # loaded): the decode in flight is counted as computed before it (finding 2)
    (rollback,) = result["rollbacks"]
    assert rollback["computed_before"] == {"r": 9} and rollback["affected_tokens"] == 5
    first, decode, failed, recompute, stale = log[:5]
    assert first["scheduled"] == {"r": 4} and first["samples"] == ["r"]
    assert _r(first)["num_output_placeholders"] == 1
    assert decode["scheduled"] == {"r": 1} and _r(decode)["num_output_placeholders"] == 2
    # batch 0 is back with block 0 invalid: rolled back to 0 computed tokens,
    # its sampled token dropped, and both placeholders kept
    assert failed["invalid_block_ids"] and failed["delivered"] == {}
    assert _r(failed)["num_computed_tokens"] == 0
    assert _r(failed)["num_output_placeholders"] == 2
    # the recompute: 8 prompt tokens known, 10 scheduled (2 placeholder positions)
    assert _r(failed)["num_tokens"] == 8
    assert recompute["scheduled"] == {"r": 10}
    # batch 1, the decode on the failed prefill's placeholder, delivers its token
    assert stale["delivered"] == {"r": [1001]}
    assert _r(stale)["output_token_ids"] == [1001]
    # with nothing in flight, a placeholder is left that no batch will fill
    last = log[-1]
    assert last["do"] == "complete 4" and last["delivered"] == {"r": [1004]}
    assert _r(last)["num_in_flight_tokens"] == 0 and _r(last)["num_output_placeholders"] == 1


def test_the_same_failure_under_sync_scheduling_recomputes_the_prompt_alone(vllm_run: dict[str, Any]) -> None:
    """The control: one batch in flight, no placeholder: the recompute
    schedules the 8 prompt tokens and the first output comes from it."""
    log = vllm_run["placeholders-sync"]["log"]
    _, failed, recompute, done = log
    assert _r(failed)["num_computed_tokens"] == 0 and _r(failed)["num_output_placeholders"] == 0
    assert recompute["scheduled"] == {"r": 8}
    assert done["delivered"] == {"r": [1001]}      # batch 1 is the recompute


def test_valid_prefix_base_under_pp_counts_a_later_chunk_and_accepts_its_token(vllm_run: dict[str, Any]) -> None:
    """Finding 2: with two batches of the request in flight, the valid
    prefix base `num_computed_tokens - num_scheduled_tokens[req]` counts
    the later chunk as computed before the failing batch; the rollback
    leaves that chunk live, and its token, sampled over the invalid block,
    is accepted and then recomputed as part of the request (KV3)."""
    result = vllm_run["valid-prefix-pp"]
    log = result["log"]
    first, second, failed, recompute, stale = log[:5]
    assert first["scheduled"] == {"r": 4} and first["samples"] == []
    assert second["scheduled"] == {"r": 4} and second["samples"] == ["r"]
    assert _r(second)["num_computed_tokens"] == 12
    # the rollback: 12 computed, 4 scheduled in the failing batch: base 8,
    # while 4 tokens (the load) were computed before it
    (rollback,) = result["rollbacks"]
    assert rollback["computed_before"] == {"r": 12} and rollback["scheduled_in_failing_batch"] == {"r": 4}
    assert rollback["affected_tokens"] == 8
    assert _r(failed)["num_computed_tokens"] == 0 and _r(failed)["num_in_flight_tokens"] == 4
    # the recompute starts while batch 1 is still in flight
    assert recompute["scheduled"] == {"r": 4}
    # batch 1 (tokens 8-12, computed over the invalid block) delivers its token
    assert stale["delivered"] == {"r": [1001]}
    assert _r(stale)["output_token_ids"] == [1001] and _r(stale)["num_tokens"] == 13
    # and the recompute takes it as the request's own: 13 tokens recomputed
    # before the next token is sampled
    schedules = [e for e in log[3:] if e["do"] == "schedule"]
    assert [e["scheduled"] for e in schedules] == [{"r": 4}, {"r": 4}, {"r": 4}, {"r": 1}]
    assert [e["samples"] for e in schedules] == [[], [], [], ["r"]]


# -- the same failures, replayed through the replay's engine loop -------------

def workload(scenario: dict[str, Any]) -> dict[str, Any]:
    """A scenario as a replay workload (flightcheck/vllm/workload.py)."""
    (spec,) = scenario["requests"]
    return {"name": scenario["name"], "seed": 0,
            "config": {"num_stages": scenario.get("stages", 1),
                       "max_num_batched_tokens": scenario.get("budget", 64), "max_num_seqs": 4,
                       "block_size": scenario["block_size"], "num_blocks": 32, "max_model_len": 512,
                       "long_prefill_token_threshold": 0, "prefix_caching": False,
                       "async_scheduling": scenario.get("async", False),
                       "kv_connector": {"consumer": True, "load_failure_policy": "recompute"}},
            "requests": [{"id": spec["id"], "prompt_len": spec["prompt"], "max_tokens": spec["max_tokens"],
                          "ignore_eos": True, "kv": spec["kv"]}]}


@pytest.fixture(scope="module", params=["0.34.0", "0.33.0"])
def replayed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """name -> (the replay's result, the recorded trace's events)."""
    require_venv(request.param)
    folder = tmp_path_factory.mktemp(f"kv-findings-replay-{request.param}")
    results = {}
    with ReplayWorker(request.param) as worker:
        for scenario in (PLACEHOLDERS_ASYNC, VALID_PREFIX_PP):
            trace = folder / f"{scenario['name']}.jsonl"
            result = worker.replay(workload(scenario), trace=str(trace),
                                   scheduler_cls=ASYNC_RECORDER if scenario.get("async") else None)
            results[scenario["name"]] = (result, [json.loads(line) for line in trace.read_text().splitlines()])
    return results


def _token_of(events: list[dict[str, Any]], batch: int) -> list[int]:
    (complete,) = [e for e in events if e["ev"] == "complete" and e.get("batch") == batch]
    return complete["tokens"]["r"]


def test_49250_replayed_vllms_own_state_breaks_the_placeholder_rule(replayed: dict[str, Any]) -> None:
    result, events = replayed["placeholders-async"]
    assert result["ending"] == "done"
    assert result["batches"][:3] == [{"r": 4}, {"r": 1}, {"r": 10}]
    assert [r["invalid_block_ids"] for r in result["kv_reports"]] == [[1]]
    # vLLM's ground truth: after the rollback 2 placeholders, no sampling entry but batch 2's decode
    first = result["ground_truth"]["placeholder_mismatches"][0]
    assert first["rule"] == "placeholders = sampling entries in flight"
    assert (first["placeholders"], first["num_computed_tokens"], first["num_tokens"]) == (2, 0, 8)
    # the recorder's trace: batch 1's output dropped, batch 2's token (the decode on its placeholder) kept
    assert [e["ev"] for e in events if e.get("step") in (2, 3)] == ["schedule", "kv_failed", "complete"]
    assert next(e for e in events if e["ev"] == "complete")["dropped"] == ["r"]
    assert result["outputs"][0][1] == _token_of(events, 2)


def test_valid_prefix_replayed_the_later_chunks_token_is_kept_and_a_chunk_samples(replayed: dict[str, Any]) -> None:
    result, events = replayed["valid-prefix-pp"]
    assert result["ending"] == "done"
    assert result["batches"][:5] == [{"r": 4}] * 5
    assert [r["invalid_block_ids"] for r in result["kv_reports"]] == [[1]]
    # batch 2 (tokens 8-12, over the invalid block) gives the request its first output
    assert result["outputs"][0][1] == _token_of(events, 2)
    # the recompute then re-runs tokens 0-12 in chunks; its chunk ending at
    # the prompt's end (12) is short of the 13 tokens the request now has,
    # yet vLLM appends the token the runner samples there
    (partial,) = result["ground_truth"]["partial_chunk_tokens"]
    assert (partial["batch"], partial["end"]) == (5, 12)
