"""vLLM 0.33/0.34's local prefill cadence (spec/cadence.py, reference/cadence.py,
`prefill_schedule_interval`): off by default and refused where it is not
modelled; the explicit search of the cadence models (CAD1-CAD3 hold, every
target reached, the held call with nothing to run among them); each bug a
killed mutant; the reference's traces legal; vLLM's real scheduler identical
to the reference and accepted by check-trace (sync and async)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from flightcheck.spec import Config, KvConnector
from flightcheck.spec.cadence_properties import cad1_deferred_call_carries_no_prefill
from flightcheck.spec.transitions import transition_properties_for
from flightcheck.spec import schedule
from flightcheck.verification.cadence_models import (CADENCE_K2, CADENCE_K2_ASYNC, CADENCE_MODELS, CADENCE_PRIO_K1_ASYNC,
                                                     CADENCE_PRIO_K2, cadence_mutant_model)
from flightcheck.verification.z3.encoding.crosscheck import reachable
from flightcheck.verification.explicit.search import search
from flightcheck.verification.mutants.registry import CADENCE_MUTANTS
from flightcheck.verification.traces.check import MalformedTrace, check_events
from flightcheck.vllm.differential import run_reference
from flightcheck.vllm.cadence_generate import cadence_workloads

pytestmark = pytest.mark.usefixtures("both_checkers")   # the reference's traces are checked

# --all-features workloads where the cadence met the priority policy (0.34.0,
# seed 21 index 46 sync: cache-aware order; seed 24 index 78 async: drafts):
# a call that defers prefills skips a running request's chunk, which PR3 took
# for a request the running loop wrongly passed over (a false rejection of
# vLLM's runs, and of the reference's).
CADENCE_DATA = Path(__file__).parent / "data" / "vllm" / "cadence"
PRIORITY_CADENCE = ["034_priority_cadence_seed21_46.workload.json",
                    "034_async_priority_drafts_cadence_seed24_78.workload.json"]

CADENCE = ("CAD1_deferred_call_carries_no_prefill", "CAD2_backed_up_queue_not_held",
           "CAD3_hold_restarts_after_prefill")


def test_off_by_default_and_refused_where_not_modelled():
    plain = Config(profile="vllm-0.34")
    assert plain.prefill_schedule_interval == 1
    assert not any(p.name in CADENCE for p in transition_properties_for(plain))
    assert [p.name for p in transition_properties_for(CADENCE_K2.cfg)][-3:] == list(CADENCE)
    assert not any(p.name in CADENCE for p in transition_properties_for(replace(CADENCE_K2.cfg, profile="vllm-0.8.5")))
    with pytest.raises(ValueError, match="prefill_schedule_interval must be >= 1"):
        Config(prefill_schedule_interval=0)
    assert Config(profile="vllm-0.34", prefill_schedule_interval=2,          # beside the connector too
                  kv_connector=KvConnector()).prefill_schedule_interval == 2


@pytest.mark.parametrize("model", [CADENCE_K2, CADENCE_K2_ASYNC], ids=lambda m: m.name)
def test_the_cadence_models_keep_every_property_and_reach_every_target(model):
    result = search(model)
    assert result.violations == []
    assert result.num_states == {"cadence-k2": 1334, "cadence-k2-async": 2556}[model.name]


@pytest.mark.parametrize("name", sorted(CADENCE_MUTANTS))
def test_each_cadence_bug_is_killed_by_its_property_at_its_shortest(name):
    mutant = CADENCE_MUTANTS[name]
    result = search(replace(cadence_mutant_model(name), mutant=name))
    killed = [v for v in result.violations if v.property == mutant.killed_by]
    assert killed and len(killed[0].path) == mutant.shortest, result.violations


def _taken_back_chunks(model) -> int:
    """Schedule steps of the model that take a running prefill chunk back out of their batch."""
    return sum(1 for s in reachable(model) if (scheduled := schedule(s, model.cfg))
               and any(s.requests[r].is_prefill_chunk for r in scheduled.taken_back))


@pytest.mark.parametrize("profile", sorted(CADENCE_MODELS))
def test_beside_priority_a_chunk_taken_back_still_restarts_the_hold_and_cad3_counts_it(profile):
    """vLLM 0.33/0.34 `Scheduler.schedule`: `prefill_scheduled` stays set when
    a priority preemption takes the chunk back out of the batch. The priority
    models of the cadence take a chunk back (not vacuous) and keep every
    property, CAD3 among them; the edit that reads only the final batch
    (`cadence_stamp_undone_by_hand_back`) breaks CAD3 under each profile."""
    (model,) = [m for m in CADENCE_MODELS[profile] if m.cfg.scheduling_policy == "priority"]
    assert model.name == (CADENCE_PRIO_K1_ASYNC if "async" in profile else CADENCE_PRIO_K2).name
    result = search(model)
    assert result.violations == [] and result.num_states == (137 if "async" in profile else 196)
    assert _taken_back_chunks(model) == (2 if "async" in profile else 1)
    mutated = search(model.with_mutant("cadence_stamp_undone_by_hand_back"))
    assert {v.property for v in mutated.violations} == {"CAD3_hold_restarts_after_prefill"}


def test_cad1_counts_a_chunk_taken_back_as_a_chunk_the_held_call_scheduled():
    """A held call may not schedule a running prefill chunk even if a
    priority preemption takes it back later in the call (vLLM's running
    loop skips it before any victim is chosen). The one step of
    cadence-prio-k2 that takes a chunk back, read as a held call, breaks
    CAD1, and would not without its `taken_back` (the batch left holds only
    a decode): CAD1 reads the hand-back, not just the final batch."""
    steps = [(s, scheduled) for s in reachable(CADENCE_PRIO_K2) if (scheduled := schedule(s, CADENCE_PRIO_K2.cfg))
             and any(s.requests[r].is_prefill_chunk for r in scheduled.taken_back)]
    assert len(steps) == 1
    state, scheduled = steps[0]
    held = replace(state, prefill_hold=1, prefill_capacity_bound=False)
    assert not cad1_deferred_call_carries_no_prefill(held, scheduled, CADENCE_PRIO_K2.cfg)
    assert cad1_deferred_call_carries_no_prefill(held, replace(scheduled, taken_back=()), CADENCE_PRIO_K2.cfg)


def test_under_fcfs_nothing_is_taken_back_and_the_hand_back_mutant_survives():
    """FCFS preempts the tail of `running`, never a request the call already
    scheduled: cadence-k2 takes nothing back, so the hand-back mutant is
    hunted on cadence-prio-k2, and the Z3 encoding (which refuses the
    priority policy beside the cadence) needs no taken-back record."""
    assert _taken_back_chunks(CADENCE_K2) == 0
    assert all(not scheduled.taken_back for s in reachable(CADENCE_K2) if (scheduled := schedule(s, CADENCE_K2.cfg)))
    assert search(CADENCE_K2.with_mutant("cadence_stamp_undone_by_hand_back")).violations == []


@pytest.mark.parametrize("profile", ["vllm-0.34", "vllm-0.34-async", "vllm-0.33", "vllm-0.33-async"])
def test_the_references_cadence_traces_are_legal_and_hold_prefills(profile):
    held = 0
    for workload in cadence_workloads(3, 10):
        run = run_reference(workload, profile)
        assert run.ending == "done" and run.events[0]["prefill_schedule_interval"] >= 2
        assert check_events(run.events).ok, workload["name"]
        plain = run_reference({**workload, "config": {**workload["config"], "prefill_schedule_interval": 1}},
                              profile)
        held += [e for e in run.events if e["ev"] == "schedule"] != [e for e in plain.events if e["ev"] == "schedule"]
    assert held >= 3                        # the cadence changed the batches of several (3 or 4 of 10)


def test_a_cadence_beside_a_connector_is_checked_not_refused():
    """The pair meets (docs/request-states.md, "Features together"): the
    config is read, not refused as it was while `Config` refused the pair."""
    events = [{"ev": "config", "num_stages": 2, "max_num_batched_tokens": 8, "block_size": 2, "num_blocks": 8,
               "max_model_len": 16, "vllm_version": "0.34.0", "prefill_schedule_interval": 2,
               "kv_connector": {"consumer": True, "producer": False}}, {"ev": "end"}]
    assert check_events(events).ok


@pytest.mark.parametrize("version", ["0.8.5", "0.8.4"])
def test_an_interval_under_a_version_without_the_cadence_is_refused_not_checked_as_absent(version):
    """0.8.x has no prefill cadence: checking such a trace as if prefill ran
    every step would reject a writer that held prefill, or pass one that did
    not, without a word; the config is refused, naming the knob."""
    events = [{"ev": "config", "num_stages": 2, "max_num_batched_tokens": 8, "block_size": 2, "num_blocks": 8,
               "max_model_len": 16, "vllm_version": version, "prefill_schedule_interval": 3}, {"ev": "end"}]
    with pytest.raises(MalformedTrace, match="^line 1: config event: prefill_schedule_interval: 3 under profile "
                                             "vllm-0.8.[45], which has no prefill cadence"):
        check_events(events)
    assert check_events([{**events[0], "prefill_schedule_interval": 1}, events[1]]).ok


@pytest.mark.parametrize("name", PRIORITY_CADENCE)
def test_a_chunk_the_cadence_holds_is_not_a_running_request_passed_over(name: str) -> None:
    raw = json.loads((CADENCE_DATA / name).read_text())
    profile = "vllm-0.34-async" if raw["config"].get("async_scheduling") else "vllm-0.34"
    assert raw["config"]["policy"] == "priority" and raw["config"]["prefill_schedule_interval"] > 1
    run = run_reference(raw, profile)
    assert run.ending == "done"
    assert check_events(run.events).ok


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_runs_of_priority_beside_the_cadence_are_accepted() -> None:
    if os.environ.get("FLIGHTCHECK_SKIP_VLLM"):
        pytest.skip("FLIGHTCHECK_SKIP_VLLM")
    from flightcheck.vllm.campaign import DISAGREEMENTS, run_version

    for name in PRIORITY_CADENCE:
        raw = json.loads((CADENCE_DATA / name).read_text())
        report = run_version("0.34.0", [raw], 0, False, lambda line: None, bool(raw["config"].get("async_scheduling")))
        assert not report.unexplained and not set(report.verdicts) & DISAGREEMENTS, dict(report.verdict_details)


# vLLM 0.33/0.34 `Scheduler.schedule`: r0 (low priority) runs a prefill chunk;
# r1's decode finds no block and the priority preemption takes r0's chunk
# back out of the batch; `prefill_scheduled` stays set, so the next call is
# held and r2 (two tokens) waits a call. The reference noted the chunk only
# from the final batch before (`_end_cadence`) and admitted r2 a call early:
# check-trace rejected its run (schedule_decision).
TAKEN_BACK = CADENCE_DATA / "cadence_priority_chunk_taken_back.workload.json"


def _batches(events) -> list[tuple[list[tuple[str, int, int]], list[str]]]:
    return [([(e["req"], e["start"], e["n"]) for e in ev["entries"]], ev["preempted"])
            for ev in events if ev["ev"] == "schedule" and "entries" in ev]


@pytest.mark.parametrize("profile", ["vllm-0.34", "vllm-0.34-async", "vllm-0.33", "vllm-0.33-async"])
def test_the_reference_holds_the_call_after_a_chunk_taken_back(profile):
    run = run_reference(json.loads(TAKEN_BACK.read_text()), profile)
    assert run.ending == "done" and check_events(run.events).ok
    batches = _batches(run.events)
    taken = next(i for i, (entries, preempted) in enumerate(batches) if preempted == ["r0"])
    assert batches[taken][0] == [("r1", 2, 1)]                  # r0's chunk taken back, r1 decodes
    assert batches[taken + 1][0] == [("r1", 3, 1)]              # held: r2 (two tokens, waiting) is not admitted
    assert batches[taken + 2][0][0] == ("r2", 0, 1)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
def test_vllm_holds_the_call_after_a_chunk_taken_back_as_the_reference_does(version: str) -> None:
    if os.environ.get("FLIGHTCHECK_SKIP_VLLM"):
        pytest.skip("FLIGHTCHECK_SKIP_VLLM")
    from flightcheck.vllm.campaign import DISAGREEMENTS, run_version

    raw = json.loads(TAKEN_BACK.read_text())
    for async_scheduling in (False, True):
        report = run_version(version, [raw], 0, False, lambda line: None, async_scheduling)
        assert report.identical == 1 and not report.unexplained, report.lines()
        assert not set(report.verdicts) & DISAGREEMENTS, dict(report.verdict_details)


def test_an_interval_below_one_is_a_malformed_trace():
    events = [{"ev": "config", "num_stages": 2, "max_num_batched_tokens": 8, "block_size": 2, "num_blocks": 8,
               "max_model_len": 16, "vllm_version": "0.34.0", "prefill_schedule_interval": 0}, {"ev": "end"}]
    with pytest.raises(MalformedTrace, match="prefill_schedule_interval"):
        check_events(events)


def _agree_with_vllm(version: str, async_scheduling: bool, count: int) -> None:
    if os.environ.get("FLIGHTCHECK_SKIP_VLLM"):
        pytest.skip("FLIGHTCHECK_SKIP_VLLM")
    from flightcheck.vllm.campaign import run_version

    workloads = cadence_workloads(5, count)
    report = run_version(version, workloads, 5, False, lambda line: None, async_scheduling)
    assert report.workloads == len(workloads) and report.unexplained == []
    assert report.identical == len(workloads)
    assert set(report.verdicts) == {"accepted, correct run"}


@pytest.mark.vllm
def test_cadence_workloads_agree_with_vllm_034_async() -> None:
    """Four cadence workloads through vLLM 0.34.0's AsyncScheduler:
    identical to the reference, check-trace's verdict its ground truth."""
    _agree_with_vllm("0.34.0", True, 4)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_cadence_workloads_agree_with_vllm(version: str, async_scheduling: bool) -> None:
    """Eight cadence workloads, each release and mode."""
    _agree_with_vllm(version, async_scheduling, 8)
