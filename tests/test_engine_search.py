"""The engine loop around the spec (spec/engine.py, verification/explicit/
engine.py): each version's loop as its profile has it, searched
exhaustively. vLLM 0.8.5's and 0.8.4's busy loops wait for input with an
aborted request's batch in flight (E-a, a shortest counterexample of 4
steps); 0.8.4's gate on a stale in-flight set (the spec mutant
`inflight_set_not_cleared_on_preemption`) completes a batch where the spec,
on its own counters, schedules (E-b); the same loops corrected (0.33's
busy-loop rule), and 0.33's own, break neither."""

from __future__ import annotations

import pytest

from flightcheck.spec import Config
from flightcheck.spec.engine import E_A, E_B, corrected, loop_of
from flightcheck.verification.explicit.engine import ENGINE_MODELS, describe_violation, search


@pytest.mark.parametrize("engine_model", ENGINE_MODELS, ids=lambda em: em.name)
def test_each_engine_model_finds_exactly_what_it_should(engine_model):
    result = search(engine_model)
    assert result.as_expected, describe_violation(result)


def test_the_released_loops_break_e_a_by_waiting_with_an_aborted_requests_batch_in_flight():
    by_name = {em.name: em for em in ENGINE_MODELS}
    for name in ("0.8.5-loop", "0.8.4-loop"):
        violation = search(by_name[name]).violation
        assert violation is not None and violation.property == E_A
        labels = [label for label, _ in violation.path]
        assert labels[-1] == "wait for input" and labels[-2].startswith("abort")
        state, phase = violation.path[-1][1]
        assert phase == "waiting" and state.in_flight


def test_the_stale_in_flight_set_breaks_e_b_at_a_completion():
    violation = search(next(em for em in ENGINE_MODELS if em.expect == E_B)).violation
    assert violation is not None and violation.path[-1][0].endswith("then complete oldest")


def test_each_profile_carries_its_own_loop():
    released = {name: loop_of(Config(profile=name)) for name in ("vllm-0.8.5", "vllm-0.8.4", "vllm-0.33",
                                                                  "vllm-0.33-async", "vllm-0.34")}
    assert released["vllm-0.8.5"].waits_with_batch_in_flight and released["vllm-0.8.4"].waits_with_batch_in_flight
    assert not released["vllm-0.33"].waits_with_batch_in_flight and released["vllm-0.33"].empty_batches
    assert released["vllm-0.8.5"].mid_step_inputs == () and released["vllm-0.33"].mid_step_inputs == ("abort",)
    assert released["vllm-0.33-async"] == released["vllm-0.33"]
    assert released["vllm-0.34"].mid_step_inputs == ("arrive", "abort")   # EngineCoreProc._wait_for_output
    assert not corrected(released["vllm-0.8.5"]).waits_with_batch_in_flight
