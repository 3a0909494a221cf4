"""Streaming sessions beside other features (docs/request-states.md,
"Features together"): a structured session's turns in the spec (its grammar
and FSM across `_update_request_as_session`), proved on a small model under
every profile that has both; and, on vLLM's real scheduler (slow), the
campaign workloads where the pair's fixes were found."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from flightcheck.spec import (Arrive, CompleteOldest, Config, Pause, Prompt, Reset, Sample, Schedule, SendInput,
                              SetPause, State, Status, initial_state, invariants_for, step, transition_properties_for)
from flightcheck.spec.state import Grammar
from flightcheck.spec.transitions import CompileGrammar
from flightcheck.verification.explicit.search import search
from flightcheck.verification.models import Model
from flightcheck.verification.traces.check import check_events
from flightcheck.verification.traces.reading import read_trace_file
from flightcheck.verification.traces.stream import check_lines
from flightcheck.vllm.differential import run_reference
from flightcheck.vllm.features import registered
from flightcheck.vllm.generate import campaign_workloads

from .vllm_support import drawn_before_clients_went_away

DATA = Path(__file__).parent / "data" / "vllm" / "pairs"


def _cfg(profile: str) -> Config:
    return Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=1, block_size=2, num_blocks=4,
                  max_model_len=8, prefix_caching=False, profile=profile, streaming_sessions=True,
                  structured_output=True)


STRUCTURED_SESSION = Prompt(2, 2, structured=True, session=((1, 2), (0, 0)))


def _run(cfg: Config, prompts: tuple[Prompt, ...], actions: list) -> list[State]:
    """The states after each action, every invariant and transition property checked on the way."""
    state, states = initial_state(len(prompts), cfg.num_blocks), []
    for action in actions:
        nxt = step(state, cfg, action)
        assert nxt is not None, f"{action} is disabled"
        broken = [i.name for i in invariants_for(cfg) if not i.holds(nxt, cfg)]
        broken += [p.name for p in transition_properties_for(cfg) if not p.holds(state, nxt, action, cfg)]
        assert not broken, f"{action}: {broken}"
        state = nxt
        states.append(state)
    return states


@pytest.mark.parametrize("profile", ["vllm-0.34", "vllm-0.34-async", "vllm-0.33", "vllm-0.33-async"])
def test_a_structured_sessions_next_turn_keeps_its_grammar_and_counts_its_fsm_from_the_turns_start(profile: str):
    cfg = _cfg(profile)
    states = _run(cfg, (STRUCTURED_SESSION,), [
        Arrive(0, STRUCTURED_SESSION), CompileGrammar(0),
        Schedule(), CompleteOldest((Sample(stop_at=0),)),     # the prefill's token is a stop: turn 0 ends
        SendInput(0),                                         # turn 1: the kept outputs join the prompt
        Schedule(), CompleteOldest((Sample(),))])
    stopped, resumed, after = states[3], states[4], states[-1]
    assert stopped.requests[0].status is Status.WAITING_FOR_STREAMING_REQ and stopped.requests[0].fsm == 1
    # the grammar stays compiled (no second WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR), the FSM counts from 0
    q = resumed.requests[0]
    assert (q.status, q.grammar, q.num_output, q.fsm) == (Status.WAITING, Grammar.READY, 0, 0)
    assert after.requests[0].grammar is Grammar.READY and after.requests[0].fsm == after.requests[0].num_output == 1


def test_a_token_the_fsm_refuses_ends_the_session_instead_of_parking_it():
    """vLLM `update_from_output`: a refused token sets `resumable = False`
    before `_handle_stopped_request`, which then finishes the request."""
    cfg = _cfg("vllm-0.34")
    states = _run(cfg, (STRUCTURED_SESSION,), [Arrive(0, STRUCTURED_SESSION), CompileGrammar(0), Schedule()])
    state = states[-1]
    (entry,) = state.in_flight[-1]
    # a mask built at a position the FSM is not at (as vLLM #29379's stale bitmask): the token is refused
    state = replace(state, in_flight=state.in_flight[:-1] + ((replace(entry, mask=entry.mask + 1),),))
    refused = step(state, cfg, CompleteOldest((Sample(),)))
    assert refused is not None
    q = refused.requests[0]
    assert q.status is Status.FINISHED_ERROR and q.status is not Status.WAITING_FOR_STREAMING_REQ


# A structured session of two turns, K = 2, one seat: its grammar compiles or
# fails at any moment, its stop with a batch in flight, its next input, the end.
STATES = {"vllm-0.34": (132, 268), "vllm-0.34-async": (256, 525),
          "vllm-0.33": (132, 268), "vllm-0.33-async": (256, 525)}


@pytest.mark.parametrize("profile", sorted(STATES))
def test_a_structured_session_model_keeps_every_invariant_under_every_profile_with_both(profile: str):
    model = Model("session-grammar-k2", _cfg(profile), (STRUCTURED_SESSION,), allow_abort=False)
    result = search(model)
    broken = [(v.property, v.message) for v in result.violations if "sometimes" not in v.message]
    assert not broken, broken
    assert all(result.liveness.values())
    assert (result.num_states, result.num_edges) == STATES[profile]


def test_grammar_and_sessions_are_no_longer_excluded_and_meet():
    features = {f.name: f for f in registered()}
    assert "grammar" not in features["streaming-sessions"].excludes
    assert "streaming-sessions" not in features["grammar"].excludes
    for version in ("0.34.0", "0.33.0"):
        met = sum({"grammar", "streaming-sessions"} <= set(w["features"])
                  for w in campaign_workloads(5, 150, features_of=version))
        assert met >= 5, (version, met)


# Campaign workloads (seed, index) of `--all-features --versions 0.34.0,0.33.0`
# (no inputs during waits) where the pair's fixes were found: 81, a session
# whose input comes while its grammar compiles (the bridge compiled the
# update's grammar in place of the session's: vLLM stuck); 147 on 0.34.0, a
# session whose grammar fails, then its end of session names a new request
# (the recorder did not report that request's grammar: a false finish_decision).
FOUND = {"0.34.0": [(5, 81), (5, 147)], "0.33.0": [(5, 81), (5, 147)]}
# And where reset and pause met sessions: seed 7 index 58 (PAUSED_NEW admits a
# session's next turn), seed 5 index 50 (a reset beside a parked session: vLLM
# raises, the finding, rejected with RP4 as a real bug).
FOUND_RESET = {"0.34.0": [(7, 58), (5, 50)], "0.33.0": [(7, 58), (5, 50)]}


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version", sorted(FOUND))
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_the_session_pairs_workloads_agree_with_vllm(version: str, async_scheduling: bool) -> None:
    if os.environ.get("FLIGHTCHECK_SKIP_VLLM"):
        pytest.skip("FLIGHTCHECK_SKIP_VLLM")
    from flightcheck.vllm.campaign import DISAGREEMENTS, run_version

    workloads = [drawn_before_clients_went_away(seed, index + 1, features_of=version)[index] for seed, index in FOUND[version]]
    assert all({"grammar", "streaming-sessions"} <= set(w["features"]) for w in workloads)
    resets = [drawn_before_clients_went_away(seed, index + 1, features_of=version)[index]
              for seed, index in FOUND_RESET[version]]
    assert all({"reset-pause", "streaming-sessions"} <= set(w["features"]) for w in resets)
    workloads += resets
    report = run_version(version, workloads, 0, False, lambda line: None, async_scheduling)
    assert report.workloads == len(workloads) and report.unexplained == []
    assert not set(report.verdicts) & DISAGREEMENTS, dict(report.verdict_details)


# --- reset and pause beside streaming sessions

def _reset_cfg() -> Config:
    return Config(num_stages=1, max_num_batched_tokens=4, max_num_seqs=2, block_size=2, num_blocks=6,
                  max_model_len=8, prefix_caching=False, profile="vllm-0.34", streaming_sessions=True,
                  reset_and_pause=True)


SESSION = Prompt(2, 1, session=((1, 1), (0, 0)))


def test_under_paused_new_a_sessions_next_turn_is_admitted_and_a_new_request_is_not():
    """vLLM 0.33/0.34 `schedule()`: under PAUSED_NEW the waiting loop takes
    `kv_holding_waiting` (a session between turns holds its blocks there)
    and never `waiting`."""
    cfg = _reset_cfg()
    states = _run(cfg, (SESSION, Prompt(1, 1)), [
        Arrive(0, SESSION), Schedule(), CompleteOldest((Sample(),)),     # turn 0 ends at max_tokens: parked
        SetPause(Pause.PAUSED_NEW), Arrive(1, Prompt(1, 1)), SendInput(0), Schedule()])
    parked, after = states[2], states[-1]
    assert parked.requests[0].status is Status.WAITING_FOR_STREAMING_REQ and parked.kv_holding == (0,)
    assert after.requests[0].status is Status.RUNNING and after.requests[1].status is Status.WAITING
    assert [e.req for e in after.in_flight[-1]] == [0]


def test_a_reset_of_the_running_requests_beside_a_parked_session_breaks_rp4():
    """The finding (docs/request-states.md, "Finding: a reset fails while a
    session waits for input"): the parked session's blocks stay held, so
    the cache cannot be reset; vLLM raises there."""
    cfg = _reset_cfg()
    state = _run(cfg, (SESSION,), [Arrive(0, SESSION), Schedule(), CompleteOldest((Sample(),))])[-1]
    assert state.requests[0].status is Status.WAITING_FOR_STREAMING_REQ and state.requests[0].block_table
    after = step(state, cfg, Reset(True))
    assert after is not None and after.requests[0].block_table
    broken = [p.name for p in transition_properties_for(cfg) if not p.holds(state, after, Reset(True), cfg)]
    assert broken == ["RP4_prefix_cache_reset"]


FINDING = DATA / "session-reset-fails.workload.json"

# vLLM 0.34.0's traces (sync and async) of campaign --all-features --versions
# 0.34.0,0.33.0 seed 7 index 58 (grammar, sessions, reset and pause): under
# PAUSED_NEW a session's next turn is admitted from `kv_holding_waiting`
# (was: a false RP1_paused_schedules_nothing)
PAUSED_NEW_TRACES = ["034_session_turn_admitted_paused_new.jsonl",
                     "034_async_session_turn_admitted_paused_new.jsonl"]


@pytest.mark.usefixtures("both_checkers")
@pytest.mark.parametrize("name", PAUSED_NEW_TRACES)
@pytest.mark.parametrize("full", [False, True])
def test_check_trace_accepts_a_sessions_turn_admitted_under_paused_new(name: str, full: bool):
    result = check_events(read_trace_file(DATA / name), None, full=full)
    assert result.ok, (result.property, result.message)


@pytest.mark.parametrize("name", PAUSED_NEW_TRACES)
def test_the_streaming_checker_accepts_it_too(name: str):
    assert list(check_lines((DATA / name).read_text().splitlines()))[-1].result.ok


def test_the_reference_raises_where_vllm_does_and_writes_the_reset_first():
    run = run_reference(json.loads(FINDING.read_text()), "vllm-0.34")
    assert run.ending == "exception" and "RuntimeError" in run.exception
    assert run.events[-1] == {"ev": "reset", "running": True, "connector": False, "preempted": ["r1"], "ok": False,
                              "step": 12}


@pytest.mark.usefixtures("both_checkers")
@pytest.mark.parametrize("full", [False, True])
def test_check_trace_rejects_vllms_failed_reset_with_rp4(full: bool):
    """vLLM 0.34.0's trace of the finding's workload (the replay worker's
    recorder writes the reset, ok false, before vLLM's RuntimeError)."""
    result = check_events(read_trace_file(DATA / "034_session_reset_fails.jsonl"), None, full=full)
    assert not result.ok and result.property == "RP4_prefix_cache_reset"


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
def test_finding_vllm_raises_at_a_reset_of_the_running_requests_beside_a_parked_session(version: str, tmp_path):
    """vLLM 0.33.0 and 0.34.0 `Scheduler.reset_prefix_cache(reset_running_requests=True)`:
    the running request r1 is preempted, then `BlockPool.reset_prefix_cache` finds the
    parked session's blocks held and the scheduler raises RuntimeError."""
    if os.environ.get("FLIGHTCHECK_SKIP_VLLM"):
        pytest.skip("FLIGHTCHECK_SKIP_VLLM")
    from flightcheck.vllm.replay import ReplayWorker

    trace = tmp_path / "trace.jsonl"
    with ReplayWorker(version) as worker:
        out = worker.replay(json.loads(FINDING.read_text()), trace=str(trace))
    assert out["ending"] == "exception" and "Failed to reset KV cache" in out["exception"]
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    assert {k: events[-1][k] for k in ("ev", "running", "preempted", "ok")} == \
        {"ev": "reset", "running": True, "preempted": ["r1"], "ok": False}
    result = check_events(read_trace_file(trace), None, full=True)
    assert not result.ok and result.property == "RP4_prefix_cache_reset"
