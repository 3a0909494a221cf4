"""The engine loop around the scheduler: at each engine step vLLM's engine
core schedules, completes the oldest batch, or waits for input. This module
states what a correct engine does, as two named properties, and models each
version's own loop (its profile's constants) so that the loops can be searched.

Properties of a correct engine (checked by check-trace on every trace that
numbers engine steps, and by the engine search, verification/explicit/engine.py):

* **E-a `Ea_no_wait_in_flight`**: the engine never waits for input while a
  batch is in flight (its output would be applied only when some input
  happens to arrive: vLLM 0.8.x's `run_busy_loop` blocks in
  `_process_input_queue` while `scheduler.has_requests()` is false, so an
  aborted request's batch stays in flight until the next request comes).
* **E-b `Eb_complete_only_when_needed`**: the engine completes the oldest
  batch instead of scheduling only when the batch queue is full or, on the
  spec's counters, nothing can be scheduled (the step's `schedule()` would
  form no batch with tokens). "The spec's counters" are the true ones: under
  the one-batch-per-request policy the engine's gate is computed from the
  requests that really have a live entry in flight, not from a set that may
  hold a stale id (vLLM 0.8.4's `scheduled_req_ids` kept a preempted
  request, so `get_num_unscheduled_requests()` said 0 and the engine
  completed a batch where it would have resumed that request).

Both are judged at the engine's decision: the state at the start of the step
(after the inputs handed over before it), before the inputs a version takes
in the middle of a step (`Profile.mid_step_inputs`: those land between the
step's `schedule()` and the completion, and the engine decided without them).

Each version's loop, read from `Profile` at one seam (`loop_of`):
* `waits_with_batch_in_flight` (0.8.4, 0.8.5 `EngineCoreProc.run_busy_loop`):
  the engine waits while no request is unfinished, whatever is in flight;
  otherwise (0.33 `EngineCoreProc.has_work`) only with the queue empty too;
* `empty_batches` (0.33 `EngineCore.step_with_batch_queue`): `schedule()` on
  every step while a request is unfinished, its output queued even when
  empty; the step completes the oldest only when the queue is then full or
  nothing ran and no request is left; else (0.8.x) `schedule()` while the
  queue has room (and 0.8.4's gate is open), completing the oldest when the
  call formed no batch with tokens;
* `mid_step_inputs`: the input kinds the engine handles mid-step.

Abstracted away: time (a wait is one action, not a duration; an input wakes
the engine), the model's latency (a batch's output is ready when the engine
asks for it), the executor and output queues, data parallelism, structured
outputs' deferred sampling, and `has_finished_requests` (finished ids not yet
flushed to the workers keep 0.8.x's engine stepping one step longer: the
spec's `has_requests` is "some request is unfinished").
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .config import Config
from .reset_pause import num_unfinished_requests
from .schedule import schedule
from .state import Fate, State

E_A = "Ea_no_wait_in_flight"
E_B = "Eb_complete_only_when_needed"


@dataclass(frozen=True)
class EngineLoop:
    """One version's engine-core loop, as far as the scheduler can see it."""

    waits_with_batch_in_flight: bool
    empty_batches: bool
    mid_step_inputs: tuple[str, ...]


def loop_of(cfg: Config) -> EngineLoop:
    """The one seam where the engine loop is read from the profile."""
    rules = cfg.rules
    return EngineLoop(rules.waits_with_batch_in_flight, rules.empty_batches, tuple(rules.mid_step_inputs))


def token_batches_in_flight(state: State) -> int:
    """Batches in flight that carry tokens (an empty batch returns nothing)."""
    return sum(1 for batch in state.in_flight if batch)


def has_requests(state: State) -> bool:
    """`Scheduler.has_requests()`, as the spec sees it: some request is
    unfinished, as `get_num_unfinished_requests` counts them (none under
    PAUSED_ALL, whatever is in flight: reset_pause.py)."""
    return num_unfinished_requests(state) > 0


def with_true_in_flight_set(state: State, cfg: Config) -> State:
    """The state with the one-batch-per-request in-flight set recomputed from
    the batches (the requests with a live entry in flight): the spec's true
    counters, whatever a scheduler's own set says. A no-op under continue-prefill."""
    if cfg.continue_prefill:
        return state
    live = frozenset(e.req for batch in state.in_flight for e in batch if e.fate is Fate.LIVE)
    return state if live == state.scheduled_ids else replace(state, scheduled_ids=live)


def can_schedule_tokens(state: State, cfg: Config) -> bool:
    """Whether the step's `schedule()` would form a batch with tokens, on the
    spec's true counters (queue room and 0.8.4's gate included)."""
    scheduled = schedule(with_true_in_flight_set(state, cfg), cfg)
    return scheduled is not None and bool(scheduled.entries)


def may_wait(state: State) -> bool:
    """E-a: waiting for input is correct only with no batch with tokens in flight."""
    return token_batches_in_flight(state) == 0


def may_complete(decision: State, cfg: Config) -> bool:
    """E-b, on the state at the engine's decision: completing the oldest batch
    instead of scheduling is correct only when the batch queue is full or,
    on the spec's counters, nothing with tokens can be scheduled."""
    return len(decision.in_flight) >= cfg.queue_depth or not can_schedule_tokens(decision, cfg)


def corrected(loop: EngineLoop) -> EngineLoop:
    """The loop with vLLM 0.33's busy-loop rule (`EngineCoreProc.has_work`
    counts the batch queue): what 0.8.x's loop becomes once it keeps E-a."""
    return replace(loop, waits_with_batch_in_flight=False)


def loop_waits(state: State, loop: EngineLoop) -> bool:
    """Whether the loop blocks on input here (`_process_input_queue`): no
    request unfinished and, unless it waits with batches in flight (0.8.x),
    nothing in the batch queue."""
    if has_requests(state):
        return False
    return loop.waits_with_batch_in_flight or not state.in_flight


def loop_calls_schedule(state: State, cfg: Config, loop: EngineLoop) -> bool:
    """Whether the loop's step calls `schedule()`: 0.33 whenever a request is
    unfinished (the queue always has room at a step's start); 0.8.x while
    the queue has room (0.8.4's gate is the spec's `is_schedule_enabled`,
    which reads the scheduler's own in-flight set)."""
    if loop.empty_batches:
        return has_requests(state)
    return len(state.in_flight) < cfg.queue_depth


def loop_completes_after(scheduled_tokens: bool, after: State, cfg: Config, loop: EngineLoop) -> bool:
    """Whether the loop's step, once its `schedule()` part is done (the state
    `after`), goes on to complete the oldest batch: 0.8.x when it formed no
    batch with tokens and a batch is in flight; 0.33 when the queue is now
    full, or when it ran nothing and no request is left."""
    if not after.in_flight:
        return False
    if loop.empty_batches:
        return len(after.in_flight) >= cfg.queue_depth or not (scheduled_tokens or has_requests(after))
    return not scheduled_tokens
