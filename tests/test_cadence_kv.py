"""The prefill cadence beside the KV connector (docs/request-states.md,
"Prefill cadence", "Beside the KV connector"; vLLM 0.33.0 and 0.34.0 read
alike, `Scheduler.schedule`): the connector's waiting loop starts an async
load in a held call (the `load_kv_async` branch comes before the gate and
computes nothing), holds a sync or landed load with more than one token
left (`break`), admits one with one token left without restarting the
hold (`prefill_admitted`), and every request it skips or parks joins
`deferred_waiting` (`skip_request`); a held call runs no cache-aware reorder
(0.34: `if self.cache_aware_window and not defer_prefills`). The spec's
rules, the pair's explicit model, each rule's need, the reference's traces
checked, and (vLLM, slow) the campaign's workloads with the pair."""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from flightcheck.spec import Arrive, ReceiveKv, Schedule
from flightcheck.spec.actions import Sample
from flightcheck.spec.admission_order import is_reorder_in_force
from flightcheck.spec.cadence import defers_prefills
from flightcheck.spec.state import Status
from flightcheck.spec.transitions import CompleteOldest, Schedule as ScheduleAction
from flightcheck.verification.cadence_models import CADENCE_KV_FAIL_K2, CADENCE_KV_K2
from flightcheck.verification.explicit.search import initial, search, successors
from flightcheck.verification.traces.check import check_events
from flightcheck.verification.traces.reading import read_trace_file
from flightcheck.vllm.differential import decisions, read_trace
from flightcheck.vllm.features import registered
from flightcheck.vllm.generate import campaign_workloads
from flightcheck.vllm.reference_run import run_reference

from .fixtures import run_checked

pytestmark = pytest.mark.usefixtures("both_checkers")   # the reference's traces are checked

CFG = CADENCE_KV_K2.cfg
PREFILL, ASYNC_LOAD, SYNC_LOAD = CADENCE_KV_K2.prompts
# (states, edges, max depth) -- change only with a reviewed change of semantics.
PINNED = {"cadence-kv-k2": (1393, 2413, 15), "cadence-kv-fail-k2": (4482, 8666, 20)}
PAIR_TARGETS = ("load_parked_while_held", "landed_load_held", "one_token_load_admitted_while_held")


def _run(*actions, n: int = 3):
    return run_checked(CFG, n, actions)


def test_the_pair_is_no_longer_excluded_and_meets() -> None:
    features = {f.name: f for f in registered()}
    assert "kv-connector" not in features["prefill-cadence"].excludes
    assert "prefill-cadence" not in features["kv-connector"].excludes
    for version in ("0.34.0", "0.33.0"):
        met = sum({"prefill-cadence", "kv-connector"} <= set(w["features"])
                  for w in campaign_workloads(1, 40, features_of=version))
        assert met >= 3, (version, met)


def test_a_held_call_starts_an_async_load_then_stops_at_it_once_landed() -> None:
    held = _run(Arrive(0, PREFILL), Schedule(), Arrive(1, ASYNC_LOAD))
    assert held.prefill_hold == 1 and defers_prefills(held, CFG)    # r0's prefill restarted the hold
    parked = _run(Arrive(0, PREFILL), Schedule(), Arrive(1, ASYNC_LOAD), Schedule())
    q = parked.requests[1]
    assert q.status is Status.WAITING_FOR_REMOTE_KVS and q.deferred_waiting        # started, and skipped
    assert parked.prefill_hold == 1                          # the parking call executed nothing
    landed = _run(Arrive(0, PREFILL), Schedule(), Arrive(1, ASYNC_LOAD), Schedule(), CompleteOldest((Sample(),)),
                  ReceiveKv(1), Schedule())
    q = landed.requests[1]
    assert q.status is Status.WAITING and q.num_computed == 2 and landed.kv_holding == (1,)   # promoted, held
    assert [(e.req, e.start, e.n) for e in landed.in_flight[-1]] == [(0, 2, 1)]              # r0 decodes alone


def test_a_load_with_one_token_left_is_admitted_while_held_and_restarts_nothing() -> None:
    state = _run(Arrive(0, PREFILL), Schedule(), Arrive(2, SYNC_LOAD), Schedule())
    assert state.requests[2].status is Status.RUNNING
    assert [(e.req, e.start, e.n, e.external) for e in state.in_flight[-1]] == [(2, 2, 1, 2)]
    assert state.prefill_hold == 0                           # aged by the executed step, not restarted


def test_a_parked_load_is_deferred_so_it_never_backs_the_queue_up() -> None:
    state = _run(Arrive(1, ASYNC_LOAD), Schedule())          # a call that does not defer records the bound
    assert state.requests[1].deferred_waiting and not state.prefill_capacity_bound


def test_a_call_that_defers_prefills_does_not_reorder_by_cached_prefix() -> None:
    cfg = replace(CFG, profile="vllm-0.34", prefix_caching=True, cache_aware_admission_window=4,
                  cache_aware_admission_threshold=0.0, kv_connector=None)
    held = replace(_run(Arrive(0, PREFILL), Schedule()), waiting=(1, 2))
    held = held.with_request(1, status=Status.WAITING).with_request(2, status=Status.WAITING)
    assert defers_prefills(held, cfg) and not is_reorder_in_force(held, cfg)
    assert is_reorder_in_force(replace(held, prefill_hold=0), cfg)


# `--all-features` seed 10 index 15, vLLM 0.34.0 async (cache-aware order and the
# cadence, no connector): a held call where the window would move r3 (a prefix
# hit) ahead; vLLM's reorder runs only `if self.cache_aware_window and not
# defer_prefills`, so r0 decodes alone. Without the guard the reference admitted
# r3 (an unexplained differential) and check-trace rejected vLLM's run (a false
# schedule_decision).
HELD_NO_REORDER = ("034_cache_aware_cadence_no_reorder_seed10_15.workload.json",
                   "034_async_cache_aware_cadence_no_reorder_seed10_15.jsonl")


def test_vllms_held_call_runs_no_cache_aware_reorder() -> None:
    data = Path(__file__).parent / "data" / "vllm" / "cadence"
    raw = json.loads((data / HELD_NO_REORDER[0]).read_text())
    trace = data / HELD_NO_REORDER[1]
    assert decisions(run_reference(raw, "vllm-0.34-async").events, block_offset=1) == decisions(read_trace(trace))
    for full in (False, True):
        result = check_events(read_trace_file(trace), None, full=full)
        assert result.ok, (result.property, result.message)


def test_the_pairs_model_keeps_every_property_and_takes_the_pairs_steps() -> None:
    r = search(CADENCE_KV_K2)
    assert r.complete and not r.violations, [(v.property, len(v.path)) for v in r.violations]
    assert (r.num_states, r.num_edges, r.max_depth) == PINNED[CADENCE_KV_K2.name]
    assert set(PAIR_TARGETS) <= set(r.reached)


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["vllm-0.34-async", "vllm-0.33", "vllm-0.33-async"])
def test_the_pairs_model_under_the_other_profiles(profile: str) -> None:
    r = search(replace(CADENCE_KV_K2.under_profile(profile), name=f"cadence-kv-k2@{profile}"))
    assert r.complete and not r.violations, [(v.property, len(v.path)) for v in r.violations]
    assert set(PAIR_TARGETS) <= set(r.reached)


def _recomputes_while_held(before, after) -> bool:
    """A held call schedules a running request that its last schedule left
    no prefill chunk, for more than one token short of its prompt: a failed
    load's rollback in place (`_update_requests_with_invalid_blocks`)."""
    if not defers_prefills(before, CFG) or len(after.in_flight) <= len(before.in_flight):
        return False
    return any(e.req in before.running_set and not before.requests[e.req].is_prefill_chunk and e.n > 1
               and before.requests[e.req].num_computed < before.requests[e.req].num_tokens - 1
               for e in after.in_flight[-1])


@pytest.mark.slow
def test_with_failing_loads_a_rolled_back_request_recomputes_in_a_held_call() -> None:
    """Every property of both features holds with loads that fail, and the
    model reaches the finding (docs/vllm-kv-connector-findings.md): the
    rolled-back request keeps `is_prefill_chunk` False, so a held call runs
    its recompute (and, not counted as `prefill_scheduled`, restarts no hold)."""
    r = search(CADENCE_KV_FAIL_K2)
    assert r.complete and not r.violations, [(v.property, len(v.path)) for v in r.violations]
    assert (r.num_states, r.num_edges, r.max_depth) == PINNED[CADENCE_KV_FAIL_K2.name]
    seen, frontier = {initial(CADENCE_KV_FAIL_K2)}, [initial(CADENCE_KV_FAIL_K2)]
    while frontier:
        state = frontier.pop()
        for action, nxt in successors(CADENCE_KV_FAIL_K2, state):
            if isinstance(action, ScheduleAction) and _recomputes_while_held(state, nxt):
                assert nxt.prefill_hold == max(0, state.prefill_hold - 1)      # not restarted (CAD3 as vLLM)
                return
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    pytest.fail("no held call recomputed a rolled-back request")


def test_the_z3_encoding_leaves_the_pair_to_the_explicit_search() -> None:
    from flightcheck.verification.z3.encoding.cadence_state import refuse_unencoded_cadence
    with pytest.raises(ValueError, match="streaming sessions and the KV connector; the explicit search covers"):
        refuse_unencoded_cadence(CADENCE_KV_K2)


def test_without_the_gate_in_the_connectors_loop_cad1_breaks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.import_module("flightcheck.spec.cadence"), "stops_admission", lambda *a: False)
    r = search(CADENCE_KV_K2, stop_at_first=True)
    first = r.violations[0]
    assert (first.property, [type(a).__name__ for a, _ in first.path]) == (
        "CAD1_deferred_call_carries_no_prefill", ["Arrive", "Arrive", "Schedule", "ReceiveKv", "Schedule"])


def _pair_workloads(version: str, seeds: range, count: int) -> list[dict]:
    return [w for seed in seeds for w in campaign_workloads(seed, count, features_of=version)
            if {"prefill-cadence", "kv-connector"} <= set(w["features"])]


@pytest.mark.parametrize("profile", ["vllm-0.34", "vllm-0.33-async"])
def test_the_references_traces_of_the_pair_are_legal(profile: str) -> None:
    """The reference's own trace names no grammar (the bridge's recorder
    writes vLLM's grammar events), so workloads with one are left to the
    vLLM runs below; a reset beside a held table raises (RP4, vLLM alike)."""
    version = "0.34.0" if profile.startswith("vllm-0.34") else "0.33.0"
    workloads = [w for w in _pair_workloads(version, range(1, 2), 40) if "grammar" not in w["features"]][:2]
    assert len(workloads) == 2
    for workload in workloads:
        run = run_reference(workload, profile)
        assert run.events[0]["prefill_schedule_interval"] >= 2 and run.events[0].get("kv_connector")
        result = check_events(run.events)
        if run.exception is not None:
            assert "reset" in repr(run.exception) and result.property == "RP4_prefix_cache_reset"
        else:
            assert result.ok, (workload["name"], result.property, result.message)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_the_pairs_campaign_workloads_agree_with_vllm(version: str, async_scheduling: bool) -> None:
    """Seed 1's `--all-features` workloads holding the pair (15 of 80 per
    release): identical to the reference but for named deviations, each
    check-trace verdict its ground truth."""
    if os.environ.get("FLIGHTCHECK_SKIP_VLLM"):
        pytest.skip("FLIGHTCHECK_SKIP_VLLM")
    from flightcheck.vllm.campaign import DISAGREEMENTS, run_version

    workloads = _pair_workloads(version, range(1, 2), 80)
    assert len(workloads) >= 10
    report = run_version(version, workloads, 0, False, lambda line: None, async_scheduling)
    assert report.workloads == len(workloads) and report.unexplained == []
    assert not set(report.verdicts) & DISAGREEMENTS, dict(report.verdict_details)


# docs/vllm-kv-connector-findings.md, finding 4: r0 decodes under an interval of
# 4; r1's sync load of 8 tokens leaves one to compute (admitted in a held call),
# then fails from block 0; the rollback in place (`_update_requests_with_invalid_blocks`)
# leaves r1 `is_prefill_chunk` False, so the next held call schedules its
# recompute of all 9 tokens and restarts no hold.
ROLLBACK_RECOMPUTE = "cadence_kv_rollback_recompute_held.workload.json"


def test_a_rolled_back_requests_recompute_runs_in_a_held_call(monkeypatch: pytest.MonkeyPatch) -> None:
    cadence = importlib.import_module("flightcheck.reference.cadence")
    calls: list[tuple[bool, list[tuple[str, int]], int]] = []
    end = cadence.PrefillCadence._end_cadence

    def noted(self, batch) -> None:
        calls.append((self.defer_prefills, [(r.request_id, e.num_new_tokens)
                                            for r, e in zip(batch.requests, batch.entries)], self.last_prefill_step))
        end(self, batch)

    monkeypatch.setattr(cadence.PrefillCadence, "_end_cadence", noted)
    raw = json.loads((Path(__file__).parent / "data" / "vllm" / "cadence" / ROLLBACK_RECOMPUTE).read_text())
    run = run_reference(raw, "vllm-0.34")
    assert run.ending == "done" and check_events(run.events).ok
    assert any(e["ev"] == "kv_failed" and e["req"] == "r1" for e in run.events)
    held, entries, last_prefill = calls[2]
    assert held and entries == [("r0", 1), ("r1", 9)] and last_prefill == 1     # held, yet a 9-token prefill
    assert calls[3][2] == 1                                  # and the hold was not restarted by it


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
def test_vllm_recomputes_a_rolled_back_request_in_a_held_call(version: str) -> None:
    """vLLM makes the reference's decisions on the finding's workload (sync;
    under async scheduling #49250's placeholders are flagged first), so its
    held call runs the recompute; check-trace accepts (no property breaks)."""
    if os.environ.get("FLIGHTCHECK_SKIP_VLLM"):
        pytest.skip("FLIGHTCHECK_SKIP_VLLM")
    from flightcheck.vllm.campaign import run_version

    raw = json.loads((Path(__file__).parent / "data" / "vllm" / "cadence" / ROLLBACK_RECOMPUTE).read_text())
    report = run_version(version, [raw], 0, False, lambda line: None)
    assert (report.identical, report.unexplained, dict(report.verdict_details)) == (1, [], {"accepted": 1})
