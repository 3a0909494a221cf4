"""The engine's choices as properties (spec/engine.py): check-trace rejects,
at the event where they break, a trace numbering engine steps (`engine_step`)
whose engine waited for input with a batch in flight (E-a) or completed a
batch where the spec would schedule and the queue had room (E-b); the same
traces without `engine_step` keep today's verdict and say what was not
checked; inputs a version takes in the middle of a step may land on either
side of its `schedule()`."""

from __future__ import annotations

import pytest

from flightcheck.spec.engine import E_A, E_B
from flightcheck.verification.traces.check import check_events
from flightcheck.verification.traces.engine_steps import NO_STEPS

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

CONFIG = {"ev": "config", "num_stages": 2, "max_num_batched_tokens": 16, "max_num_seqs": 4, "block_size": 4,
          "num_blocks": 16, "max_model_len": 64, "eos_token_id": None}


def arrive(req: str, step: int, prompt_len: int = 8, max_tokens: int = 2) -> dict:
    return {"ev": "arrive", "req": req, "prompt_len": prompt_len, "max_tokens": max_tokens, "engine_step": step}


def schedule(batch: int, step: int, *entries: tuple[str, int, int]) -> dict:
    return {"ev": "schedule", "batch": batch, "engine_step": step, "preempted": [],
            "entries": [{"req": r, "start": s, "n": n, "samples": True} for r, s, n in entries]}


def complete(batch: int, step: int, tokens: dict) -> dict:
    return {"ev": "complete", "batch": batch, "engine_step": step, "tokens": tokens}


def abort(req: str, step: int) -> list[dict]:
    return [{"ev": "abort", "req": req, "engine_step": step},
            {"ev": "finish", "req": req, "reason": "abort", "engine_step": step}]


def without_engine_steps(events: list[dict]) -> list[dict]:
    return [{k: v for k, v in e.items() if k != "engine_step"} for e in events]


def aborted_in_flight_then_b(wake_at: int, drained_first: bool = False) -> list[dict]:
    """"a" is aborted at step 1 while its batch is in flight, and "b" arrives
    at `wake_at`. vLLM 0.8.5's busy loop blocks on input in between, the
    batch still in flight (unless `drained_first`: the batch completed at
    step 2, before the wait)."""
    head = [dict(CONFIG), arrive("a", 0), schedule(1, 0, ("a", 0, 8)), *abort("a", 1)]
    if drained_first:
        return head + [complete(1, 2, {}), arrive("b", wake_at), schedule(2, wake_at, ("b", 0, 8)),
                       complete(2, wake_at + 1, {"b": [5]}), schedule(3, wake_at + 2, ("b", 8, 1)),
                       complete(3, wake_at + 3, {"b": [6]}),
                       {"ev": "finish", "req": "b", "reason": "length", "engine_step": wake_at + 3}, {"ev": "end"}]
    return head + [arrive("b", wake_at), schedule(2, wake_at, ("b", 0, 8)), complete(1, wake_at + 1, {}),
                   complete(2, wake_at + 2, {"b": [5]}), schedule(3, wake_at + 3, ("b", 8, 1)),
                   complete(3, wake_at + 4, {"b": [6]}),
                   {"ev": "finish", "req": "b", "reason": "length", "engine_step": wake_at + 4}, {"ev": "end"}]


def test_waiting_for_input_with_a_batch_in_flight_is_rejected_at_the_first_event_after_the_wait():
    events = aborted_in_flight_then_b(wake_at=5)
    result = check_events(events)
    assert not result.ok and result.property == E_A
    assert result.event_index == 5 and events[result.event_index]["ev"] == "arrive"
    assert "engine steps 2..4" in result.message and "batch 1" in result.message


def test_the_same_wait_is_legal_when_no_step_is_missing_or_nothing_is_in_flight():
    assert check_events(aborted_in_flight_then_b(wake_at=2)).ok              # step 2 follows step 1
    assert check_events(aborted_in_flight_then_b(wake_at=5, drained_first=True)).ok


def test_a_trace_without_engine_steps_keeps_todays_verdict_and_says_what_was_not_checked():
    events = without_engine_steps(aborted_in_flight_then_b(wake_at=5))
    result = check_events(events)
    assert result.ok and NO_STEPS in result.unchecked
    assert NO_STEPS not in check_events(aborted_in_flight_then_b(wake_at=2)).unchecked


def completed_instead_of_scheduling(b_arrives_at: int) -> list[dict]:
    """"b" arrives at engine step `b_arrives_at`; at step 1 the engine
    completes "a"'s batch with a free queue slot, without scheduling."""
    return [dict(CONFIG), arrive("a", 0), schedule(1, 0, ("a", 0, 8)), arrive("b", b_arrives_at),
            complete(1, 1, {"a": [5]}), schedule(2, 2, ("a", 8, 1), ("b", 0, 8)),
            complete(2, 3, {"a": [6], "b": [7]}),
            {"ev": "finish", "req": "a", "reason": "length", "engine_step": 3},
            schedule(3, 4, ("b", 9 - 1, 1)), complete(3, 5, {"b": [8]}),
            {"ev": "finish", "req": "b", "reason": "length", "engine_step": 5}, {"ev": "end"}]


def test_completing_where_the_spec_schedules_with_room_in_the_queue_is_rejected_at_that_completion():
    events = completed_instead_of_scheduling(b_arrives_at=1)
    result = check_events(events)
    assert not result.ok and result.property == E_B
    assert events[result.event_index]["ev"] == "complete" and result.event_index == 4
    assert "1 of 2 queue slots" in result.message


def test_the_same_trace_without_engine_steps_is_legal():
    assert check_events(without_engine_steps(completed_instead_of_scheduling(b_arrives_at=1))).ok


def test_an_arrival_between_steps_is_seen_by_that_steps_schedule_under_0_8_5():
    # the arrival stamped 1 came before step 1's schedule(): the spec would admit "b"
    assert check_events(completed_instead_of_scheduling(b_arrives_at=1)).property == E_B


def test_completing_when_the_spec_forms_nothing_is_legal():
    events = completed_instead_of_scheduling(b_arrives_at=2)       # "b" arrives after step 1
    events[3], events[4] = events[4], events[3]
    assert check_events(events).ok


def freed_by_an_abort(profile: str) -> list[dict]:
    """"b" cannot be admitted while "a" holds its blocks; at step 1 "a" is
    aborted and its batch completed: admissible after the abort, not before."""
    config = dict(CONFIG, num_blocks=3, profile=profile)
    return [config, arrive("a", 0, max_tokens=4), arrive("b", 0, prompt_len=12, max_tokens=1),
            schedule(1, 0, ("a", 0, 8)), *abort("a", 1), complete(1, 1, {}),
            schedule(2, 2, ("b", 0, 12)), complete(2, 3, {"b": [5]}),
            {"ev": "finish", "req": "b", "reason": "length", "engine_step": 3}, {"ev": "end"}]


def test_a_mid_step_abort_may_land_after_the_steps_schedule_under_0_33():
    # vLLM 0.33 drains its aborts queue between schedule() and
    # update_from_output: the step's schedule() may not have seen the abort
    assert check_events(freed_by_an_abort("vllm-0.33")).ok
    # 0.8.5 takes inputs between steps only: its schedule() saw the abort and would admit "b"
    result = check_events(freed_by_an_abort("vllm-0.8.5"))
    assert result.property == E_B and result.event_index == 6


def test_an_arrival_is_no_mid_step_input_under_0_33():
    events = completed_instead_of_scheduling(b_arrives_at=1)
    events[0] = dict(CONFIG, profile="vllm-0.33")
    assert check_events(events).property == E_B


def test_an_arrival_may_land_on_either_side_of_the_wait_under_0_34():
    # vLLM 0.34's _wait_for_output takes ADD while it spins on the step's
    # output: "b" stamped with step 1 may have arrived after step 1's
    # schedule() (legal), or before the next step (stamped 2: legal too)
    during = completed_instead_of_scheduling(b_arrives_at=1)
    during[0] = dict(CONFIG, profile="vllm-0.34")
    assert check_events(during).ok
    after = completed_instead_of_scheduling(b_arrives_at=2)
    after[0] = dict(CONFIG, profile="vllm-0.34")
    after[3], after[4] = after[4], after[3]
    assert check_events(after).ok
    # a completion with no arrival in between, where the spec schedules, is still rejected
    late = [dict(e) for e in during]
    late[4]["engine_step"] = 1
    late[3]["engine_step"] = 0                    # "b" arrived before step 0's end: step 1's schedule() saw it
    assert check_events(late).property == E_B
