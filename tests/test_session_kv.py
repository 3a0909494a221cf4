"""Streaming sessions beside the KV connector (docs/request-states.md,
"Features together"; vLLM 0.33.0 and 0.34.0 read alike): the connector's
waiting loop skips a session waiting for input
(`_handle_blocked_waiting_request`), counts its seat (`num_running` has
`num_waiting_for_streaming_input`: loads-only mode), and reserves nothing for
it beside an async load (`_inflight_prefill_reserved_blocks`); a session's
first turn promoted from its landed load is admitted with the load's table;
an input sent to a session whose finished request the connector still holds
is queued onto that request and never runs (vLLM's `add_request`: a finding,
docs/vllm-kv-connector-findings.md, finding 5). The pair's explicit models,
the skip's need, check-trace on vLLM's traces, and (vLLM, slow) the
campaign's workloads and the finding's minimal workload."""

from __future__ import annotations

import importlib
import json
import os
import types
from pathlib import Path

import pytest

from flightcheck.spec import (Arrive, CompleteOldest, Config, KvConnector, Prompt, ReceiveKv, Sample, Schedule,
                              SendInput)
from flightcheck.spec.state import Load, Status
from flightcheck.verification.explicit.search import search
from flightcheck.verification.session_models import SESSION_KV_K2, SESSION_KV_LIMIT_K2
from flightcheck.vllm.features import registered
from flightcheck.vllm.generate import campaign_workloads

from .fixtures import assert_model_proves, run_checked
from .vllm_support import drawn_before_clients_went_away

pytestmark = pytest.mark.usefixtures("both_checkers")   # check-trace runs on vLLM's traces

DATA = Path(__file__).parent / "data" / "vllm" / "pairs"

# (states, edges, max depth) -- change only with a reviewed change of semantics.
# session-kv-limit-k2: 586 states before a session's input was stamped into `arrivals` under FCFS
# beside the load limit too (spec/sessions.py `_stamp_input`, seed 322 index 39)
PINNED = {"session-kv-k2": (458, 1091, 14), "session-kv-limit-k2": (712, 1668, 14)}
PROPERTIES = {"SS1_old_output_never_bound", "SS2_old_turn_given_up", "SS3_waiting_session_holds_blocks",
              "SS4_waiting_session_keeps_seat", "KV1_no_reuse_under_transfer", "KV2_loading_not_scheduled",
              "KV3_rollback_restores_counters", "KV4_no_leak", "KV5_loaded_not_starved", "S9_kv_ownership",
              "L2_no_deadlock"}


def _session(prompt_len: int, max_tokens: int, *inputs: tuple[int, int], **kv: object) -> Prompt:
    return Prompt(prompt_len, max_tokens, session=inputs + ((0, 0),), **kv)   # type: ignore[arg-type]


def _run(cfg: Config, n: int, actions: list):
    return run_checked(cfg, n, actions)


def test_the_pair_is_no_longer_excluded_and_the_campaign_draws_it() -> None:
    features = {f.name: f for f in registered()}
    assert "kv-connector" not in features["streaming-sessions"].excludes
    assert "streaming-sessions" not in features["kv-connector"].excludes
    for version in ("0.34.0", "0.33.0"):
        met = sum({"streaming-sessions", "kv-connector"} <= set(w["features"])
                  for w in campaign_workloads(1, 40, features_of=version))
        assert met >= 5, (version, met)


def test_the_connector_loop_skips_a_session_waiting_for_input() -> None:
    """The session's first turn loads asynchronously, lands, runs one token
    and stops: it waits for input in `kv_holding_waiting` with its blocks,
    and the next schedule() admits the plain request beside it, not it
    (before: it ran it, S2)."""
    cfg = SESSION_KV_K2.cfg
    session, plain = SESSION_KV_K2.prompts
    state = _run(cfg, 2, [Arrive(0, session), Schedule(), CompleteOldest(), ReceiveKv(0), Schedule(),
                          CompleteOldest((Sample(),)), Arrive(1, plain), Schedule()])
    q = state.requests[0]
    assert q.status is Status.WAITING_FOR_STREAMING_REQ and q.load is Load.DONE
    assert state.kv_holding == (0,) and q.block_table and state.running == (1,)


def test_loads_only_mode_counts_the_seat_of_a_session_waiting_for_input() -> None:
    """One seat, held by the session waiting for input: the loop only starts
    the plain request's async load (vLLM 0.34 `loads_only`)."""
    cfg = SESSION_KV_LIMIT_K2.cfg
    session, load = SESSION_KV_LIMIT_K2.prompts
    state = _run(cfg, 2, [Arrive(0, session), Schedule(), CompleteOldest((Sample(),)), Arrive(1, load),
                          Schedule()])
    assert state.requests[0].status is Status.WAITING_FOR_STREAMING_REQ
    assert state.requests[1].status is Status.WAITING_FOR_REMOTE_KVS and state.running == ()


def test_a_session_takes_its_inputs_arrival_against_the_async_loads() -> None:
    """Under FCFS beside vLLM 0.34's load limit `_next_waiting_queue`
    compares arrival times, and `_update_request_as_session` gives the
    session its input's (`session.arrival_time = update.arrival_time`): the
    input is stamped into `arrivals` when sent and the session's first place
    goes when it takes it, behind the load that arrived before the input
    (campaign seed 322 index 39: tests/test_vllm_session_input_arrival_behind_a_load.py)."""
    cfg = SESSION_KV_LIMIT_K2.cfg
    session, load = SESSION_KV_LIMIT_K2.prompts
    before = [Arrive(0, session), Schedule(), CompleteOldest((Sample(),)), Arrive(1, load), Schedule()]
    assert _run(cfg, 2, before).arrivals == (0, 1)
    state = _run(cfg, 2, before + [SendInput(0)])
    assert state.requests[0].status is Status.WAITING and state.arrivals == (1, 0)


def test_a_session_between_turns_reserves_nothing_beside_an_async_load() -> None:
    """vLLM 0.34 reserves, beside an async load, the blocks of parked loads
    and of prefills in flight (`_inflight_prefill_reserved_blocks`), not of
    a session waiting for input in `kv_holding_waiting`: with one block
    free, the plain request's load of one block starts (the spec counted
    the session's missing block and kept the load waiting)."""
    cfg = Config(num_stages=2, max_num_batched_tokens=4, max_num_seqs=2, block_size=2, num_blocks=2,
                 max_model_len=4, prefix_caching=False, profile="vllm-0.34", streaming_sessions=True,
                 kv_connector=KvConnector())
    state = _run(cfg, 2, [Arrive(0, _session(2, 1, (1, 1))), Schedule(), CompleteOldest((Sample(),)),
                          Arrive(1, Prompt(2, 1, external_hit=2, load_async=True)), Schedule()])
    s, r = state.requests
    assert s.status is Status.WAITING_FOR_STREAMING_REQ and len(s.block_table) == 1 and s.num_tokens == 3
    assert r.status is Status.WAITING_FOR_REMOTE_KVS and r.load is Load.IN_FLIGHT


@pytest.mark.parametrize("model", [SESSION_KV_K2, pytest.param(SESSION_KV_LIMIT_K2, marks=pytest.mark.slow)],
                         ids=lambda m: m.name)
def test_the_pairs_models_prove_every_property_of_both_features(model) -> None:
    assert_model_proves(model, PROPERTIES, PINNED[model.name])


def test_without_the_skip_the_model_runs_a_session_waiting_for_input(monkeypatch: pytest.MonkeyPatch) -> None:
    schedule = importlib.import_module("flightcheck.spec.schedule")
    sessions = importlib.import_module("flightcheck.spec.sessions")
    skipless = types.SimpleNamespace(**{k: getattr(sessions, k) for k in dir(sessions) if not k.startswith("__")})
    skipless.waits_for_input = lambda state, r: False
    loop = schedule._schedule_waiting_with_connector
    monkeypatch.setattr(schedule, "_schedule_waiting_with_connector",
                        types.FunctionType(loop.__code__, {**loop.__globals__, "sessions": skipless}))
    r = search(SESSION_KV_K2, stop_at_first=True)
    first = r.violations[0]
    assert (first.property, len(first.path)) == ("S2_length_cap", 7)


def _check(path: Path, full: bool):
    from flightcheck.verification.traces.check import check_events
    from flightcheck.verification.traces.reading import read_trace_file
    from flightcheck.verification.traces.stream import check_lines

    result = check_events(read_trace_file(path), None, full=full)
    streamed = list(check_lines(path.read_text().splitlines()))[-1].result
    assert (streamed.ok, streamed.property) == (result.ok, result.property)
    return result


# vLLM 0.34.0's sync trace of campaign --all-features --versions 0.34.0,0.33.0 seed 3
# index 22 (0.33.0 the same): r3, a session, loads 14 tokens asynchronously; promoted,
# it is admitted with the load's 7 blocks listed first. check-trace counted that table
# twice, as a landed load's and as a session's kept table (a false S9_kv_ownership).
LANDED_FIRST_TURN = DATA / "034_session_kv_landed_first_turn_seed3_22.jsonl"
# vLLM 0.34.0's sync trace of the finding's workload (session_kv_input_lost.workload.json):
# r0's sync load fails from block 1, which r1, a session parked for its own async load,
# shares; the fail policy finishes r1 with an error while its load is in flight, so vLLM
# holds r1 in `requests`; r1's next input is queued onto it and never runs.
INPUT_LOST = DATA / "034_session_kv_input_lost.jsonl"
# vLLM 0.34.0's async trace of seed 5 index 78: the same failure, then the end of r2's
# session is queued onto its finished request (harmless; was a false illegal_transition).
END_ON_HELD = DATA / "034_async_session_kv_end_on_held_seed5_78.jsonl"


# vLLM 0.34.0's sync trace of campaign --all-features --reuse-ids --versions 0.34.0,0.33.0
# seed 12 index 13 (async the same): r2's async load lands, then r0's (a session's) sync
# load fails from a block r2 shares, before r2 is promoted; the fail policy finishes r2,
# whose load was reported (`finished_recving_kv_req_ids`), so `finish_requests` frees its
# table at once. The spec held it as if its report were still to come (spec/kv_reports.py
# `_fail_request`), and the session's next turn found no room: a false illegal_schedule.
LANDED_HOLDER_FAILED = DATA / "034_kv_fail_landed_holder_seed12_13.jsonl"


@pytest.mark.parametrize("full", [False, True])
def test_check_trace_frees_a_landed_holders_table_at_its_failure(full: bool) -> None:
    result = _check(LANDED_HOLDER_FAILED, full)
    assert result.ok, (result.property, result.message)


@pytest.mark.parametrize("full", [False, True])
def test_check_trace_accepts_a_sessions_first_turn_from_its_landed_load(full: bool) -> None:
    result = _check(LANDED_FIRST_TURN, full)
    assert result.ok, (result.property, result.message)


@pytest.mark.parametrize("full", [False, True])
def test_check_trace_accepts_the_end_of_a_session_queued_onto_its_held_request(full: bool) -> None:
    result = _check(END_ON_HELD, full)
    assert result.ok, (result.property, result.message)


@pytest.mark.parametrize("full", [False, True])
def test_check_trace_rejects_an_input_queued_onto_a_held_finished_session(full: bool) -> None:
    result = _check(INPUT_LOST, full)
    assert (result.ok, result.property) == (False, "illegal_transition")
    assert "never runs" in result.message


# campaign --all-features --versions 0.34.0,0.33.0 (no inputs during waits): the fixes'
# workloads, as that campaign drew them (sessions then met every connector workload;
# the same workload on both releases): seed 3 index 22 (sync: the landed first turn) and
# seed 5 index 78 (async: the end of a session queued onto its held request); and the
# generator's first workloads of seed 1 with the pair
KEPT = ["session_kv_landed_first_turn_seed3_22.workload.json", "session_kv_end_on_held_seed5_78.workload.json"]
FOUND = [(1, 0), (1, 4), (1, 8)]


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_the_pairs_campaign_workloads_agree_with_vllm(version: str, async_scheduling: bool) -> None:
    if os.environ.get("FLIGHTCHECK_SKIP_VLLM"):
        pytest.skip("FLIGHTCHECK_SKIP_VLLM")
    from flightcheck.vllm.campaign import DISAGREEMENTS, run_version

    workloads = [json.loads((DATA / name).read_text()) for name in KEPT]
    workloads += [drawn_before_clients_went_away(seed, index + 1, features_of=version)[index] for seed, index in FOUND]
    assert all({"streaming-sessions", "kv-connector"} <= set(w["features"]) for w in workloads)
    report = run_version(version, workloads, 0, False, lambda line: None, async_scheduling)
    assert report.workloads == len(workloads) and report.unexplained == []
    assert not set(report.verdicts) & DISAGREEMENTS, dict(report.verdict_details)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
def test_finding_a_sessions_input_is_queued_onto_its_held_finished_request(version: str) -> None:
    """docs/vllm-kv-connector-findings.md, finding 5, on both releases (two
    stages, sync): the ground truth names the lost input, the reference
    does as vLLM, and check-trace rejects the trace."""
    if os.environ.get("FLIGHTCHECK_SKIP_VLLM"):
        pytest.skip("FLIGHTCHECK_SKIP_VLLM")
    from flightcheck.vllm.campaign import run_version

    workload = json.loads((DATA / "session_kv_input_lost.workload.json").read_text())
    report = run_version(version, [workload], 0, False, lambda line: None, False)
    assert report.unexplained == []
    (verdict,) = report.verdict_details
    assert "queued onto its finished request" in verdict and verdict.endswith("rejected, illegal_transition")
