"""check-trace's messages, as a user reads them: every position is the line
of the file (1-based, blank lines counted, as for a malformed line), requests
are named by the trace's own ids, and a batch the spec would not form says
which of the spec's guards holds each request back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flightcheck.verification.traces.check import CheckResult, check_events, check_trace, read_events

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

CONFIG = {"ev": "config", "num_stages": 3, "max_num_batched_tokens": 8, "block_size": 4, "num_blocks": 16,
          "max_model_len": 64, "eos_token_id": 0}


def arrive(req: str, prompt_len: int, max_tokens: int = 2) -> dict:
    return {"ev": "arrive", "req": req, "prompt_len": prompt_len, "max_tokens": max_tokens}


def batch(number: int | None, *entries: tuple[str, int, int]) -> dict:
    return {"ev": "schedule", "batch": number,
            "entries": [{"req": req, "start": start, "n": n} for req, start, n in entries]}


def check(*events: dict, **config: object) -> CheckResult:
    """The verdict on a trace of these events after a config (CONFIG with
    `config`'s keys), both checkers agreeing (tests/conftest.py)."""
    return check_events([{**CONFIG, **config}, *events])


def run_cli(path: Path, *options: str) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "flightcheck.cli", "check-trace", str(path), *options],
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout


# -- one numbering: the line of the file -------------------------------------------------

BLANK_LINED = [json.dumps(CONFIG), "", json.dumps(arrive("a", 10)), "",
               json.dumps(batch(1, ("a", 0, 8))), json.dumps(batch(2, ("a", 8, 1)))]   # line 6: n is 2


def test_a_violation_is_reported_at_its_line_in_the_file_blank_lines_counted(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(BLANK_LINED) + "\n")
    result = check_trace(path)
    assert (result.property, result.event_index, result.line, result.event) == \
           ("schedule_decision", 3, 6, "schedule")
    code, out = run_cli(path)
    assert code == 1
    first, state, profile = out.splitlines()[:3]
    assert first.startswith(f"{path}: line 6 (schedule event) violates schedule_decision: "
                            'the spec schedules ["a"@8+2], the trace ["a"@8+1]')
    assert state.startswith("state before line 6: ") and profile == "profile: vllm-0.8.5"
    code, out = run_cli(path, "--json")
    verdict = json.loads(out)
    assert (code, verdict["line"], verdict["event"], verdict["event_index"]) == (1, 6, "schedule", 3)


def test_a_malformed_line_and_a_violation_speak_the_same_numbering(tmp_path):
    """Break line 6 of the same file: the format error names line 6 too."""
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(BLANK_LINED[:5] + ['{"ev": "schedule"}']) + "\n")
    proc = subprocess.run([sys.executable, "-m", "flightcheck.cli", "check-trace", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and f"{path}: line 6: schedule event: entries: missing" in proc.stderr


def test_read_events_keeps_the_line_numbers_and_a_plain_list_counts_one_event_a_line():
    events = read_events(BLANK_LINED)
    assert events.line_numbers == [1, 3, 5, 6]
    assert check_events(events).line == 6
    assert check_events([dict(e) for e in events]).line == 4      # no file: event i on line i + 1


# -- the user's request names ---------------------------------------------------------------

def test_the_state_before_names_requests_by_the_traces_ids_not_spec_slots():
    result = check(arrive("alpha", 10), arrive("beta", 4), batch(1, ("alpha", 0, 8)),
                   batch(2, ("alpha", 8, 2), ("beta", 0, 5)))
    assert result.property == "schedule_decision" and result.line == 5
    assert result.state_before == ('"alpha":RUNN c=8/10 o=0 b=[0, 1]; "beta":WAIT c=0/4 o=0 b=[] '
                                   '| W=["beta"] R=["alpha"] | Q=["alpha"@0+8] | free=[2, 3, 4, 5, 6, 7, 8]')
    assert "r0" not in result.state_before and "r1" not in result.state_before


def test_an_older_incarnation_of_a_reused_id_is_marked_earlier():
    """"a" is aborted with its batch in flight and arrives again: the state
    shows both, the older one marked, its entry superseded (~s)."""
    result = check(arrive("a", 4), batch(1, ("a", 0, 4)), {"ev": "abort", "req": "a"},
                   {"ev": "finish", "req": "a", "reason": "abort"}, arrive("a", 6), batch(2, ("a", 0, 5)),
                   num_stages=2)
    assert result.property == "schedule_decision" and result.line == 7
    assert result.state_before.startswith('"a"(earlier):FINI c=0/4 o=0 b=[]; "a":WAIT c=0/6 o=0 b=[] '
                                          '| W=["a"] R=[] | Q=["a"(earlier)@0+4*~s]')


def test_finished_requests_with_nothing_in_flight_are_not_listed():
    result = check(arrive("done", 3, max_tokens=1), batch(1, ("done", 0, 3)), {"ev": "complete", "tokens": {"done": [5]}},
                   {"ev": "finish", "req": "done", "reason": "length"}, arrive("next", 4), batch(2, ("next", 0, 3)))
    assert result.property == "schedule_decision"
    assert result.state_before.startswith('"next":WAIT c=0/4') and '"done"' not in result.state_before


# -- why the spec schedules nothing -----------------------------------------------------------

def test_a_full_pipeline_says_how_many_batches_are_in_flight():
    result = check(arrive("a", 10), arrive("b", 4), batch(1, ("a", 0, 8)), batch(2, ("a", 8, 2), ("b", 0, 4)),
                   batch(3, ("b", 4, 1)), num_stages=2)
    assert (result.property, result.line) == ("illegal_schedule", 6)
    assert result.message == "a batch was scheduled but the pipeline is full (2 batches in flight, at most 2)"


def test_requests_whose_tokens_are_all_in_flight_have_nothing_left_to_schedule():
    result = check(arrive("a", 10), arrive("b", 4), batch(1, ("a", 0, 8)), batch(2, ("a", 8, 2), ("b", 0, 4)),
                   batch(3, ("b", 4, 1)))
    assert result.property == "illegal_schedule"
    assert result.message == (
        'a batch was scheduled but the spec schedules nothing here: '
        '"a" has nothing left to schedule: all its 10 tokens are scheduled, in 2 batches in flight '
        '(it waits for the token the last samples); '
        '"b" has nothing left to schedule: all its 4 tokens are scheduled, in 1 batch in flight '
        '(it waits for the token it samples)')


def test_a_waiting_request_without_blocks_blocks_the_requests_behind_it():
    """3 blocks: "a" holds 2; "b" needs 2 for its first 8 tokens, 1 is free;
    "c" (which would fit) waits behind it, first come first served."""
    result = check(arrive("a", 8), arrive("b", 12), arrive("c", 2), batch(1, ("a", 0, 8)),
                   batch(2, ("c", 0, 2)), num_blocks=3)
    assert result.property == "illegal_schedule"
    assert result.message == (
        'a batch was scheduled but the spec schedules nothing here: '
        '"a" has nothing left to schedule: all its 8 tokens are scheduled, in 1 batch in flight '
        '(it waits for the token it samples); '
        '"b" cannot be admitted: its first 8 tokens need 2 new KV blocks, 1 is free; '
        '"c" waits behind "b" (first come, first served)')


def test_waiting_requests_without_a_seat_say_max_num_seqs():
    result = check(arrive("a", 8), arrive("b", 2), arrive("c", 2), batch(1, ("a", 0, 8)), batch(2, ("b", 0, 2)),
                   max_num_seqs=1)
    assert result.property == "illegal_schedule"
    assert result.message.endswith('"b", "c" wait for a seat (max_num_seqs is 1; 1 running)')


def test_one_batch_per_request_says_every_request_has_a_batch_in_flight():
    result = check(arrive("a", 8), batch(1, ("a", 0, 8)), batch(2, ("a", 8, 0)),
                   policy="one-batch-per-request")
    assert result.property == "illegal_schedule"
    assert result.message == ("a batch was scheduled but every waiting or running request has a batch in "
                              "flight (one batch per request: policy one-batch-per-request)")


@pytest.mark.parametrize("full", [False, True])
def test_both_checkers_give_the_same_explanation(full):
    events = [{**CONFIG, "num_blocks": 3}, arrive("a", 8), arrive("b", 12), arrive("c", 2), batch(1, ("a", 0, 8)),
              batch(2, ("c", 0, 2))]
    assert check_events(events, full=full).message.endswith('"c" waits behind "b" (first come, first served)')


# -- why the spec leaves out a request the trace schedules ------------------------------------

def test_a_request_the_spec_leaves_out_says_why():
    """"a" takes 3 of 4 blocks for its 10 tokens; "b" would need 2 for its 6."""
    result = check(arrive("a", 10), arrive("b", 6), batch(1, ("a", 0, 8)), batch(2, ("a", 8, 2), ("b", 0, 6)),
                   num_blocks=4)
    assert (result.property, result.line) == ("schedule_decision", 5)
    assert result.message == ('the spec schedules ["a"@8+2], the trace ["a"@8+2, "b"@0+6]; '
                              '"b" cannot be admitted: its first 6 tokens need 2 new KV blocks, 1 is free')


def test_a_request_behind_the_head_of_the_queue_names_the_head_and_its_reason():
    """3 blocks: "a" takes 1; "b"'s 12 tokens need 3; "c" would fit."""
    result = check(arrive("a", 4), arrive("b", 12), arrive("c", 2), batch(1, ("a", 0, 4), ("c", 0, 2)),
                   num_blocks=3, max_num_batched_tokens=16)
    assert result.message == ('the spec schedules ["a"@0+4], the trace ["a"@0+4, "c"@0+2]; "c" waits behind "b" '
                              '(first come, first served), which cannot be admitted: its first 12 tokens '
                              'need 3 new KV blocks, 2 are free')


def test_a_running_request_decoded_while_its_token_is_in_flight_says_so():
    """The reference mutant decode_while_token_in_flight: the explanation
    names the request and the guard (nothing left: its token is in flight)."""
    from .test_check_trace import events_of, scenario
    result = check_events(events_of(scenario("decode_while_token_in_flight", "decode_while_token_in_flight")))
    assert result.property == "schedule_decision"
    assert result.message.endswith('; "0" has nothing left to schedule: all its 12 tokens are scheduled, in 1 '
                                   'batch in flight (it waits for the token it samples)')


def test_the_budget_spent_before_a_request_is_reached():
    result = check(arrive("a", 8), arrive("b", 2), batch(1, ("a", 0, 8), ("b", 0, 2)))
    assert result.message == ('the spec schedules ["a"@0+8], the trace ["a"@0+8, "b"@0+2]; '
                              '"b" is not reached: the token budget (8) is spent')


@pytest.mark.parametrize("name", ["advance_at_completion", "decode_while_token_in_flight",
                                  "snapshot_omits_prefix_hit", "rejections_not_subtracted"])
def test_no_explanation_of_a_mutants_batch_disagrees_with_the_spec(name):
    from .test_check_trace import events_of, scenario
    result = check_events(events_of(scenario(name, name)))
    assert result.property == "schedule_decision" and "a bug in check-trace" not in result.message


def test_a_request_the_spec_preempts_and_one_it_does_not_admit_after_a_preemption():
    """3 blocks of 4 tokens: "a" and "b" hold one each; their decodes need a
    second block each, 1 is free: the spec gives it to "a" and preempts "b"
    (the tail), and after a preemption it admits no one ("c")."""
    result = check(arrive("a", 4, 4), arrive("b", 4, 4), arrive("c", 4, 4), batch(1, ("a", 0, 4), ("b", 0, 4)),
                   {"ev": "complete", "batch": 1, "tokens": {"a": [5], "b": [5]}},
                   batch(2, ("a", 4, 1), ("b", 4, 1), ("c", 0, 4)), num_blocks=3)
    assert result.property == "schedule_decision"
    assert result.message == (
        'the spec schedules ["a"@4+1], the trace ["a"@4+1, "b"@4+1, "c"@0+4]; '
        '"b" is preempted in this step (the running requests up to it need more blocks than are free; '
        'the spec preempts from the tail of the running list); '
        '"c" is not admitted: the step preempted "b", and admits no one after a preemption')
