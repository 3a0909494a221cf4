"""Reset and pause beside the KV connector (docs/request-states.md,
"Features together"; vLLM 0.33.0 and 0.34.0 read alike): under PAUSED_NEW
the waiting loop takes `kv_holding_waiting` alone (a landed load is promoted
and runs, no load starts, nobody leaves `waiting`); a reset of the running
requests preempts them through `_free_request_blocks`, so under the step
fence a table with a batch in flight is put aside, and the cache reset then
fails (vLLM raises): RP4 flags it, the finding of
docs/vllm-kv-connector-findings.md. The pair's explicit models, the
reference's reading and (vLLM, slow) the campaign's workloads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from flightcheck.spec import (Arrive, CompleteOldest, Config, KvConnector, Pause, Prompt, ReceiveKv, Reset,
                              Schedule, SetPause, invariants_for, step, transition_properties_for)
from flightcheck.spec.state import Load, Status, initial_state
from flightcheck.verification.explicit.search import search
from flightcheck.verification.reset_pause_models import RESET_KV_ASYNC_K2, RESET_KV_SYNC_K1
from flightcheck.verification.traces.check import check_events
from flightcheck.verification.traces.reading import read_trace_file
from flightcheck.vllm.differential import run_reference
from flightcheck.vllm.features import registered
from flightcheck.vllm.generate import campaign_workloads

from .vllm_support import found_workload

pytestmark = pytest.mark.usefixtures("both_checkers")   # the campaign's check-trace runs (slow test)

# (states, edges, max depth) -- change only with a reviewed change of semantics.
# The connector's cache reset (`Reset(running, connector=True)`, beside the
# connector only) moved them from (639, 3137, 15) and (1137, 6073, 19).
PINNED = {"reset-kv-sync-k1": (1011, 6935, 16), "reset-kv-async-k2": (1548, 11317, 19)}
# Checked on every state and step of both models.
PROPERTIES = {"RP1_paused_schedules_nothing", "RP2_reset_drops_in_flight", "RP3_reset_output_never_applied",
              "RP4_prefix_cache_reset", "RP5_connector_reset_forgets_offers", "KV1_no_reuse_under_transfer", "KV2_loading_not_scheduled",
              "KV4_no_leak", "KV5_loaded_not_starved", "S9_kv_ownership", "L2_no_deadlock"}

LOAD, PLAIN = Prompt(2, 1, external_hit=2, load_async=True), Prompt(1, 1)


def _cfg(num_stages: int = 2) -> Config:
    return Config(num_stages=num_stages, max_num_batched_tokens=4, max_num_seqs=2, block_size=2, num_blocks=6,
                  max_model_len=8, prefix_caching=False, profile="vllm-0.34", reset_and_pause=True,
                  kv_connector=KvConnector())


def _run(cfg: Config, n: int, actions: list) -> list:
    state, states = initial_state(n, cfg.num_blocks), []
    for action in actions:
        nxt = step(state, cfg, action)
        assert nxt is not None, f"{action} is disabled"
        states.append((state, action, nxt))
        state = nxt
    return states


def _broken(before, action, after, cfg: Config) -> list[str]:
    return ([i.name for i in invariants_for(cfg) if not i.holds(after, cfg)]
            + [p.name for p in transition_properties_for(cfg) if not p.holds(before, after, action, cfg)])


def test_config_takes_the_pair_and_the_campaign_draws_it() -> None:
    _cfg()
    features = {f.name: f for f in registered()}
    assert "kv-connector" not in features["reset-pause"].excludes
    assert "reset-pause" not in features["kv-connector"].excludes
    for version in ("0.34.0", "0.33.0"):
        met = sum({"reset-pause", "kv-connector"} <= set(w["features"])
                  for w in campaign_workloads(1, 40, features_of=version))
        assert met >= 3, (version, met)


def test_paused_new_runs_a_landed_load_and_starts_no_load_nor_admits_waiting() -> None:
    """`schedule()`: `request_queue = self.kv_holding_waiting`, and only
    UNPAUSED does it go on to `_next_waiting_queue` (loads-only mode too)."""
    cfg = _cfg()
    steps = _run(cfg, 3, [Arrive(0, LOAD), Schedule(), SetPause(Pause.PAUSED_NEW), Arrive(1, PLAIN),
                          Arrive(2, LOAD), ReceiveKv(0), Schedule()])
    for before, action, after in steps:
        assert not _broken(before, action, after, cfg), action
    after = steps[-1][2]
    assert after.requests[0].status is Status.RUNNING and [e.req for e in after.in_flight[-1]] == [0]
    assert after.requests[1].status is Status.WAITING
    assert after.requests[2].status is Status.WAITING and after.requests[2].load is Load.NONE


def test_paused_all_leaves_a_landed_load_parked_and_kv5_holds() -> None:
    cfg = _cfg()
    steps = _run(cfg, 1, [Arrive(0, LOAD), Schedule(), CompleteOldest(()), ReceiveKv(0),
                          SetPause(Pause.PAUSED_ALL)])
    state = steps[-1][2]
    assert state.requests[0].status is Status.WAITING_FOR_REMOTE_KVS and state.requests[0].load is Load.RECEIVED
    assert not _broken(*steps[-1], cfg)
    scheduled = step(state, cfg, Schedule())
    assert scheduled is None or scheduled.requests[0].status is Status.WAITING_FOR_REMOTE_KVS


def test_a_reset_under_the_step_fence_puts_the_tables_aside_and_fails() -> None:
    """vLLM's `_preempt_request` frees through `_free_request_blocks`: with a
    batch of the request in flight under `defer_block_free`, its blocks go
    to `deferred_frees`, still held, so `BlockPool.reset_prefix_cache` fails
    and `reset_prefix_cache(reset_running_requests=True)` raises."""
    cfg = _cfg()
    assert cfg.fences_freed_blocks
    before, action, after = _run(cfg, 1, [Arrive(0, PLAIN), Schedule(), Reset(True)])[-1]
    assert after.requests[0].status is Status.PREEMPTED and not after.requests[0].block_table
    assert len(after.deferred_frees) == 1 and any(after.pool.ref_counts)
    assert _broken(before, action, after, cfg) == ["RP4_prefix_cache_reset"]
    sync = _cfg(num_stages=1)
    assert not sync.fences_freed_blocks                  # one batch in flight: freed at once, the reset works
    before, action, after = _run(sync, 1, [Arrive(0, PLAIN), Schedule(), Reset(True)])[-1]
    assert not after.deferred_frees and not any(after.pool.ref_counts) and not _broken(before, action, after, sync)


def test_a_reset_fails_while_a_load_is_parked() -> None:
    cfg = _cfg(num_stages=1)
    before, action, after = _run(cfg, 1, [Arrive(0, LOAD), Schedule(), Reset(True)])[-1]
    assert after.requests[0].status is Status.WAITING_FOR_REMOTE_KVS and after.requests[0].block_table
    assert _broken(before, action, after, cfg) == ["RP4_prefix_cache_reset"]


def test_the_sync_model_proves_every_property_of_both_features() -> None:
    names = ({i.name for i in invariants_for(RESET_KV_SYNC_K1.cfg)}
             | {p.name for p in transition_properties_for(RESET_KV_SYNC_K1.cfg)})
    assert PROPERTIES <= names, PROPERTIES - names
    r = search(RESET_KV_SYNC_K1)
    assert r.complete and not r.violations, [(v.property, len(v.path)) for v in r.violations]
    assert (r.num_states, r.num_edges, r.max_depth) == PINNED[RESET_KV_SYNC_K1.name]


def test_the_async_model_breaks_only_rp4_at_a_reset_beside_a_parked_load() -> None:
    r = search(RESET_KV_ASYNC_K2)
    assert r.complete and [(v.property, len(v.path)) for v in r.violations] == [("RP4_prefix_cache_reset", 3)]
    assert [type(a).__name__ for a, _ in r.violations[0].path] == ["Arrive", "Schedule", "Reset"]
    assert (r.num_states, r.num_edges, r.max_depth) == PINNED[RESET_KV_ASYNC_K2.name]


# --- the finding: a reset of the running requests under the step fence raises

DATA = Path(__file__).parent / "data" / "vllm" / "pairs"
FENCED = DATA / "kv-reset-fenced-free.workload.json"
# vLLM 0.34.0's traces of it (sync, two stages; async scheduling): r0 runs with
# a batch in flight, the reset preempts it, its table goes to `deferred_frees`,
# `reset_prefix_cache` returns False and the scheduler raises
FENCED_TRACES = ["034_kv_reset_fenced_free.jsonl", "034_async_kv_reset_fenced_free.jsonl"]


@pytest.mark.parametrize("profile", ["vllm-0.34", "vllm-0.34-async", "vllm-0.33", "vllm-0.33-async"])
def test_the_reference_raises_where_vllm_does_and_writes_the_reset_first(profile: str) -> None:
    run = run_reference(json.loads(FENCED.read_text()), profile)
    assert run.ending == "exception" and "RuntimeError" in run.exception
    assert {k: run.events[-1][k] for k in ("ev", "running", "preempted", "ok")} == \
        {"ev": "reset", "running": True, "preempted": ["r0"], "ok": False}
    one_stage = json.loads(FENCED.read_text())
    one_stage["config"]["num_stages"] = 1                # no fence under sync scheduling: the reset works
    if not profile.endswith("-async"):
        assert run_reference(one_stage, profile).ending == "done"


@pytest.mark.parametrize("name", FENCED_TRACES)
@pytest.mark.parametrize("full", [False, True])
def test_check_trace_rejects_vllms_failed_reset_under_the_fence_with_rp4(name: str, full: bool) -> None:
    result = check_events(read_trace_file(DATA / name), None, full=full)
    assert not result.ok and result.property == "RP4_prefix_cache_reset", (result.property, result.message)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_finding_vllm_raises_at_a_reset_under_the_step_fence(version: str, async_scheduling: bool,
                                                             tmp_path: Path) -> None:
    """vLLM 0.33.0 and 0.34.0: `_preempt_request` -> `_free_request_blocks`
    defers the table of a request with a batch in flight (`defer_block_free`:
    a consumer connector, `max_concurrent_batches > 1`), so
    `BlockPool.reset_prefix_cache` finds it held and `reset_prefix_cache`
    raises; with one stage and sync scheduling the same reset works."""
    if os.environ.get("FLIGHTCHECK_SKIP_VLLM"):
        pytest.skip("FLIGHTCHECK_SKIP_VLLM")
    from flightcheck.vllm import ASYNC_RECORDER
    from flightcheck.vllm.replay import ReplayWorker

    raw = json.loads(FENCED.read_text())
    if async_scheduling:
        raw["config"]["async_scheduling"] = True
    one_stage = json.loads(FENCED.read_text())
    one_stage["config"]["num_stages"] = 1
    trace = tmp_path / "trace.jsonl"
    with ReplayWorker(version) as worker:
        out = worker.replay(raw, trace=str(trace), scheduler_cls=ASYNC_RECORDER if async_scheduling else None)
        control = worker.replay(one_stage, trace=str(tmp_path / "control.jsonl"))
    assert out["ending"] == "exception" and "Failed to reset KV cache" in out["exception"]
    assert control["ending"] == "done"
    result = check_events(read_trace_file(trace), None, full=True)
    assert not result.ok and result.property == "RP4_prefix_cache_reset"


# campaign --all-features --versions 0.34.0,0.33.0 seed 1 (80 workloads): index 40
# resets beside a parked load (0.34.0), index 12 runs a landed load under PAUSED_NEW
# (0.33.0), index 11 fails a reset by a fenced free alone
FOUND = {"0.34.0": [(1, 40), (1, 11)], "0.33.0": [(1, 12), (1, 11)]}


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version", sorted(FOUND))
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_the_pairs_campaign_workloads_agree_with_vllm(version: str, async_scheduling: bool) -> None:
    if os.environ.get("FLIGHTCHECK_SKIP_VLLM"):
        pytest.skip("FLIGHTCHECK_SKIP_VLLM")
    from flightcheck.vllm.campaign import DISAGREEMENTS, run_version

    workloads = [found_workload(version, seed, index) for seed, index in FOUND[version]]
    assert all({"reset-pause", "kv-connector"} <= set(w["features"]) for w in workloads)
    report = run_version(version, workloads, 0, False, lambda line: None, async_scheduling)
    assert report.workloads == len(workloads) and report.unexplained == []
    assert not set(report.verdicts) & DISAGREEMENTS, dict(report.verdict_details)


def test_the_z3_encodings_keep_refusing_the_pairs_models() -> None:
    """The Z3 encodings leave every connector pair's explicit model to the
    explicit search: reset and pause's takes a consumer with one batch in
    flight only (its own model, z3/reset_pause_models.RP_KV_Z3), so it
    refuses reset-kv-async-k2's step fence, and the connector's encoding
    reset-kv-sync-k1's sync loads and prefix caching."""
    from flightcheck.verification.grammar_models import GRAMMAR_KV_MODELS
    from flightcheck.verification.lora_models import LORA_KV_MODELS
    from flightcheck.verification.z3.encoding.kv_state import refuse_unencoded_connector
    from flightcheck.verification.z3.encoding.reset_pause_state import refuse_unencoded_reset_pause
    from flightcheck.verification.z3.encoding.state import Layout
    from flightcheck.verification.z3.encoding.structured_output_state import refuse_unencoded_grammar

    with pytest.raises(ValueError, match="a KV connector that .* fences its frees"):
        refuse_unencoded_reset_pause(RESET_KV_ASYNC_K2)
    with pytest.raises(ValueError, match="synchronous loads or prefix caching beside reset and pause"):
        refuse_unencoded_connector(RESET_KV_SYNC_K1)
    for model in GRAMMAR_KV_MODELS:
        with pytest.raises(ValueError, match="a KV connector"):
            refuse_unencoded_grammar(model)
    for model in (RESET_KV_SYNC_K1, RESET_KV_ASYNC_K2, *GRAMMAR_KV_MODELS, *LORA_KV_MODELS):
        with pytest.raises(ValueError):
            Layout.of(model)
