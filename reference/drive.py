"""How an engine is driven: the engine-loop variant of each vLLM version, and
the one drive loop ("step until nothing can move") that the reference
engine's `run()`, the runtime's `generate()` and the serving simulator share.

An `EngineLoop` says what differs between vLLM versions' engine-core loops:
when a step may form a new batch and how many batches may be in flight.
`Engine` (engine.py) takes one; `drive()` steps that engine. Today's variants:

* `VLLM_0_8_5_LOOP`: `EngineCore.step_with_batch_queue`: schedule whenever
  the batch queue (depth = the number of pipeline stages) has room;
* `VLLM_0_8_4_LOOP`: the same, gated on `get_num_unscheduled_requests() > 0`
  (schedule only while some request has no batch in flight), which goes with
  the one-batch-per-request policy;
* `VLLM_0_33_LOOP`: 0.33.0's `EngineCore.step_with_batch_queue`
  (`enqueues_empty_batches`, read by `Engine.step`): `schedule()` on every
  call while the scheduler `has_requests()`, the output queued even with 0
  tokens (an empty batch takes a slot and is completed like any other); the
  call returns without completing iff the queue has room and it ran tokens or
  requests are left; otherwise it completes the oldest batch. Its busy loop
  (`EngineCoreProc.has_work`) keeps stepping while batches are in flight.

* `VLLM_0_33_ASYNC_LOOP`: the same `EngineCore.step_with_batch_queue` under
  asynchronous scheduling with the V2 model runner: the queue is K + 1 deep
  (`EngineCore.__init__`: `batch_queue_size = vllm_config.
  max_concurrent_batches`, which `VllmConfig.max_concurrent_batches` makes
  `pipeline_parallel_size + 1` when `scheduler_config.async_scheduling` and
  `use_v2_model_runner`). The step itself is unchanged: it does not wait for
  a batch's tokens before scheduling the next (the scheduler's output
  placeholders stand in for them), and without structured outputs the
  deferred sampling (`pending_structured_output_tokens`) never happens.

Every loop here keeps the two properties of a correct engine (spec/engine.py,
E-a and E-b): `drive()` waits for an arrival only when `_has_work` is false,
which counts the batches in flight (0.33's `EngineCoreProc.has_work`; vLLM
0.8.x's busy loop waits while no request is unfinished, whatever is in
flight: the differential's named deviation `engine_blocked_in_flight`), and
`Engine.step` completes the oldest batch only when the queue is full or the
step formed no batch. vLLM 0.34 (`vllm-0.34`, `vllm-0.34-async`) runs 0.33's
loop: its `EngineCoreProc._wait_for_output` may also take an arrival or an
abort while a step's output is awaited, and either side of that wait is
legal (`Profile.mid_step_inputs`); the reference takes every input between
steps, which is one of the two.

What differs between the callers of the loop is passed in as hooks, never
copied: where requests come from and on which clock (`Arrivals`: by engine
step for the runtime, by send time on a virtual or wall clock for the
simulator and the live benchmark, none for `Engine.run`), what to do with the
outputs of a completed batch (`on_outputs`: collect them, stream them to a
client, report progress), and what to do after every step (`after_step`: the
runtime fires its due aborts there, while a batch of theirs is in flight).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from .outputs import EngineCoreOutput
from .request import Request

# Two steps in a row that neither submitted nor completed anything, with no
# batch in flight and no arrival to wait for, mean the engine is stuck. One
# such step can be progress: a step that only preempted frees the blocks the
# next step admits with (the scheduler admits nothing in a step that preempted).
MAX_IDLE_STEPS = 2


class UnscheduledCount(Protocol):
    """What a loop's gate asks of the scheduler."""

    def get_num_unscheduled_requests(self) -> int: ...


@dataclass(frozen=True)
class EngineLoop:
    """One vLLM version's engine-core loop, as far as the scheduler can see it."""

    name: str
    # vLLM <= 0.8.4: form a batch only while some request has no batch in
    # flight (its scheduler then skips the ones that have one).
    gates_on_unscheduled_requests: bool
    # vLLM 0.33: schedule on every step while requests are left, queue empty
    # batches too, complete the oldest when the queue is full or nothing ran.
    enqueues_empty_batches: bool = False
    # vLLM 0.33 async scheduling with the V2 model runner: one batch more than
    # the pipeline's stages may be in flight (`VllmConfig.max_concurrent_batches`).
    extra_async_slot: bool = False

    def queue_depth(self, num_pipeline_stages: int) -> int:
        """How many batches may be in flight: one per pipeline stage (and one
        more under async scheduling)."""
        return num_pipeline_stages + 1 if self.extra_async_slot else num_pipeline_stages

    def can_schedule(self, num_in_flight_batches: int, queue_depth: int,
                     scheduler: UnscheduledCount) -> bool:
        """Whether this step may form a batch (else it waits for the oldest)."""
        if num_in_flight_batches >= queue_depth:
            return False
        if self.gates_on_unscheduled_requests:
            return scheduler.get_num_unscheduled_requests() > 0
        return True


VLLM_0_8_4_LOOP = EngineLoop("vllm-0.8.4", gates_on_unscheduled_requests=True)
VLLM_0_8_5_LOOP = EngineLoop("vllm-0.8.5", gates_on_unscheduled_requests=False)
VLLM_0_33_LOOP = EngineLoop("vllm-0.33", gates_on_unscheduled_requests=False,
                            enqueues_empty_batches=True)
VLLM_0_33_ASYNC_LOOP = EngineLoop("vllm-0.33-async", gates_on_unscheduled_requests=False,
                                  enqueues_empty_batches=True, extra_async_slot=True)
LOOPS: dict[str, EngineLoop] = {loop.name: loop
                                for loop in (VLLM_0_8_4_LOOP, VLLM_0_8_5_LOOP, VLLM_0_33_LOOP,
                                             VLLM_0_33_ASYNC_LOOP)}


def loop_for_policy(continue_prefill: bool) -> EngineLoop:
    """The loop each scheduling policy shipped with: continue-prefill came
    with 0.8.5's loop, one-batch-per-request with 0.8.4's gate."""
    return VLLM_0_8_5_LOOP if continue_prefill else VLLM_0_8_4_LOOP


class DrivenEngine(Protocol):
    """What the drive loop needs of an engine (`Engine` in engine.py)."""

    @property
    def num_in_flight_batches(self) -> int: ...

    def add_request(self, request: Request) -> None: ...

    def has_unfinished_requests(self) -> bool: ...

    def step(self) -> list[EngineCoreOutput] | None: ...


class Arrivals(Protocol):
    """Where requests come from, and the clock they arrive on."""

    def admit_due(self, engine: DrivenEngine, num_steps: int) -> None:
        """Add every request due by now (`num_steps`: engine steps so far)."""

    def has_pending(self) -> bool:
        """Whether some request has yet to arrive."""

    def wait_for_next(self) -> bool:
        """Idle until the next arrival is due. False when this clock moves
        only as the engine steps: the loop then takes an idle step."""


class NoArrivals:
    """Every request was added before the loop started."""

    def admit_due(self, engine: DrivenEngine, num_steps: int) -> None:
        pass

    def has_pending(self) -> bool:
        return False

    def wait_for_next(self) -> bool:
        return False


class ArrivalsByStep:
    """Each request is added once the engine has made a given number of
    steps; the clock is the step count, so waiting is stepping. `admitted`
    holds the requests added so far, in the order they were added."""

    def __init__(self, arrivals: Iterable[tuple[int, Request]]) -> None:
        self._pending = sorted(arrivals, key=lambda arrival: arrival[0])
        self.admitted: dict[str, Request] = {}

    def admit_due(self, engine: DrivenEngine, num_steps: int) -> None:
        while self._pending and self._pending[0][0] <= num_steps:
            _, request = self._pending.pop(0)
            engine.add_request(request)
            self.admitted[request.request_id] = request

    def has_pending(self) -> bool:
        return bool(self._pending)

    def wait_for_next(self) -> bool:
        return False


@dataclass(frozen=True)
class DriveResult:
    num_steps: int            # engine.step() calls


class EngineStuck(RuntimeError):
    """Requests unfinished, nothing schedulable, nothing in flight, no arrival pending."""


def drive(engine: DrivenEngine, *, arrivals: Arrivals | None = None,
          on_outputs: Callable[[list[EngineCoreOutput]], None] | None = None,
          after_step: Callable[[], None] | None = None,
          max_steps: int = 1_000_000) -> DriveResult:
    """Step `engine` until every request has arrived and finished and no batch
    is in flight. Requests are admitted between steps only (as vLLM's engine
    core takes new requests between steps). Raises `EngineStuck` when nothing
    can move, RuntimeError when more than `max_steps` steps would be needed."""
    arrivals = arrivals if arrivals is not None else NoArrivals()
    num_steps = 0
    num_idle_steps = 0
    while True:
        arrivals.admit_due(engine, num_steps)
        if not _has_work(engine):
            if not arrivals.has_pending():
                return DriveResult(num_steps)
            if arrivals.wait_for_next():
                continue
        if num_steps >= max_steps:
            raise RuntimeError(f"engine did not finish within {max_steps} steps")
        outputs = engine.step()
        num_steps += 1
        if outputs and on_outputs is not None:
            on_outputs(outputs)
        if after_step is not None:
            after_step()
        num_idle_steps = num_idle_steps + 1 if _was_idle(engine, outputs) else 0
        if num_idle_steps:
            _wait_or_give_up(arrivals, num_idle_steps)


def _has_work(engine: DrivenEngine) -> bool:
    return engine.has_unfinished_requests() or engine.num_in_flight_batches > 0


def _was_idle(engine: DrivenEngine, outputs: list[EngineCoreOutput] | None) -> bool:
    """Nothing submitted (a submitted batch would be in flight), nothing
    completed, nothing in flight, requests unfinished. vLLM 0.33's loop moves
    empty batches through its queue meanwhile: they do not count (a stuck
    0.33 engine spins on them), and draining them once every request has
    finished is the end of the run, not a stall."""
    in_flight = getattr(engine, "num_token_batches_in_flight", engine.num_in_flight_batches)
    return outputs is None and in_flight == 0 and engine.has_unfinished_requests()


def _wait_or_give_up(arrivals: Arrivals, num_idle_steps: int) -> None:
    """After an idle step only an arrival, or a step after a preemption, can help."""
    if arrivals.has_pending():
        arrivals.wait_for_next()
    elif num_idle_steps >= MAX_IDLE_STEPS:
        raise EngineStuck("engine stuck: unfinished requests, nothing schedulable, "
                          "nothing in flight")
