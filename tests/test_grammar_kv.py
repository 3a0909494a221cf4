"""Structured output beside the KV connector (docs/request-states.md,
"Features together"; vLLM 0.33.0 and 0.34.0 read alike): the waiting loop
calls `_handle_blocked_waiting_request` before `get_num_new_matched_tokens`,
so a request whose grammar compiles is skipped without asking the
connector, and one whose grammar failed is recorded and never loads; once
compiled it loads (sync or async) as any request, and its first sampled
token is masked at the FSM as it stands. The pair's explicit models, the
gate's need, and (vLLM, slow) the campaign's workloads."""

from __future__ import annotations

import importlib
import os
import types
from pathlib import Path

import pytest

from flightcheck.spec import (Arrive, CompleteOldest, Config, KvConnector, Prompt, Sample, Schedule)
from flightcheck.spec.state import Grammar, Load, Status
from flightcheck.spec.transitions import CompileGrammar, FailGrammar
from flightcheck.verification.explicit.search import search
from flightcheck.verification.grammar_models import GRAMMAR_KV_K2, GRAMMAR_KV_LIMIT_K2
from flightcheck.vllm.features import registered
from flightcheck.vllm.generate import campaign_workloads

from .fixtures import assert_model_proves, run_checked
from .vllm_support import found_workload

pytestmark = pytest.mark.usefixtures("both_checkers")   # the campaign's check-trace runs (slow test)

# (states, edges, max depth) -- change only with a reviewed change of semantics.
PINNED = {"grammar-kv-limit-k2": (347, 674, 13), "grammar-kv-k2": (639, 1312, 16)}
PROPERTIES = {"G1_no_run_while_compiling", "G2_fsm_tracks_output", "G3_fsm_never_refuses",
              "KV1_no_reuse_under_transfer", "KV2_loading_not_scheduled", "KV4_no_leak",
              "KV5_loaded_not_starved", "S9_kv_ownership", "L2_no_deadlock"}

LOAD = Prompt(2, 1, external_hit=2, load_async=True, structured=True)


def _cfg() -> Config:
    return Config(num_stages=2, max_num_batched_tokens=4, max_num_seqs=2, block_size=2, num_blocks=6,
                  max_model_len=8, prefix_caching=False, profile="vllm-0.34", structured_output=True,
                  kv_connector=KvConnector())


def _run(cfg: Config, n: int, actions: list):
    return run_checked(cfg, n, actions)


def test_config_takes_the_pair_and_the_campaign_draws_it() -> None:
    _cfg()
    features = {f.name: f for f in registered()}
    assert "kv-connector" not in features["grammar"].excludes
    assert "grammar" not in features["kv-connector"].excludes
    for version in ("0.34.0", "0.33.0"):
        met = sum({"grammar", "kv-connector"} <= set(w["features"])
                  for w in campaign_workloads(1, 40, features_of=version))
        assert met >= 3, (version, met)


def test_a_compiling_grammar_is_skipped_before_the_connector_is_asked() -> None:
    cfg = _cfg()
    state = _run(cfg, 1, [Arrive(0, LOAD), Schedule()])
    q = state.requests[0]
    assert q.status is Status.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR and q.load is Load.NONE and not q.block_table
    state = _run(cfg, 1, [Arrive(0, LOAD), Schedule(), CompileGrammar(0), Schedule()])
    q = state.requests[0]
    assert q.status is Status.WAITING_FOR_REMOTE_KVS and q.load is Load.IN_FLIGHT and q.grammar is Grammar.READY


def test_a_failed_grammar_never_loads_and_finishes_with_an_error() -> None:
    cfg = _cfg()
    state = _run(cfg, 2, [Arrive(0, LOAD), Arrive(1, Prompt(1, 1)), FailGrammar(0), Schedule()])
    assert state.grammar_errors == {0} and state.requests[0].load is Load.NONE
    state = _run(cfg, 2, [Arrive(0, LOAD), Arrive(1, Prompt(1, 1)), FailGrammar(0), Schedule(),
                          CompleteOldest((Sample(),))])
    q = state.requests[0]
    assert q.status is Status.FINISHED_ERROR and not q.block_table and not q.held


def test_loads_only_mode_parks_a_compiled_grammar_from_async_kv_waiting() -> None:
    """vLLM 0.34 `_enqueue_waiting_request` puts a request the connector may
    load asynchronously into `async_kv_waiting` at arrival, its grammar
    compiling or not; with the seat taken, loads-only mode reads that queue,
    promotes the compiled grammar (`_handle_blocked_waiting_request`) and
    starts its load (campaign --all-features seed 31 index 68, 0.34.0: the
    spec and the reference kept it out of the queue until it was WAITING)."""
    cfg = GRAMMAR_KV_LIMIT_K2.cfg
    load, plain = GRAMMAR_KV_LIMIT_K2.prompts
    state = _run(cfg, 2, [Arrive(1, plain), Arrive(0, load), Schedule()])
    assert state.running == (1,) and state.requests[0].status is Status.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
    state = _run(cfg, 2, [Arrive(1, plain), Arrive(0, load), Schedule(), CompileGrammar(0), Schedule()])
    assert state.requests[0].status is Status.WAITING_FOR_REMOTE_KVS and state.running == (1,)


def _gateless_connector_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The connector's waiting loop without its grammar test (the spec
    before this pair met)."""
    schedule = importlib.import_module("flightcheck.spec.schedule")
    grammar = importlib.import_module("flightcheck.spec.grammar")
    gateless = types.SimpleNamespace(**{k: getattr(grammar, k) for k in dir(grammar) if not k.startswith("__")})
    gateless.blocked_on_grammar = lambda state, r: (state, False)
    loop = schedule._schedule_waiting_with_connector
    monkeypatch.setattr(schedule, "_schedule_waiting_with_connector",
                        types.FunctionType(loop.__code__, {**loop.__globals__, "grammar": gateless}))


@pytest.mark.parametrize("model", [GRAMMAR_KV_LIMIT_K2, pytest.param(GRAMMAR_KV_K2, marks=pytest.mark.slow)],
                         ids=lambda m: m.name)
def test_the_pairs_models_prove_every_property_of_both_features(model) -> None:
    assert_model_proves(model, PROPERTIES, PINNED[model.name])


def test_without_the_gate_the_model_runs_a_compiling_grammar(monkeypatch: pytest.MonkeyPatch) -> None:
    _gateless_connector_loop(monkeypatch)
    r = search(GRAMMAR_KV_LIMIT_K2, stop_at_first=True)
    first = r.violations[0]
    assert (first.property, [type(a).__name__ for a, _ in first.path]) == ("G1_no_run_while_compiling",
                                                                          ["Arrive", "Schedule"])


# campaign --all-features --versions 0.34.0,0.33.0: seed 31 index 68 on 0.34.0 (a
# structured request's async load started in loads-only mode: the fix above), seed 33
# index 27 (a running load's own failure after a holder's cut: below), and the
# first workloads of seed 1 with the pair on each release
FOUND = {"0.34.0": [(31, 68), (33, 27), (1, 8), (1, 65)], "0.33.0": [(33, 27), (1, 8), (1, 40), (1, 65)]}


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version", sorted(FOUND))
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_the_pairs_campaign_workloads_agree_with_vllm(version: str, async_scheduling: bool) -> None:
    if os.environ.get("FLIGHTCHECK_SKIP_VLLM"):
        pytest.skip("FLIGHTCHECK_SKIP_VLLM")
    from flightcheck.vllm.campaign import DISAGREEMENTS, run_version

    workloads = [found_workload(version, seed, index) for seed, index in FOUND[version]]
    assert all({"grammar", "kv-connector"} <= set(w["features"]) for w in workloads)
    report = run_version(version, workloads, 0, False, lambda line: None, async_scheduling)
    assert report.workloads == len(workloads) and report.unexplained == []
    assert not set(report.verdicts) & DISAGREEMENTS, dict(report.verdict_details)


# vLLM 0.34.0's sync trace of campaign --all-features --versions 0.34.0,0.33.0 seed 33
# index 27 (grammar + kv-connector; 0.33.0 the same). r4's failed load rolls r1 back as a
# holder of its blocks while r1's own sync load is in flight; r1 prefills again past its
# load's blocks, then its own failure arrives and vLLM cuts it again
# (`_update_requests_with_invalid_blocks` over `running`). check-trace took the report for
# a contract breach (a false C2_reports_own_blocks) until it cut the request again
# (verification/traces/connector.py `_cut_running_load_again`). The grammars only shift
# the timing (r1 has none; without them the run differs; without the pause it is the same).
SECOND_CUT = Path(__file__).parent / "data" / "vllm" / "pairs" / "034_grammar_kv_second_cut_seed33_27.jsonl"


@pytest.mark.parametrize("full", [False, True])
def test_check_trace_accepts_a_running_loads_own_failure_after_a_holders_cut(full: bool) -> None:
    from flightcheck.verification.traces.check import check_events
    from flightcheck.verification.traces.reading import read_trace_file
    from flightcheck.verification.traces.stream import check_lines

    result = check_events(read_trace_file(SECOND_CUT), None, full=full)
    assert result.ok, (result.property, result.message)
    assert list(check_lines(SECOND_CUT.read_text().splitlines()))[-1].result.ok
