"""check-trace on traces with streaming sessions (docs/trace-format.md,
"Streaming sessions"): the reference's session traces accepted by both
checkers under every profile with sessions; a trace that misplaces a
session's next turn, or an input for a request that is not a session,
rejected; an input or a resumable arrival without `streaming_sessions` in
the config malformed; the reference's session traces with prefix caching
accepted; the reference's session mutants' traces rejected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flightcheck.verification.traces.check import MalformedTrace, check_events
from flightcheck.vllm.reference_run import run_reference

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

SESSIONS = Path(__file__).parent / "data" / "vllm" / "sessions"
PROFILES = ("vllm-0.33", "vllm-0.33-async", "vllm-0.34", "vllm-0.34-async")

CONFIG = {"ev": "config", "num_stages": 1, "max_num_batched_tokens": 16, "block_size": 4, "num_blocks": 16,
          "max_model_len": 64, "eos_token_id": 0, "vllm_version": "0.34.0", "streaming_sessions": True}
# a session whose queued input starts its next turn at once, then parks and ends (the page's example)
SESSION = [
    CONFIG,
    {"ev": "arrive", "req": "s", "prompt_len": 6, "max_tokens": 2, "resumable": True},
    {"ev": "schedule", "batch": 1, "entries": [{"req": "s", "start": 0, "n": 6, "block_ids": [0, 1]}]},
    {"ev": "input", "req": "s", "num_tokens": 3, "max_tokens": 1},
    {"ev": "complete", "batch": 1, "tokens": {"s": [5]}},
    {"ev": "schedule", "batch": 2, "entries": [{"req": "s", "start": 6, "n": 1, "block_ids": []}]},
    {"ev": "complete", "batch": 2, "tokens": {"s": [6]}},
    {"ev": "schedule", "batch": 3, "entries": [{"req": "s", "start": 7, "n": 3, "cached": 7, "block_ids": [0, 1, 2]}]},
    {"ev": "complete", "batch": 3, "tokens": {"s": [7]}},
    {"ev": "input", "req": "s", "end_of_session": True},
    {"ev": "end"},
]


def _check(events: list[dict]) -> tuple[bool, int | None, str | None]:
    result = check_events([dict(e) for e in events])
    return result.ok, result.event_index, result.property


def test_a_session_trace_is_legal():
    assert _check(SESSION) == (True, None, None)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("path", sorted(SESSIONS.glob("*.json")), ids=lambda p: p.stem)
def test_the_references_session_traces_are_legal(path: Path, profile: str):
    run = run_reference(json.loads(path.read_text()), profile)
    assert run.ending == "done"
    assert any(e["ev"] == "input" for e in run.events) and run.events[0]["streaming_sessions"] is True
    assert _check(run.events) == (True, None, None)


def test_a_next_turn_that_skips_a_kept_token_is_rejected():
    events = [dict(e) for e in SESSION]
    events[7] = {"ev": "schedule", "batch": 3, "entries": [{"req": "s", "start": 8, "n": 2, "cached": 8,
                                                             "block_ids": [0, 1, 2]}]}
    assert _check(events) == (False, 7, "schedule_decision")


def test_a_turns_end_written_as_a_finish_is_rejected():
    events = SESSION[:7] + [{"ev": "finish", "req": "s", "reason": "length"}, {"ev": "end"}]
    assert _check(events) == (False, 7, "finish_decision")


def test_an_input_for_a_request_that_is_not_a_session_is_rejected():
    events = [dict(e) for e in SESSION]
    del events[1]["resumable"]
    assert _check(events) == (False, 3, "illegal_transition")


@pytest.mark.parametrize("drop, where", [("config", 1), ("resumable", 1)])
def test_session_events_need_streaming_sessions_in_the_config(drop: str, where: int):
    events = [dict(e) for e in SESSION]
    del events[0]["streaming_sessions"]
    if drop == "config":
        del events[1]["resumable"]
    with pytest.raises(MalformedTrace, match="streaming_sessions"):
        check_events(events)


@pytest.mark.parametrize("path", sorted(SESSIONS.glob("*.json")), ids=lambda p: p.stem)
def test_the_references_session_traces_with_prefix_caching_are_legal(path: Path):
    # a session's kept outputs are prompt blocks now, labelled as the spec's content_label labels them
    raw = json.loads(path.read_text())
    raw["config"]["prefix_caching"] = True
    run = run_reference(raw, "vllm-0.34-async")
    assert run.ending == "done" and run.events[0]["prefix_caching"] is True
    assert _check(run.events) == (True, None, None)
    assert _check([{**CONFIG, "prefix_caching": True}] + SESSION[1:]) == (True, None, None)


@pytest.mark.parametrize("mutant, workload, index, prop", [
    # the parked session's seat freed: a waiting request admitted past max_num_seqs (SS4)
    ("waiting_session_seat_freed", "session-seat", 9, "illegal_schedule"),
    # the old turn's output appended to its next turn (SS1): the session then runs where the spec parks it
    ("turn_output_not_dropped_pr52765", "session-turns", 24, "schedule_decision"),
])
def test_the_references_session_mutants_traces_are_rejected(mutant: str, workload: str, index: int, prop: str):
    raw = json.loads((SESSIONS / f"{workload}.json").read_text())
    run = run_reference(raw, "vllm-0.34-async", mutant=mutant)
    assert _check(run.events)[::2] == (False, prop)
    assert _check(run.events)[1] == index
