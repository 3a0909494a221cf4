"""The one drive loop (reference/drive.py) and the engine-loop variants: what
each vLLM version's loop lets a step do, and how the loop admits arrivals,
waits, reports outputs and gives up."""

from __future__ import annotations

import pytest

from flightcheck.reference import (Engine, EngineCoreOutput, Request, Scheduler, SchedulerConfig,
                                   ScriptedExecutor)
from flightcheck.reference.drive import (VLLM_0_8_4_LOOP, VLLM_0_8_5_LOOP, ArrivalsByStep,
                                         EngineStuck, drive, loop_for_policy)


def prompt(n: int, base: int = 0) -> list[int]:
    return [base + i for i in range(n)]


def small_config(**overrides) -> SchedulerConfig:
    return SchedulerConfig(**{"max_num_batched_tokens": 16, "max_num_seqs": 4,
                              "max_model_len": 32, "block_size": 4, "num_blocks": 16,
                              "num_pipeline_stages": 2, **overrides})


# -- the engine-loop variants ------------------------------------------------

@pytest.mark.parametrize("continue_prefill, loop", [(True, VLLM_0_8_5_LOOP),
                                                     (False, VLLM_0_8_4_LOOP)])
def test_engine_takes_the_loop_its_policy_shipped_with(continue_prefill, loop):
    engine = Engine(Scheduler(small_config(continue_prefill=continue_prefill)), ScriptedExecutor())
    assert loop_for_policy(continue_prefill) is loop
    assert engine.loop is loop


@pytest.mark.parametrize("loop", [VLLM_0_8_4_LOOP, VLLM_0_8_5_LOOP])
def test_queue_holds_one_batch_per_pipeline_stage(loop):
    cfg = small_config(num_pipeline_stages=3, max_num_batched_tokens=4)   # a batch per chunk
    engine = Engine(Scheduler(cfg), ScriptedExecutor(), loop)
    for base in range(4):
        engine.add_request(Request(str(base), prompt(8, 100 * base)))
    for _ in range(3):
        assert engine.can_schedule()
        assert engine.schedule_step() is not None
    assert engine.num_in_flight_batches == 3 and not engine.can_schedule()


def test_0_8_4_loop_waits_while_every_request_is_in_flight():
    engine = Engine(Scheduler(small_config(continue_prefill=False, num_pipeline_stages=4)),
                    ScriptedExecutor(), VLLM_0_8_4_LOOP)
    engine.add_request(Request("0", prompt(6)))
    engine.step()
    assert not engine.can_schedule()             # room in the queue, but the gate is shut


def test_0_8_5_loop_schedules_whenever_the_queue_has_room():
    """The same scheduler under 0.8.5's loop: the step may schedule, finds
    nothing (the request is in flight) and waits for the batch instead."""
    engine = Engine(Scheduler(small_config(continue_prefill=False, num_pipeline_stages=4)),
                    ScriptedExecutor(), VLLM_0_8_5_LOOP)
    engine.add_request(Request("0", prompt(6)))
    engine.step()
    assert engine.can_schedule()
    steps_before = engine.scheduler.num_steps
    outputs = engine.step()
    assert [o.request_id for o in outputs] == ["0"]
    assert engine.scheduler.num_steps == steps_before + 2     # an empty schedule(), then the update


@pytest.mark.parametrize("loop", [VLLM_0_8_4_LOOP, VLLM_0_8_5_LOOP])
def test_one_batch_per_request_runs_to_completion_under_either_loop(loop):
    engine = Engine(Scheduler(small_config(continue_prefill=False)), ScriptedExecutor(), loop)
    for base in range(3):
        engine.add_request(Request(str(base), prompt(9, 100 * base)))
    outputs = engine.run()
    assert {o.request_id for o in outputs if o.finished} == {"0", "1", "2"}
    assert not engine.has_unfinished_requests() and engine.num_in_flight_batches == 0


# -- the drive loop ----------------------------------------------------------

def test_arrivals_by_step_enter_once_the_engine_has_made_that_many_steps():
    engine = Engine(Scheduler(small_config()), ScriptedExecutor())
    arrivals = ArrivalsByStep([(3, Request("late", prompt(4))), (0, Request("early", prompt(4)))])
    admitted_after_each_step: list[list[str]] = []
    result = drive(engine, arrivals=arrivals,
                   after_step=lambda: admitted_after_each_step.append(list(arrivals.admitted)))
    assert admitted_after_each_step[:4] == [["early"]] * 3 + [["early", "late"]]
    assert result.num_steps == len(admitted_after_each_step)
    assert not engine.has_unfinished_requests()


def test_with_nothing_to_do_the_step_clock_takes_idle_steps_until_an_arrival():
    engine = Engine(Scheduler(small_config()), ScriptedExecutor())
    arrivals = ArrivalsByStep([(5, Request("r", prompt(4)))])
    drive(engine, arrivals=arrivals)
    assert engine.scheduler.num_steps > 5        # five idle schedule() calls, then the request's


class ClockArrivals:
    """Arrivals on a clock of their own: waiting moves the clock, not the engine."""

    def __init__(self, arrivals: list[tuple[float, Request]]) -> None:
        self.pending = sorted(arrivals, key=lambda arrival: arrival[0])
        self.now = 0.0
        self.waits: list[tuple[float, int]] = []      # (waited until, engine steps then)
        self.num_steps = 0

    def admit_due(self, engine, num_steps: int) -> None:
        self.num_steps = num_steps
        while self.pending and self.pending[0][0] <= self.now:
            engine.add_request(self.pending.pop(0)[1])

    def has_pending(self) -> bool:
        return bool(self.pending)

    def wait_for_next(self) -> bool:
        self.now = self.pending[0][0]
        self.waits.append((self.now, self.num_steps))
        return True


def test_with_nothing_to_do_a_clock_waits_without_stepping_the_engine():
    engine = Engine(Scheduler(small_config()), ScriptedExecutor())
    arrivals = ClockArrivals([(2.0, Request("a", prompt(4))), (9.0, Request("b", prompt(4)))])
    result = drive(engine, arrivals=arrivals)
    assert [t for t, _ in arrivals.waits] == [2.0, 9.0]
    assert arrivals.waits[0][1] == 0                  # no step before the first arrival
    steps_for_a = arrivals.waits[1][1]
    assert result.num_steps == 2 * steps_for_a        # "b" takes as many steps as "a" did


def test_outputs_go_to_the_hook_and_after_step_runs_after_every_step():
    engine = Engine(Scheduler(small_config()), ScriptedExecutor())
    engine.add_request(Request("r", prompt(4)))
    events: list[str] = []
    result = drive(engine, on_outputs=lambda outs: events.append(f"out:{len(outs)}"),
                   after_step=lambda: events.append("step"))
    assert events.count("step") == result.num_steps
    assert events[-2:] == ["out:1", "step"]           # the last batch finished the request
    assert all(events[i + 1] == "step" for i, e in enumerate(events) if e.startswith("out"))


class ScriptedEngine:
    """An engine whose steps are given: None (nothing submitted or completed)
    or a list of outputs; busy while any step is left."""

    def __init__(self, steps: list[list[EngineCoreOutput] | None]) -> None:
        self.steps = list(steps)
        self.num_in_flight_batches = 0
        self.added: list[Request] = []

    def add_request(self, request: Request) -> None:
        self.added.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.steps)

    def step(self) -> list[EngineCoreOutput] | None:
        return self.steps.pop(0)


def test_two_idle_steps_in_a_row_with_no_arrival_pending_are_a_hang():
    engine = ScriptedEngine([[], None, None, []])
    with pytest.raises(EngineStuck, match="stuck"):
        drive(engine)
    assert engine.steps == [[]]                       # given up right after the second idle step


def test_one_idle_step_is_not_a_hang():
    """A step that only preempts submits nothing; the next one admits."""
    engine = ScriptedEngine([None, [], None, []])
    assert drive(engine).num_steps == 4


def test_idle_steps_while_an_arrival_is_pending_are_waiting_not_a_hang():
    engine = ScriptedEngine([None] * 6 + [[]])
    result = drive(engine, arrivals=ArrivalsByStep([(6, Request("r", prompt(4)))]))
    assert result.num_steps == 7 and [r.request_id for r in engine.added] == ["r"]


def test_more_steps_than_allowed_raise():
    engine = ScriptedEngine([[]] * 10)
    with pytest.raises(RuntimeError, match="did not finish within 4 steps"):
        drive(engine, max_steps=4)
    assert drive(ScriptedEngine([[]] * 4), max_steps=4).num_steps == 4


def test_engine_run_collects_every_output_through_the_drive_loop():
    engine = Engine(Scheduler(small_config()), ScriptedExecutor())
    for base in range(3):
        engine.add_request(Request(str(base), prompt(5, 100 * base)))
    outputs = engine.run()
    assert sum(len(o.new_token_ids) for o in outputs) == 3 * 16      # max_tokens default 16
    assert engine.num_submitted_batches >= 16
