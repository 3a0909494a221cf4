"""The prefill cadence's properties (cadence.py), each a property of one
`schedule` step, stated on the batch the step forms:

* CAD1_deferred_call_carries_no_prefill: a call that defers prefills
  schedules no prefill: no running request its last schedule left a prefill
  chunk, not even one a priority preemption takes back out of the batch
  later in the call (`Scheduled.taken_back`), no admission with more than
  one token to compute (vLLM 0.33/0.34 `Scheduler.schedule`: the running
  loop's skip and the waiting loop's `break`).
* CAD2_backed_up_queue_not_held: a call made while the last release left
  the waiting queue backed up (`prefill_capacity_bound`) forms the batch the
  same call forms without a cadence (the saturation guard of vLLM PR #44558:
  "when an admitting step can't drain the waiting prefill queue, throttling
  is suppressed").

* CAD3_hold_restarts_after_prefill: after a call, the hold is interval - 1
  if the call scheduled a prefill (a running prefill chunk, or an admission
  with more than one token left to compute: the deferral's own test, which
  vLLM's `prefill_admitted` must use), else one less after an executed step
  (floored at 0), else unchanged. A running prefill chunk counts even when
  a priority preemption took it back out of the batch later in the call
  (`Scheduled.taken_back`): vLLM 0.33/0.34 `Scheduler.schedule` sets
  `prefill_scheduled` as it schedules the chunk, and the hand-back
  (`scheduled_running_reqs.remove`) restores the budget but not the flag,
  so `last_prefill_step` is stamped all the same. The executed step is
  counted on what stays in the batch (`total_num_scheduled_tokens`).

Stated against a second computation, not the cadence's own functions: CAD2
compares with the spec's step under `prefill_schedule_interval = 1`.
"""

from __future__ import annotations

from dataclasses import replace

from .cadence import is_on
from .config import Config
from .schedule import Scheduled, schedule
from .state import State


def cad1_deferred_call_carries_no_prefill(before: State, scheduled: Scheduled, cfg: Config) -> bool:
    """CAD1_deferred_call_carries_no_prefill: a call made within the interval, with a running request that is not a prefill chunk and the queue not backed up, schedules no running prefill chunk (kept in its batch or taken back by a priority preemption) and admits no request with more than one token left to compute."""
    held = (is_on(cfg) and before.prefill_hold > 0 and not before.prefill_capacity_bound
            and any(not before.requests[r].is_prefill_chunk for r in before.running))
    if not held:
        return True
    if any(before.requests[r].is_prefill_chunk for r in scheduled.taken_back):
        return False
    for e in scheduled.entries:
        req = before.requests[e.req]
        if e.req in before.running_set and req.is_prefill_chunk:
            return False
        if e.req not in before.running_set and e.cached < req.num_tokens - 1:
            return False
    return True


def cad2_backed_up_queue_not_held(before: State, scheduled: Scheduled, cfg: Config) -> bool:
    """CAD2_backed_up_queue_not_held: a call made while the last release left the waiting queue backed up forms the batch (entries and preemptions) the same call forms without the cadence."""
    if not is_on(cfg) or not before.prefill_capacity_bound:
        return True
    plain = schedule(before, replace(cfg, prefill_schedule_interval=1))
    if plain is None:
        return not scheduled.entries and not scheduled.preempted
    return (scheduled.entries, scheduled.preempted) == (plain.entries, plain.preempted)


def _carries_prefill(before: State, scheduled: Scheduled) -> bool:
    """The call scheduled a prefill: an entry of its batch, or a running
    request it took back (every one was a running entry: only the running
    loop preempts, and the waiting loop does not run after a preemption)."""
    if any(before.requests[r].is_prefill_chunk for r in scheduled.taken_back):
        return True
    for e in scheduled.entries:
        req = before.requests[e.req]
        if (req.is_prefill_chunk if e.req in before.running_set else e.cached < req.num_tokens - 1):
            return True
    return False


def cad3_hold_restarts_after_prefill(before: State, scheduled: Scheduled, cfg: Config) -> bool:
    """CAD3_hold_restarts_after_prefill: after a call the hold is interval - 1 if it scheduled a prefill (a running prefill chunk, kept in its batch or taken back by a priority preemption, or an admission with more than one token left to compute), else one less after a call that scheduled tokens (floored at 0), else unchanged."""
    if not is_on(cfg):
        return True
    if _carries_prefill(before, scheduled):
        want = cfg.prefill_schedule_interval - 1
    else:
        want = max(0, before.prefill_hold - 1) if scheduled.entries else before.prefill_hold
    return scheduled.state.prefill_hold == want
