"""`flightcheck verify --streaming-sessions`: the session models searched
exhaustively under a profile (verification/suite.py `_sessions_suite`),
SS1-SS4 reported as invariants and the session targets as targets, the
sessions' mutants killed under vllm-0.34-async; bad combinations refused."""

from __future__ import annotations

import json

import pytest

from flightcheck.cli import main
from flightcheck.verification.session_models import SESSION_MUTANT_MODELS
from flightcheck.verification.suite import SuiteOptions, run_suite

SESSION_PROPERTIES = ("SS1_old_output_never_bound", "SS2_old_turn_given_up", "SS3_waiting_session_holds_blocks",
                      "SS4_waiting_session_keeps_seat")


def test_the_session_suite_proves_ss1_to_ss4_and_kills_every_session_mutant():
    result = run_suite(SuiteOptions(profile="vllm-0.34-async", use_z3=False, streaming_sessions=True))
    assert result.ok and result.streaming_sessions
    rows = {(p.name, p.method.split()[1]): p for p in result.properties}
    for name in SESSION_PROPERTIES:
        for model in ("session-k2@vllm-0.34-async", "session-pressure-k2@vllm-0.34-async",
                      "session-cache-k2@vllm-0.34-async"):
            assert rows[name, model].kind == "invariant" and rows[name, model].status == "proved"
    assert rows["session_finishes_in_a_later_turn", "session-k2@vllm-0.34-async"].kind == "sometimes"
    # with prefix caching: a kept output's block is hit again, and the cache's S9 holds beside sessions
    hits = rows["session_hits_its_kept_outputs", "session-cache-k2@vllm-0.34-async"]
    assert hits.kind == "sometimes" and hits.status == rows["session_finishes_in_a_later_turn",
                                                             "session-k2@vllm-0.34-async"].status
    assert rows["S9_kv_ownership", "session-cache-k2@vllm-0.34-async"].status == "proved"
    killed = {m.name: m.property for m in result.mutants}
    assert killed == {"continuation_applied_while_running_pr52693": "S10_queues_and_budgets",
                      "turn_output_not_dropped_pr52765": "IF2_stale_counter",
                      "session_keeps_drafts_pr42655": "SS3_waiting_session_holds_blocks",
                      "stop_keeps_optimistic_tokens_omni5183": "SS3_waiting_session_holds_blocks",
                      "waiting_session_seat_freed": "SS4_waiting_session_keeps_seat"}
    assert set(killed) == set(SESSION_MUTANT_MODELS)


def test_verify_streaming_sessions_json_under_a_sync_profile(capsys):
    assert main(["verify", "--streaming-sessions", "--profile", "vllm-0.33", "--no-z3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["streaming_sessions"] is True and out["mutants"] == []
    assert {p["name"] for p in out["properties"]} >= set(SESSION_PROPERTIES)


@pytest.mark.parametrize("argv, fragment", [
    (["--profile", "vllm-0.8.5"], "needs a profile with streaming sessions"),
    (["--profile", "vllm-0.34", "--kv-connector"], "cannot go with"),
    (["--profile", "vllm-0.34", "--inferred"], "cannot go with"),
])
def test_bad_session_combinations_exit_2(capsys, argv, fragment):
    try:
        code = main(["verify", "--streaming-sessions", *argv])
    except SystemExit as stop:
        code = stop.code
    assert code == 2 and fragment in capsys.readouterr().err
