"""How the replay's busy loop (engine.py `run_busy_loop`) ends a run that
idles on vLLM 0.33/0.34's engine loop: a request that can never be
scheduled again keeps `scheduler.has_requests()` true, so the engine
schedules an empty batch every step and, two batches deep, pops one every
other step: one empty batch is always queued (`EngineCoreProc.has_work`,
0.34.0 vllm/v1/engine/core.py, counts the batch queue, so vLLM spins for
ever). With no input to come the run ends `stuck` after the idle steps; the
fast-forward to the next input waits for the queued empty batches, which
must not keep a run with nothing to come from ending. An idle that an
input ends before the count is left for the replay to judge by running vLLM
again without that input (run_endings.py `short_idle`, `stays_idle`). No
vLLM: a scheduler that never schedules stands in for it.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from flightcheck.vllm.engine import IDLE_STEPS_FOR_STUCK, BatchQueueEngineV033, run_busy_loop
from flightcheck.vllm.run_endings import IdleCount, stays_idle
from flightcheck.vllm.workload import ReplayConfig, RequestSpec, Workload

MAX_STEPS = 200


class _NeverSchedules:
    """A scheduler holding one running request it never schedules again."""

    def __init__(self) -> None:
        self.waiting: list[Any] = []
        self.running = [SimpleNamespace(request_id="a")]
        self.calls = 0

    def has_requests(self) -> bool:
        return True

    def schedule(self) -> Any:
        self.calls += 1
        return SimpleNamespace(total_num_scheduled_tokens=0, num_scheduled_tokens={},
                               pending_structured_output_tokens=False)

    def update_from_output(self, scheduler_output: Any, model_output: Any) -> dict[int, Any]:
        return {}


class _NoModel:
    def execute(self, scheduler_output: Any) -> None:
        return None


def _idle_run(requests: tuple[RequestSpec, ...] = ()) -> tuple[Any, BatchQueueEngineV033, list[str]]:
    config = ReplayConfig(num_stages=1, max_num_batched_tokens=8, max_num_seqs=4, block_size=4, num_blocks=8,
                          max_model_len=32, long_prefill_token_threshold=0, prefix_caching=False,
                          async_scheduling=True)
    workload = Workload("idle", 0, config, requests, eos_token_id=0, max_steps=MAX_STEPS)
    engine = BatchQueueEngineV033(_NeverSchedules(), _NoModel(), 2, abort=lambda req_ids: None)  # type: ignore[arg-type]
    added: list[str] = []
    outcome = run_busy_loop(engine, workload, lambda spec: added.append(spec.req_id), lambda req_id: None)
    return outcome, engine, added


def test_an_idle_run_with_nothing_to_come_ends_stuck_though_an_empty_batch_stays_queued() -> None:
    outcome, engine, _ = _idle_run()
    assert engine.batch_queue and engine.batches_in_flight() == 0     # the queued empty batch is there
    assert (outcome.ending, outcome.unfinished) == ("stuck", ["a"])
    assert outcome.steps <= 2 * IDLE_STEPS_FOR_STUCK < MAX_STEPS          # not run on to the step limit


def test_an_idle_run_steps_through_to_an_input_to_come_then_ends_stuck() -> None:
    late = RequestSpec("b", (1, 2, 3), max_tokens=1, arrival_step=60, abort_step=None, eos_probability=0.0,
                       ignore_eos=True)
    outcome, engine, added = _idle_run((late,))
    assert added == ["b"]
    # each step took its empty batch (no jump over the queue to step 60), then the idle steps ended it
    assert engine.scheduler.calls == outcome.steps and 60 < outcome.steps <= 60 + 2 * IDLE_STEPS_FOR_STUCK
    assert outcome.ending == "stuck"


def test_an_idle_an_input_ends_before_the_count_is_left_for_the_replay_to_judge() -> None:
    # two idle steps, then an arrival: too short for the count, so no stall
    # yet; the replay asks vLLM without that input (run_endings.py `short_idle`)
    soon = RequestSpec("b", (1, 2, 3), max_tokens=1, arrival_step=2, abort_step=None, eos_probability=0.0,
                       ignore_eos=True)
    outcome, _, added = _idle_run((soon,))
    assert added == ["b"] and outcome.ending == "stuck"
    assert outcome.short_idles == [{"step": 0, "until": 2, "unfinished": ["a"], "batches": 0}]
    assert outcome.stalls == []


def test_an_idle_that_begins_at_an_arrivals_step_is_left_for_the_replay_to_judge() -> None:
    # b arrives at step 0, whose schedule() sees it and forms nothing; c at
    # step 1 ends that one-step idle: the busy loop's count (an input is new
    # work) is 0 there, the quiet count 1 (seed 391 index 51, IdleCount)
    now = RequestSpec("b", (1, 2, 3), max_tokens=1, arrival_step=0, abort_step=None, eos_probability=0.0,
                      ignore_eos=True)
    soon = RequestSpec("c", (1, 2, 3), max_tokens=1, arrival_step=1, abort_step=None, eos_probability=0.0,
                       ignore_eos=True)
    outcome, _, added = _idle_run((now, soon))
    assert added == ["b", "c"] and outcome.ending == "stuck"
    assert outcome.short_idles == [{"step": 0, "until": 1, "unfinished": ["a"], "batches": 0}]


class _Settled:
    """An engine with no KV transfer or grammar to settle."""

    def transfers_in_flight(self) -> int:
        return 0

    def grammars_compiling(self) -> bool:
        return False


def test_an_input_before_the_steps_schedule_starts_a_quiet_idle_one_handed_to_the_step_ends_it() -> None:
    idle = IdleCount(steps=2, quiet=2)
    idle.after_step(_Settled(), progressed=False, handed=True, handed_in_step=False)
    assert (idle.steps, idle.quiet) == (0, 1)          # schedule() saw the input and formed nothing
    idle.after_step(_Settled(), progressed=False, handed=False, handed_in_step=False)
    assert (idle.steps, idle.quiet) == (1, 2)
    idle.after_step(_Settled(), progressed=False, handed=True, handed_in_step=True)
    assert (idle.steps, idle.quiet) == (0, 0)          # an abort applied after schedule(): new work
    idle.after_step(_Settled(), progressed=True, handed=False, handed_in_step=False)
    assert (idle.steps, idle.quiet) == (0, 0)


def test_no_short_idle_without_an_input_due() -> None:
    outcome, _, _ = _idle_run()
    assert outcome.short_idles == [] and outcome.ending == "stuck"


def test_a_short_idle_is_a_stall_only_if_the_run_without_its_input_stays_idle() -> None:
    idle = {"step": 3, "until": 5, "unfinished": ["r0"], "batches": 2}
    batches = [{"r1": 4}, {"r1": 1}, {"r0": 9}]               # the run's: r0 admitted after the input
    assert stays_idle(idle, {"ending": "stuck", "batches": batches[:2]}, batches)
    assert not stays_idle(idle, {"ending": "done", "batches": batches[:2]}, batches)
    # stuck, but the wait of a parked session's client: no stall (replay.py `findings`)
    assert not stays_idle(idle, {"ending": "stuck", "batches": batches[:2], "left_to_clients": ["r3"]}, batches)
    # it formed a batch after the idle by itself (a prefill cadence's step), then stuck elsewhere
    assert not stays_idle(idle, {"ending": "stuck", "batches": batches[:2] + [{"r0": 9}]}, batches)
    # not the same run up to the idle
    assert not stays_idle(idle, {"ending": "stuck", "batches": [{"r1": 4}, {"r1": 2}]}, batches)


def test_the_idle_an_input_ends_is_read_as_a_stall_where_the_loop_steps_through_it() -> None:
    # an empty batch stays queued, so the loop takes each step to the input
    # (no fast-forward); the input ends the idle: one stall, from the start
    late = RequestSpec("b", (1, 2, 3), max_tokens=1, arrival_step=60, abort_step=None, eos_probability=0.0,
                       ignore_eos=True)
    outcome, _, _ = _idle_run((late,))
    assert outcome.stalls == [{"step": 0, "until": 60, "unfinished": ["a"]}]
