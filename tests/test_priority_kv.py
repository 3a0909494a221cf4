"""The priority policy beside the KV connector (docs/request-states.md,
"Features together"): under the policy vLLM's connector queues are priority
heaps (`Scheduler.__init__`: `create_request_queue(self.policy)` for
`kv_holding_waiting` and, in 0.34, `async_kv_waiting`), in the spec, the
reference and the bridge; the explicit model where the policy's and the
connector's invariants are checked together, and the pair's mutants."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from flightcheck.spec import Config, KvConnector, Prompt, invariants_for, transition_properties_for
from flightcheck.spec.profiles import PROFILES
from flightcheck.spec.transitions import Arrive, Schedule, step
from flightcheck.verification.explicit import search as explicit
from flightcheck.verification.mutants import ALL_MUTANTS, KV_MUTANTS, MUTANTS
from flightcheck.verification.mutants.registry import PRIORITY_KV_MUTANTS, PRIORITY_MUTANTS
from flightcheck.verification.priority_kv_models import (PRIO_KV_K2, PRIORITY_KV_MUTANT_MODELS,
                                                         PRIORITY_KV_PROFILE_MODELS)
from flightcheck.verification.suite import hunt_mutant
from flightcheck.verification.traces.check import check_events
from flightcheck.verification.traces.counterexample import broken_at, replay
from flightcheck.verification.traces.reading import read_trace_file
from flightcheck.verification.traces.stream import check_lines
from flightcheck.vllm.differential import decisions, read_trace, run_reference
from flightcheck.vllm.features import registered

# (states, edges, max depth) -- change only with a reviewed change of semantics.
PINNED = {
    "prio-kv-k2": (2215, 5999, 15),
    "prio-kv-hold-k2": (64, 109, 10),
    "prio-kv-k2@vllm-0.33": (2177, 5891, 15),
    "prio-kv-hold-k2@vllm-0.33": (64, 109, 10),
    "prio-kv-k2@vllm-0.33-async": (4159, 11125, 16),
    "prio-kv-hold-k2@vllm-0.33-async": (97, 178, 11),
    "prio-kv-k2@vllm-0.34-async": (4237, 11337, 16),
    "prio-kv-hold-k2@vllm-0.34-async": (97, 178, 11),
}
# Checked together on every state and step of these models.
PROPERTIES = {"PR1_waiting_in_priority_order", "PR2_victim_leaves_no_trace", "PR4_kv_holding_in_priority_order",
              "KV1_no_reuse_under_transfer", "KV2_loading_not_scheduled", "KV4_no_leak", "KV5_loaded_not_starved",
              "S9_kv_ownership", "L2_no_deadlock"}
KILLS = {
    "load_ranked_behind_new_request_pr57841": ("L2_no_deadlock", 4),
    "parked_load_joins_tail_under_priority": ("PR4_kv_holding_in_priority_order", 4),
}


def test_the_profiles_name_where_the_policy_changes_the_connector() -> None:
    for name in ("vllm-0.33", "vllm-0.33-async", "vllm-0.34", "vllm-0.34-async"):
        assert PROFILES[name].priority_orders_kv_holding, name
        assert PROFILES[name].priority_orders_async_kv == name.startswith("vllm-0.34"), name
    assert not any(PROFILES[n].priority_orders_kv_holding for n in ("vllm-0.8.5", "vllm-0.8.4"))


def test_pr4_is_checked_only_with_the_policy_and_a_connector() -> None:
    names = {i.name for i in invariants_for(PRIO_KV_K2.cfg)}
    assert "PR4_kv_holding_in_priority_order" in names
    fcfs = Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2, num_blocks=4,
                  max_model_len=6, prefix_caching=False, profile="vllm-0.34", kv_connector=KvConnector())
    plain = Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2, num_blocks=4,
                   max_model_len=6, prefix_caching=False, profile="vllm-0.34", scheduling_policy="priority")
    assert all("PR4_kv_holding_in_priority_order" not in {i.name for i in invariants_for(c)} for c in (fcfs, plain))


def test_a_later_load_of_a_better_rank_parks_ahead_of_an_earlier_one() -> None:
    """r0 (priority 1) parks first, r1 (priority 0) after it: vLLM's heap
    holds r1 ahead (FCFS: r0 ahead, the tail)."""
    cfg = PRIO_KV_K2.cfg
    low, high = PRIO_KV_K2.prompts
    state = explicit.initial(PRIO_KV_K2)
    for action in (Arrive(0, low), Schedule(), Arrive(1, high), Schedule()):
        state = step(state, cfg, action)
    assert state.kv_holding == (1, 0)
    from dataclasses import replace
    fcfs = replace(cfg, scheduling_policy="fcfs")
    state = explicit.initial(replace(PRIO_KV_K2, cfg=fcfs))
    for action in (Arrive(0, low), Schedule(), Arrive(1, high), Schedule()):
        state = step(state, fcfs, action)
    assert state.kv_holding == (0, 1)


def _prove(profile: str) -> None:
    for model in PRIORITY_KV_PROFILE_MODELS[profile]:
        names = {i.name for i in invariants_for(model.cfg)} | {p.name for p in transition_properties_for(model.cfg)}
        assert PROPERTIES <= names, PROPERTIES - names
        r = explicit.search(model)
        assert r.complete
        assert not r.violations, [(v.property, len(v.path)) for v in r.violations]
        assert (r.num_states, r.num_edges, r.max_depth) == PINNED[model.name], model.name


def test_the_pairs_models_prove_every_property_under_0_34() -> None:
    _prove("vllm-0.34")


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.33-async", "vllm-0.34-async"])
def test_the_pairs_models_prove_every_property_under_the_other_profiles(profile: str) -> None:
    _prove(profile)


def test_the_pairs_mutants_are_registered_apart() -> None:
    assert {n: (m.killed_by, m.shortest) for n, m in PRIORITY_KV_MUTANTS.items()} == KILLS
    assert set(PRIORITY_KV_MUTANTS) <= set(ALL_MUTANTS)
    assert not set(PRIORITY_KV_MUTANTS) & (set(MUTANTS) | set(KV_MUTANTS) | set(PRIORITY_MUTANTS))
    numbers = {int(m.group(1)) for name in PRIORITY_KV_MUTANTS if (m := re.search(r"_pr(\d+)$", name))}
    assert numbers == {57841}


@pytest.mark.parametrize("name", list(KILLS))
def test_the_pairs_mutant_is_killed_with_a_replayable_counterexample(name: str) -> None:
    result = hunt_mutant(name, model=PRIORITY_KV_MUTANT_MODELS[name])
    assert result.killed, f"{name} survived on {result.model}"
    assert (result.property, result.trace_length) == KILLS[name]
    cx = result.counterexample
    states = replay(cx.model, cx.actions)
    assert states == cx.states
    assert cx.property in broken_at(cx.model, states, cx.actions, len(cx.actions))


def test_priority_meets_the_kv_connector_in_the_campaign() -> None:
    features = {f.name: f for f in registered()}
    assert "kv-connector" not in features["priority"].excludes
    assert "priority" not in features["kv-connector"].excludes


# Two async loads that land together, the later of a better rank, one seat:
# under the priority policy the later one runs first (vLLM's kv_holding_waiting
# pops by rank); under FCFS the earlier.
def _two_loads(policy: str) -> dict:
    def request(name: str, arrival: int, priority: int) -> dict:
        return {"id": name, "prompt_len": 8, "max_tokens": 2, "arrival_step": arrival, "priority": priority,
                "kv": {"hit": 8, "async": True, "load_steps": 3 - arrival, "fail_from_block": None,
                       "fail_whole": False, "send_steps": 1}}
    return {"name": f"prio-kv-{policy}",
            "config": {"num_stages": 1, "max_num_batched_tokens": 16, "max_num_seqs": 1, "block_size": 4,
                       "num_blocks": 12, "max_model_len": 32, "prefix_caching": False, "policy": policy,
                       "kv_connector": {"consumer": True, "producer": False, "load_failure_policy": "recompute",
                                        "max_inflight_loads": None}},
            "requests": [request("r0", 0, 1), request("r1", 1, 0)], "max_steps": 200}


@pytest.mark.parametrize("policy,first", [("priority", "r1"), ("fcfs", "r0")])
def test_the_reference_runs_the_landed_load_of_the_better_rank_first(policy: str, first: str) -> None:
    events = run_reference(_two_loads(policy), "vllm-0.34").events
    scheduled = [e for e in events if e.get("ev") == "schedule"]
    firsts = [req for e in scheduled for req in _scheduled_requests(e)]
    assert firsts and firsts[0] == first, firsts
    assert decisions(events)


def _scheduled_requests(event: dict) -> list[str]:
    return [entry["req"] for entry in event.get("entries", event.get("reqs", []))]


DATA = Path(__file__).parent / "data" / "vllm" / "pairs"
# (workload, vLLM 0.34.0's trace of it), each showing one rule of the pair;
# with the connector's queues FCFS (main before this pair met) the reference
# decided otherwise on both, and check-trace rejected the second (a false
# KV2_loading_not_scheduled).
VLLM_RUNS = [
    # --all-features seed 6 index 132 (inputs during waits): r0 (priority 1)
    # waits plain, r1 (priority 0, arrived later) in async_kv_waiting; vLLM
    # 0.34's _next_waiting_queue takes r1 first (async_head < head), which
    # allocates its load's blocks before r0's chunk
    ("034_priority_async_head_ranked.workload.json", "034_priority_async_head_ranked.jsonl"),
    # _two_loads("priority"): both loads land together; kv_holding_waiting pops r1 first
    ("034_priority_two_loads_ranked.workload.json", "034_priority_two_loads_ranked.jsonl"),
]


@pytest.mark.usefixtures("both_checkers")
@pytest.mark.parametrize("workload,trace", VLLM_RUNS)
def test_vllms_run_of_the_pair_is_the_references_and_check_trace_accepts_it(workload: str, trace: str) -> None:
    raw = json.loads((DATA / workload).read_text())
    assert decisions(run_reference(raw, "vllm-0.34").events, block_offset=1) == decisions(read_trace(DATA / trace))
    for full in (False, True):
        result = check_events(read_trace_file(DATA / trace), None, full=full)
        assert result.ok, (result.property, result.message)
    assert list(check_lines((DATA / trace).read_text().splitlines()))[-1].result.ok


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_vllm_runs_the_landed_load_of_the_better_rank_first_as_the_reference_does(version: str,
                                                                                   async_scheduling: bool) -> None:
    if os.environ.get("FLIGHTCHECK_SKIP_VLLM"):
        pytest.skip("FLIGHTCHECK_SKIP_VLLM")
    from flightcheck.vllm.campaign import DISAGREEMENTS, run_version

    report = run_version(version, [_two_loads("priority"), _two_loads("fcfs")], 0, False, lambda line: None,
                         async_scheduling)
    assert report.workloads == 2 and report.identical == 2 and report.unexplained == []
    assert not set(report.verdicts) & DISAGREEMENTS, dict(report.verdict_details)
