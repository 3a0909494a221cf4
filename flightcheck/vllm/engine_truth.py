"""The engine's own ground truth in a replay: what our copy of the engine
loop (engine.py) records, from vLLM's objects and never from a trace, about
the engine's choices that spec/engine.py's properties judge (E-a, E-b):

* `waits_in_flight`: each time the busy loop blocks on its input queue with
  batches with tokens in the batch queue (0.8.x's `_process_input_queue`
  waits while `scheduler.has_requests()` is false, whatever is in flight),
  from which engine step until which;
* `gated_completions`: each step at which vLLM 0.8.4's gate
  (`get_num_unscheduled_requests() > 0`) is closed and the step completes
  the oldest batch while `scheduled_req_ids` holds an id that no batch in
  flight carries for its request (no batch carries it, or the request was
  preempted since), with whether vLLM's own `schedule()`, on a copy of the
  scheduler without those ids, forms a batch with tokens (None: the
  scheduler could not be copied; `copy_errors` says why) and, where that
  call preempts, which requests (`would_preempt`).

verification/traces/ground_truth.py turns them into the events where a
correct checker must reject the trace. Standard library only.
"""

from __future__ import annotations

import copy
import sys
import types
from typing import Any


def note_wait(engine: Any, step: int, until: int) -> None:
    """The busy loop blocks on its input queue from engine step `step` until
    step `until` (its next input): noted when batches with tokens are in flight."""
    if engine.batches_in_flight():
        engine.waits_in_flight.append({"step": step, "until": until,
                                       "batches_in_flight": engine.batches_in_flight()})


def note_gated_completion(engine: Any) -> None:
    """0.8.4's gate is closed and the step is about to complete the oldest
    batch: noted when `scheduled_req_ids` holds stale ids, with what vLLM's
    `schedule()` would do without them (the copy writes no trace)."""
    scheduler = engine.scheduler
    marked = getattr(scheduler, "scheduled_req_ids", None)
    if marked is None or not hasattr(scheduler, "_fc_trace"):
        return                                 # not vLLM 0.8.4's recorder: no oracle to ask
    in_flight = {req_id for output, _ in engine.batch_queue for req_id in output.num_scheduled_tokens}
    running = {request.request_id for request in scheduler.running}
    # an id is stale when no batch in flight carries it, or when its request
    # was preempted since (the batch in flight carries an older incarnation)
    stale = sorted(req_id for req_id in marked if req_id not in in_flight or req_id not in running)
    if stale:
        probe = _probe_without(engine, stale)
        noted = {"step": engine.current_step, "stale": stale, "would_schedule": None if probe is None else probe[0]}
        # a call that forms nothing but preempts (0.8.4 `Scheduler.schedule`:
        # a running request not in flight finds no block and preempts from
        # the tail down to itself): noted, no finding (ground_truth.py, E-b)
        engine.gated_completions.append({**noted, "would_preempt": probe[1]} if probe and probe[1] else noted)


def _would_schedule_without(engine: Any, stale: list[str]) -> bool | None:
    """Whether vLLM's `schedule()`, on a copy of the scheduler whose
    `scheduled_req_ids` lacks `stale`, forms a batch with tokens; None when
    the scheduler cannot be copied."""
    probe = _probe_without(engine, stale)
    return None if probe is None else probe[0]


def _probe_without(engine: Any, stale: list[str]) -> tuple[bool, list[str]] | None:
    """`_would_schedule_without`, and the requests that copy's `schedule()`
    preempted (running before the call, PREEMPTED after it)."""
    scheduler = engine.scheduler
    trace = scheduler._fc_trace
    limit = sys.getrecursionlimit()
    try:
        scheduler._fc_trace = None
        sys.setrecursionlimit(max(limit, 100_000))
        twin = copy.deepcopy(scheduler, _shared_uncopyable(scheduler))
    except Exception as err:  # noqa: BLE001 -- an uncopyable scheduler: the oracle says it does not know
        engine.copy_errors.append(f"{type(err).__name__}: {err}")
        return None
    finally:
        scheduler._fc_trace = trace
        sys.setrecursionlimit(limit)
    _without_instance_overrides(twin)
    _without_instance_overrides(twin.kv_cache_manager)
    # (the block pool's `get_new_blocks` and `cache_full_blocks`: unwritten_kv_recording.py)
    pool = getattr(twin.kv_cache_manager, "block_pool", None)
    if pool is not None:
        _without_instance_overrides(pool)
    twin.scheduled_req_ids.difference_update(stale)
    running = list(getattr(twin, "running", ()))
    formed = twin.schedule().total_num_scheduled_tokens > 0
    return formed, sorted(r.request_id for r in running if getattr(r.status, "name", "") == "PREEMPTED")


def _without_instance_overrides(twin: Any) -> None:
    """Drop from a copied object the functions set on the original instance
    over its class's methods (the recorder's watch on
    `KVCacheManager.allocate_slots`, ground_truth.py, and on the block pool,
    unwritten_kv_recording.py): deepcopy shares a
    function, whose closure still calls the original's method, so the
    twin's `schedule()` would allocate blocks in vLLM's own manager (a
    request admitted in the probe then shows no new blocks when vLLM really
    admits it) and note observations in the original's ground truth."""
    for name, value in list(vars(twin).items()):
        if isinstance(value, types.FunctionType) and hasattr(type(twin), name):
            delattr(twin, name)


def _shared_uncopyable(scheduler: Any) -> dict[int, Any]:
    """A deepcopy memo that shares, rather than copies, each attribute of the
    scheduler that cannot be copied (queues, locks, publishers: none of which
    `schedule()` changes in a replay)."""
    memo: dict[int, Any] = {}
    for value in vars(scheduler).values():
        try:
            copy.deepcopy(value)
        except Exception:  # noqa: BLE001 -- shared instead
            memo[id(value)] = value
    return memo
