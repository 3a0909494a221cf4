"""vLLM 0.33/0.34's local prefill cadence: `SchedulerConfig.
prefill_schedule_interval` > 1 on an engine without data parallelism
(`Scheduler.__init__`: `local_prefill_interval`), so that decodes run in
longer uninterrupted stretches.

What vLLM does (`Scheduler.schedule`, both versions alike):

* A call **defers prefills** when fewer than `interval` executed steps have
  passed since the last step that carried a prefill (`(num_executed_steps +
  1) - last_prefill_step < local_prefill_interval`), some running request is
  not a prefill chunk (there is a decode to run instead), and the last
  release did not leave the waiting queue backed up (`not
  prefill_capacity_bound`: the escape of #44558, without which a loaded
  engine holds prefill for interval - 1 of every interval steps and its
  waiting queue grows without bound).
* While deferring, the running loop skips a request whose last schedule left
  it a prefill chunk (`is_prefill_chunk`: set for every scheduled request in
  `_update_after_schedule`, `num_computed_tokens < num_tokens +
  num_output_placeholders`), and the waiting loop stops (`break`) at a
  request with more than one token left to compute (`num_computed_tokens <
  num_tokens - 1`, its prefix hit counted: a full hit or a resumption with
  one token left is admitted).
* A call that did not defer records, after its waiting loop, whether the
  queue stayed backed up: `prefill_capacity_bound = num_waiting >
  len(deferred_waiting)` (`get_request_counts`; `deferred_waiting` holds the
  waiting requests the loop skipped, or that wait in a blocked status, until
  they are admitted).
* A call that scheduled tokens is an executed step (`num_executed_steps +=
  1`); one that carried a prefill (a running prefill chunk,
  `prefill_scheduled`, or an admission with more than one token to compute,
  `prefill_admitted`) restarts the interval (`last_prefill_step =
  num_executed_steps`).

The abstraction: only `(num_executed_steps + 1) - last_prefill_step <
interval` is read, so the state keeps `State.prefill_hold`, the executed
steps the hold still lasts: interval - 1 after a prefill-carrying step, one
less per executed step, floored at 0 (a call defers iff it is > 0). It
starts at 0 (vLLM starts `last_prefill_step` a full interval back: "the first
step is never gated"). `Request.deferred_waiting` is vLLM's set membership.
`Request.is_prefill_chunk` is kept, not derived from the counters: with no
entry in flight a prefill chunk that stopped one token short of the prompt
looks like a decode, and the cadence's gate reads the flag on every running
request, so it must be exact (drafts.py's padding rule reads it too, and
keeps it with drafts under the profiles that pad).

Beside the other features (docs/request-states.md, "Beside reset and
pause, grammars and sessions"): `deferred_waiting` also takes a request
enqueued in a blocked status (`_enqueue_waiting_request`: a grammar to wait
for, a parked session; `note_enqueued`), every member sits in `waiting` or
`kv_holding`, and a session's next turn meets the same gate with its
computed tokens (schedule.py). A pause or a reset needs no hook: PAUSED_ALL
runs no waiting loop, PAUSED_NEW's records the bound over a `waiting` it
never walked, and a reset's preemptions touch neither hold nor bound.

Beside a KV connector (docs/request-states.md, "Beside the KV connector"):
the loop's skips (a load still in flight, a parked load, the LoRA cap)
join `deferred_waiting` (`skip_request`), so a parked load is deferred
until admitted and never backs the queue up; an async load starts in a
held call (the `load_kv_async` branch comes before the gate, and
`num_new_tokens = 0` is no prefill: it never restarts the hold); a sync
load's admission, and a landed load's once promoted, meet the gate with
their computed tokens (the load's counted): a held call stops there, a
load that left one token is admitted and restarts nothing. A request
rolled back by a failed load keeps the `is_prefill_chunk` its last
schedule left (vLLM resets it only in `_update_after_schedule`), so its
recompute is not held as a chunk. vLLM 0.34's cache-aware reorder does not
run in a call that defers (admission_order.py).

Abstracted away: the data-parallel throttle (`throttle_prefills`, driven by
the DP engine core; one engine here, so never).
"""

from __future__ import annotations

from dataclasses import replace

from .config import Config
from .drafts import keeps_prefill_chunk_flag
from .state import State, Status


def is_on(cfg: Config) -> bool:
    """The cadence is in force: vLLM 0.33/0.34 with an interval above 1."""
    return cfg.rules.prefill_cadence and cfg.prefill_schedule_interval > 1


def defers_prefills(state: State, cfg: Config) -> bool:
    """`defer_prefills` at the start of a call (on the state before it)."""
    if not is_on(cfg) or state.prefill_capacity_bound or state.prefill_hold == 0:
        return False
    return any(not state.requests[r].is_prefill_chunk for r in state.running)


def skips_running(state: State, r: int, defers: bool) -> bool:
    """The running loop skips a prefill chunk while the call defers prefills."""
    return defers and state.requests[r].is_prefill_chunk


def stops_admission(state: State, r: int, computed: int, defers: bool) -> bool:
    """The waiting loop stops at a request with more than one token left to
    compute (`computed`: what it holds, its prefix hit included)."""
    return defers and computed < state.requests[r].num_tokens - 1


def note_skipped(state: State, cfg: Config, r: int) -> State:
    """The waiting loop skipped waiting request r: it joins `deferred_waiting`."""
    return state.with_request(r, deferred_waiting=True) if is_on(cfg) else state


def note_all_skipped(state: State, cfg: Config, skipped: set[int]) -> State:
    """The connector's waiting loop skipped (or parked) each of `skipped`:
    each joins `deferred_waiting` (vLLM's `skip_request`)."""
    for r in sorted(skipped):
        state = note_skipped(state, cfg, r)
    return state


def note_enqueued(state: State, cfg: Config, r: int) -> State:
    """`_enqueue_waiting_request`: r joins a waiting queue (on arrival, or a
    streaming session's stop) and is in `deferred_waiting` iff its status
    blocks it (`_is_blocked_waiting_status`: a grammar still to be looked at,
    a session waiting for input). A stopped session leaves the set first
    (`update_from_output`: `deferred_waiting.difference_update(
    stopped_preempted_reqs)`; a running one was never in it)."""
    if not is_on(cfg):
        return state
    blocked = state.requests[r].status in (Status.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR,
                                           Status.WAITING_FOR_STREAMING_REQ, Status.WAITING_FOR_REMOTE_KVS)
    return state.with_request(r, deferred_waiting=blocked)


def after_waiting_loop(state: State, cfg: Config, defers: bool) -> State:
    """A call that did not defer records whether the queue stayed backed up:
    `get_request_counts()`'s waiting count (`waiting` and
    `kv_holding_waiting`) against `len(deferred_waiting)`, whose members all
    sit in one of the two (each leaves the set when admitted or finished)."""
    if not is_on(cfg) or defers:
        return state
    queued = state.waiting + state.kv_holding
    num_deferred = sum(1 for r in queued if state.requests[r].deferred_waiting)
    return replace(state, prefill_capacity_bound=len(queued) > num_deferred)


def carries_prefill(state: State, r: int, computed: int, admitted: bool) -> bool:
    """Whether r's entry restarts the interval: a running request its last
    schedule left a prefill chunk, or an admission with more than one token
    to compute (the deferral's own test: `prefill_admitted`)."""
    if admitted:
        return computed < state.requests[r].num_tokens - 1
    return state.requests[r].is_prefill_chunk


def mark_prefill_chunk(state: State, cfg: Config, r: int) -> State:
    """`_update_after_schedule`: scheduled request r's `is_prefill_chunk`, on
    its counter just advanced and before async scheduling adds this entry's
    placeholders; admitted, it has left `deferred_waiting`. Kept under the
    cadence and wherever the padding rule reads it (drafts.py)."""
    if not is_on(cfg) and not keeps_prefill_chunk_flag(cfg):
        return state
    req = state.requests[r]
    return state.with_request(r, is_prefill_chunk=req.num_computed < req.num_tokens + req.placeholders,
                              deferred_waiting=False)


def after_schedule(state: State, cfg: Config, executed: bool, carried_prefill: bool) -> State:
    """Count the executed step (one that scheduled tokens) and restart the
    hold after one that carried a prefill."""
    if not is_on(cfg):
        return state
    hold = max(0, state.prefill_hold - 1) if executed else state.prefill_hold
    if carried_prefill:
        hold = cfg.prefill_schedule_interval - 1
    return replace(state, prefill_hold=hold)


# --- "sometimes" targets (spec/sometimes.py): what the cadence models must reach


def prefill_held(state: State, cfg: Config, r: int) -> bool:
    """The next call defers prefills while waiting request r waits."""
    return r in state.waiting and defers_prefills(state, cfg)


def held_with_nothing_to_run(state: State, cfg: Config, r: int) -> bool:
    """The next call defers prefills while r waits, and no running request has a token it could schedule (its token in flight, or, under async scheduling, its decode stagger pending): the step idles the pipeline."""
    return prefill_held(state, cfg, r) and all(state.num_new_tokens(q) == 0 or state.requests[q].decode_countdown > 1
                                               for q in state.running)


def backed_up_release(state: State, cfg: Config, r: int) -> bool:
    """The last release left the waiting queue backed up while r waits: the hold is lifted."""
    return r in state.waiting and is_on(cfg) and state.prefill_capacity_bound and state.prefill_hold > 0


# --- beside a KV connector: transitions (`Sometimes.on_step`) the pair's models must take


def load_parked_while_held(before: State, after: State, action: object, cfg: Config, r: int) -> bool:
    """A call that defers prefills starts r's async KV load (the load computes nothing: not held)."""
    return (defers_prefills(before, cfg) and before.requests[r].status is not Status.WAITING_FOR_REMOTE_KVS
            and after.requests[r].status is Status.WAITING_FOR_REMOTE_KVS)


def landed_load_held(before: State, after: State, action: object, cfg: Config, r: int) -> bool:
    """A call that defers prefills promotes r's landed load and stops there: more than one token left."""
    req = after.requests[r]
    return (defers_prefills(before, cfg) and before.requests[r].status is Status.WAITING_FOR_REMOTE_KVS
            and req.status is Status.WAITING and req.num_computed < req.num_tokens - 1)


def one_token_load_admitted_while_held(before: State, after: State, action: object, cfg: Config, r: int) -> bool:
    """A call that defers prefills admits r, whose KV connector offers all its tokens but the last."""
    req = after.requests[r]
    return (defers_prefills(before, cfg) and r not in before.running_set and r in after.running_set
            and req.external_hit >= req.num_tokens - 1 > 0)


def carry_empty_call(state: State, called: State) -> State:
    """What an empty `schedule()` call leaves of the cadence (`called`: the
    spec's state after that call): the capacity-bound flag its waiting loop
    recorded and the requests it skipped; the hold does not move (no step
    was executed)."""
    for r in called.waiting + called.kv_holding:
        if called.requests[r].deferred_waiting and r < len(state.requests):
            state = state.with_request(r, deferred_waiting=True)
    return replace(state, prefill_capacity_bound=called.prefill_capacity_bound)
