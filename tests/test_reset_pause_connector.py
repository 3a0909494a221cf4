"""The KV connector's own cache reset, `reset_prefix_cache(reset_connector=True)`
(vLLM 0.33.0 and 0.34.0 `Scheduler.reset_prefix_cache` -> `reset_connector_cache`
-> `KVConnectorBase_V1.reset_cache`, after the block pool's reset), through
every layer: the workload's event, the fabricated connector's ledger, the
spec's `Reset(running, connector)` and RP5, the reference, check-trace, the
generator, and (vLLM, slow) the replay against the reference and check-trace."""

from __future__ import annotations

import copy
import json
import os
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from flightcheck.spec import (Arrive, CompleteOldest, Config, KvConnector, Prompt, Reset, Schedule, step,
                              transition_properties_for)
from flightcheck.spec import reset_pause
from flightcheck.spec.kv_loads import may_load_async
from flightcheck.spec.state import Load, Status, initial_state
from flightcheck.verification.explicit.search import actions, search
from flightcheck.verification.reset_pause_models import RESET_KV_SYNC_K1, RESET_PAUSE_K2
from flightcheck.verification.traces.check import check_events
from flightcheck.vllm.differential import run_reference
from flightcheck.vllm.generate import campaign_workloads
from flightcheck.vllm.kv_transfers import KVTransfers
from flightcheck.vllm.kv_workload import KVConnectorConfig, KVRequestSpec
from flightcheck.vllm.workload import WorkloadError, workload_from_json

WORKLOAD_FILE = Path(__file__).parent / "data" / "vllm" / "pairs" / "kv-connector-reset.workload.json"
PROFILES = ["vllm-0.34", "vllm-0.34-async", "vllm-0.33", "vllm-0.33-async"]

pytestmark = pytest.mark.usefixtures("both_checkers")   # the reference's traces are checked


def _workload() -> dict:
    return json.loads(WORKLOAD_FILE.read_text())


# --- the workload's event


def test_a_reset_event_reads_connector_false_unless_given_and_refuses_a_bad_one() -> None:
    base = _workload()
    events = workload_from_json(base).events
    assert [(e.reset_running, e.reset_connector) for e in events] == [(False, True)]
    plain = {**base, "events": [{"step": 1, "reset": {"running": True}}]}
    assert workload_from_json(plain).events[0].reset_connector is False
    for bad in ({"running": True, "connector": 1}, {"connector": "yes"}, {"running": True, "cache": True}):
        with pytest.raises(WorkloadError, match=r"events\[0\]\.reset"):
            workload_from_json({**base, "events": [{"step": 1, "reset": bad}]})


def test_call_event_hands_reset_connector_to_the_scheduler() -> None:
    from flightcheck.vllm.reset_pause_workload import WorkloadEvent, call_event

    calls: list[dict] = []
    scheduler = SimpleNamespace(reset_prefix_cache=lambda **kw: calls.append(kw))
    call_event(scheduler, WorkloadEvent(3, reset_running=True, reset_connector=True))
    call_event(scheduler, WorkloadEvent(4, reset_running=False))
    assert calls == [{"reset_running_requests": True, "reset_connector": True},
                     {"reset_running_requests": False, "reset_connector": False}]


# --- the fabricated connector's ledger (kv_transfers.py; no vLLM needed)


def test_the_ledger_forgets_unserved_offers_and_keeps_later_ones_and_started_loads() -> None:
    transfers = KVTransfers(KVConnectorConfig(consumer=True), block_size=4)
    loaded, waiting = SimpleNamespace(request_id="a", num_tokens=16), SimpleNamespace(request_id="b", num_tokens=12)
    transfers.bind("a", KVRequestSpec(hit=12, load_async=True, load_steps=2))
    transfers.bind("b", KVRequestSpec(hit=8, load_async=True))
    assert transfers.offer(loaded, 0) == (12, True)
    transfers.allocated(loaded, [0, 1, 2, 3], 12)                  # a's load starts: due at update 2
    assert transfers.reset_cache() is True
    assert transfers.offer(waiting, 0) == (0, False) and not transfers.may_load_async(waiting)
    later = SimpleNamespace(request_id="c", num_tokens=10)
    transfers.bind("c", KVRequestSpec(hit=8))                      # added after the reset: the store refilled
    assert transfers.offer(later, 0) == (8, False)
    assert transfers.report([]).finished_recving == set()
    assert transfers.report([]).finished_recving == {"a"}          # a's load lands as scheduled
    transfers.bind("b", KVRequestSpec(hit=8, load_async=True), fresh=False)   # a session's next input: same Request
    assert transfers.offer(waiting, 0) == (0, False)
    transfers.bind("b", KVRequestSpec(hit=8, load_async=True))     # a new request under b's id: its own offer
    assert transfers.offer(SimpleNamespace(request_id="b", num_tokens=12), 0) == (8, True)


# --- the spec's action


SYNC, ASYNC = Prompt(5, 1, external_hit=4), Prompt(4, 1, external_hit=4, load_async=True)


def _cfg(**knobs) -> Config:
    fields = dict(num_stages=1, max_num_batched_tokens=8, max_num_seqs=2, block_size=2, num_blocks=8,
                  max_model_len=12, prefix_caching=False, profile="vllm-0.34", reset_and_pause=True,
                  kv_connector=KvConnector())
    return Config(**{**fields, **knobs})


def _run(cfg: Config, n: int, actions_: list):
    state = initial_state(n, cfg.num_blocks)
    for action in actions_:
        nxt = step(state, cfg, action)
        assert nxt is not None, f"{action} is disabled"
        state = nxt
    return state


def test_a_connector_reset_forgets_unserved_offers_and_a_later_arrival_keeps_its_own() -> None:
    cfg = _cfg()
    parked = [Arrive(0, ASYNC), Schedule(), CompleteOldest(())]        # a parks (an empty batch completes)
    state = _run(cfg, 3, parked + [Arrive(1, SYNC), Reset(False, True), Arrive(2, SYNC)])
    a, b, c = state.requests
    assert a.load is Load.IN_FLIGHT and a.external_hit == 4 and not a.offer_reset   # started: lands as scheduled
    assert b.external_hit == 0 and b.offer_reset and b.load is Load.NONE
    assert c.external_hit == 4 and not c.offer_reset
    after = _run(cfg, 3, parked + [Arrive(1, SYNC), Reset(False, True), Arrive(2, SYNC), Schedule()])
    entries = {e.req: e for e in after.in_flight[-1]}
    assert entries[1].start == 0 and entries[1].external == 0       # b computes its prompt itself
    assert entries[2].start == 4 and entries[2].external == 4       # c loads its hit
    assert str(Reset(False, True)) == "reset prefix cache and the connector's cache"


def test_without_the_flag_or_without_a_connector_nothing_is_forgotten() -> None:
    cfg = _cfg()
    kept = _run(cfg, 1, [Arrive(0, SYNC), Reset(False)])
    assert kept.requests[0].external_hit == 4 and not kept.requests[0].offer_reset
    plain = _cfg(kv_connector=None)
    arrived = _run(plain, 1, [Arrive(0, Prompt(5, 1))])
    assert step(arrived, plain, Reset(False, True)) == step(arrived, plain, Reset(False))   # a no-op success


def test_a_reset_that_raises_never_reaches_the_connector() -> None:
    """`reset_prefix_cache(reset_running_requests=True)` raises when the pool's
    reset fails, before `reset_connector_cache`: the offers stay (a parked load
    holds blocks here)."""
    cfg = _cfg()
    state = _run(cfg, 2, [Arrive(0, ASYNC), Schedule(), Arrive(1, SYNC), Reset(True, True)])
    assert any(state.pool.ref_counts) and state.requests[1].external_hit == 4
    assert not state.requests[1].offer_reset


def test_under_the_load_limit_a_forgotten_request_keeps_its_place_in_async_kv_waiting() -> None:
    """vLLM 0.34 asks `may_load_async` when it enqueues a request
    (`_enqueue_waiting_request`): a later reset leaves it in
    `async_kv_waiting`, where the loop meets it and is offered nothing."""
    cfg = _cfg(kv_connector=KvConnector(max_inflight_loads=1))
    state = _run(cfg, 2, [Arrive(0, ASYNC), Arrive(1, ASYNC), Schedule(), CompleteOldest(()), Reset(False, True)])
    assert state.requests[0].load is Load.IN_FLIGHT and state.requests[1].offer_reset
    assert may_load_async(state, cfg, 1)
    after = _run(cfg, 2, [Arrive(0, ASYNC), Arrive(1, ASYNC), Schedule(), CompleteOldest(()), Reset(False, True),
                          Schedule()])
    assert after.requests[1].status is Status.RUNNING and after.requests[1].load is Load.DONE
    assert [(e.req, e.start, e.external) for e in after.in_flight[-1]] == [(1, 0, 0)]


def test_rp5_is_checked_beside_a_connector_only_and_holds_on_the_actions() -> None:
    names = [p.name for p in transition_properties_for(_cfg())]
    assert "RP5_connector_reset_forgets_offers" in names
    assert "RP5_connector_reset_forgets_offers" not in [p.name for p in transition_properties_for(
        _cfg(kv_connector=None))]
    from flightcheck.verification.results import kind_of

    assert kind_of("RP5_connector_reset_forgets_offers") == "invariant"     # the verify table's kind
    rp5 = next(p for p in transition_properties_for(_cfg()) if p.name == "RP5_connector_reset_forgets_offers")
    cfg = _cfg()
    before = _run(cfg, 2, [Arrive(0, SYNC), Reset(False, True), Arrive(1, ASYNC)])
    after = step(before, cfg, Schedule())
    assert rp5.holds(before, after, Schedule(), cfg)
    assert after.requests[0].status is Status.RUNNING and after.requests[1].load is Load.IN_FLIGHT


def test_the_explicit_search_offers_the_choice_only_beside_a_connector() -> None:
    state = _run(RESET_KV_SYNC_K1.cfg, 2, [Arrive(0, RESET_KV_SYNC_K1.prompts[0])])
    resets = [a for a in actions(RESET_KV_SYNC_K1, state) if isinstance(a, Reset)]
    assert sorted((a.running, a.connector) for a in resets) == [(False, False), (False, True), (True, False),
                                                                (True, True)]
    plain = initial_state(2, RESET_PAUSE_K2.cfg.num_blocks)
    assert all(not a.connector for a in actions(RESET_PAUSE_K2, plain) if isinstance(a, Reset))


def test_a_spec_that_keeps_a_forgotten_offer_breaks_rp5_in_the_search(monkeypatch: pytest.MonkeyPatch) -> None:
    """RP5 is not vacuous: a connector reset that marks the offers but keeps
    them (the request then loads what the connector no longer holds) is
    found by the explicit search on the pair's sync model."""
    def marks_but_keeps(state):
        for r, q in enumerate(state.requests):
            if q.status.is_active and q.load is Load.NONE and q.external_hit > 0:
                state = state.with_request(r, offer_reset=True)
        return state

    monkeypatch.setattr(reset_pause, "_forget_offers", marks_but_keeps)
    found = search(RESET_KV_SYNC_K1)
    assert [v.property for v in found.violations] == ["RP5_connector_reset_forgets_offers"]
    assert [type(a).__name__ for a, _ in found.violations[0].path] == ["Arrive", "Reset", "Schedule"]


# --- the reference and check-trace


@pytest.mark.parametrize("profile", PROFILES)
def test_the_reference_forgets_as_the_spec_and_its_trace_is_legal(profile: str) -> None:
    run = run_reference(_workload(), profile)
    assert run.ending == "done"
    reset = next(e for e in run.events if e["ev"] == "reset")
    assert reset["connector"] is True and reset["ok"] is False        # a's parked load holds blocks
    first = {}
    for event in run.events:
        for entry in event.get("entries", ()) if event["ev"] == "schedule" else ():
            first.setdefault(entry["req"], entry)
    assert first["c"]["start"] == 0 and first["c"]["external"] == 0    # added before the reset: forgotten
    assert first["d"]["start"] == 8 and first["d"]["external"] == 8    # added after it: its own offer
    if profile.startswith("vllm-0.34"):                                # b waited in async_kv_waiting (limit 1)
        assert first["b"]["start"] == 0 and first["b"]["external"] == 0
    assert check_events(run.events).ok
    unflagged = [{k: v for k, v in e.items() if k != "connector"} if e["ev"] == "reset" else e
                 for e in copy.deepcopy(run.events)]
    assert not check_events(unflagged).ok           # an old trace's reset without the key: the offers kept


def test_the_reference_writes_connector_false_for_a_plain_reset() -> None:
    raw = _workload()
    raw["events"] = [{"step": 1, "reset": {"running": False}}]
    run = run_reference(raw, "vllm-0.34")
    assert next(e for e in run.events if e["ev"] == "reset")["connector"] is False
    assert check_events(run.events).ok


# --- the generator


def test_the_generator_draws_connector_resets_only_beside_a_connector() -> None:
    for version in ("0.34.0", "0.33.0"):
        workloads = campaign_workloads(1, 80, features_of=version)
        resets = [(w, e) for w in workloads for e in w.get("events", ()) if "reset" in e]
        flagged = [(w, e) for w, e in resets if e["reset"].get("connector")]
        assert flagged and len(flagged) < len(resets)
        assert all("kv_connector" in w["config"] for w, _ in flagged)
        assert all(e["reset"]["connector"] is True for _, e in flagged)    # written only when drawn


def test_the_connector_draw_leaves_every_other_draw_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    from flightcheck.vllm import reset_pause_generate

    with_draw = campaign_workloads(1, 40, features_of="0.34.0")
    monkeypatch.setattr(reset_pause_generate, "CONNECTOR_RESET_SHARE", 0.0)
    without = campaign_workloads(1, 40, features_of="0.34.0")
    for w in with_draw:
        for event in w.get("events", ()):
            event.get("reset", {}).pop("connector", None)
    assert with_draw == without


# --- vLLM (slow)


def _connector_reset_workload(version: str) -> dict:
    """The first generated --all-features workload of seed 1 with a connector reset."""
    return next(w for w in campaign_workloads(1, 80, features_of=version)
                if any(e.get("reset", {}).get("connector") for e in w.get("events", ())))


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_vllm_034_agrees_on_connector_resets(async_scheduling: bool) -> None:
    """vLLM 0.34.0 replays a generated workload with a connector reset and the
    hand-written one: identical to the reference, check-trace legal."""
    if os.environ.get("FLIGHTCHECK_SKIP_VLLM"):
        pytest.skip("FLIGHTCHECK_SKIP_VLLM")
    from flightcheck.vllm.campaign import run_version

    workloads = [_connector_reset_workload("0.34.0"), _workload(), _session_input_after_the_reset()]
    report = run_version("0.34.0", workloads, 0, False, lambda line: None, async_scheduling)
    assert report.workloads == 3 and report.unexplained == []
    # under async scheduling the session's failed load meets vLLM's known rollback bug (PR #49250), explained
    deviating = {name for names in report.deviation_workloads.values() for name in names}
    assert deviating <= ({"diff-all-0.34.0-4-11"} if async_scheduling else set()), dict(report.deviations)
    assert set(report.deviations) <= {"kv_rollback_keeps_placeholders_pr49250"}
    assert report.identical == 3 - len(deviating), dict(report.verdict_details)
    assert report.verdicts["accepted, correct run"] == 3 - len(deviating)
    assert set(report.verdicts) <= {"accepted, correct run", "rejected, real bug"}     # no false verdict


def _session_input_after_the_reset() -> dict:
    """--all-features seed 4 index 11 (0.34.0): the streaming session r0 waits
    (its grammar compiles, then PAUSED_ALL) when the connector's cache is
    reset at step 17, and its next input comes at step 18, before its first
    admission. The input is merged into the same Request, whose offer stays
    forgotten; the fabricated connector had taken the input's bind for a new
    request and offered r0 its load again (check-trace's false schedule_decision,
    an unexplained differential)."""
    workload = campaign_workloads(4, 12, features_of="0.34.0")[11]
    assert {"streaming-sessions", "kv-connector", "reset-pause"} <= set(workload["features"])
    assert {"step": 17, "reset": {"running": False, "connector": True}} in workload["events"]
    return workload
