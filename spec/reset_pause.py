"""Reset and pause: two environment actions between engine steps, and what
the scheduler does under them (vLLM 0.33 and 0.34, `Config.reset_and_pause`).

* `reset(running)`: `Scheduler.reset_prefix_cache(reset_running_requests=
  running)`. With `running`, every running request is preempted, from the
  tail of `running` to its head (`self.running.pop()`, each prepended to
  `waiting`, so `waiting` starts with them in their running order), by
  `_preempt_request(drop_stale_output=True)`: under the priority policy
  `prepend_request` is a heap push, so each takes its place by rank
  (`PriorityRequestQueue.prepend_request`); its blocks freed, its tokens
  in flight become stale output in drop mode (`num_stale_output_tokens =
  num_in_flight_tokens`, `drop_stale_output`), its placeholders 0. Then
  `BlockPool.reset_prefix_cache`: when no block is held it drops every
  cached label (the free queue keeps its order); otherwise it fails and
  changes nothing (vLLM returns False). With `running` vLLM then raises
  (RuntimeError, after the preemptions, which stay): without a KV
  connector only a streaming session between turns holds blocks without
  running (sessions.py), and the reset leaves its blocks held, which RP4
  flags (docs/request-states.md, "Finding: a reset fails while a session
  waits for input"). With a KV connector (kv_fence.py) a preempted
  request's table goes behind the step fence while a batch of it is in
  flight (`_free_request_blocks`), and parked loads, an aborted load's
  table and a producer's finished requests hold theirs until their
  transfer is reported: each makes the reset fail, and RP4 flags it too
  (docs/vllm-kv-connector-findings.md, finding 3).
* `reset(running, connector)`: with `reset_connector` too, after the
  pool's reset (and only where vLLM did not raise) `reset_connector_cache`
  resets the KV connector's own cache (`KVConnectorBase_V1.reset_cache`;
  a no-op success without a connector; its False would make the call's
  result False, which the fabricated connector never returns). The
  connector forgets what it holds: every arrived request whose offer is
  not yet taken (`Load.NONE`) is offered 0 from then on (`external_hit`
  0, the ghost `Request.offer_reset` set); loads already started land as
  scheduled and sends go on; a request arriving later offers its own (the
  environment's choice at arrival: the store refills). Under vLLM 0.34's
  load limit a request keeps its place in `async_kv_waiting`
  (`may_load_async` is asked when it is enqueued, before the reset:
  `load_async` stays), where it is met and offered nothing.
* `set_pause(pause)`: `Scheduler.set_pause_state`. Under PAUSED_ALL
  `schedule()` takes a token budget of 0 (the running loop schedules
  nothing) and skips the waiting loop; under PAUSED_NEW the waiting loop
  looks only at `kv_holding_waiting` (landed loads are promoted and
  admitted, no load starts, nobody from `waiting` is admitted, a preempted
  request included; kv_loads.py). `get_num_unfinished_requests()`
  is 0 under PAUSED_ALL and counts only running (and KV-holding) requests
  under PAUSED_NEW, so the engine's `has_requests()` may be false while
  batches are still in flight: the engine must still complete them
  (`EngineCoreProc.has_work` counts the batch queue; spec/engine.py E-a).

Named properties (transition properties of the labelled actions):
* `RP1_paused_schedules_nothing`: under PAUSED_ALL a `schedule` forms no
  entry and preempts nobody; under PAUSED_NEW it schedules only requests
  that were RUNNING before it, or that hold KV blocks in `kv_holding` (a
  streaming session's next turn): no admission, no resumption.
* `RP2_reset_drops_in_flight`: after a reset with `running`, no request
  runs, and each one reset has every entry in flight marked (the ghost
  `Entry.reset`) and not LIVE, drop mode on, stale = in flight, no
  placeholders.
* `RP3_reset_output_never_applied`: a completion applies no output of an
  entry in flight at its request's reset (its request's outputs do not
  change by it).
* `RP4_prefix_cache_reset`: after a reset with `running` no block is held
  and no label is cached; without `running`, either that, or (a block was
  held) nothing changed. vLLM breaks it, and raises, when a streaming
  session between turns holds blocks (the reset above).
* `RP5_connector_reset_forgets_offers` (beside a KV connector): no
  request whose offer a reset of the connector's cache forgot is admitted
  with, or parks for, an external load.

Abstracted away: how the connector's store refills (its offers to later
arrivals are the environment's, as ever), the aux output connector's
reset (`aux_output_connector.reset()` after a successful reset), the
model runner's persistent batch (0.33's
`prev_step_scheduled_req_ids.clear()`), the engine's pause modes
("abort" is `abort` of every request then PAUSED_NEW; "keep" is
PAUSED_ALL; "wait" is PAUSED_NEW) and `clear_cache` (a `reset(True)` once
the engine is idle), encoder and multimodal caches, statistics and events.
"""

from __future__ import annotations

from dataclasses import replace

from . import blocks, priority
from .config import Config
from .kv_fence import release_table
from .state import Entry, Fate, Load, Pause, State, Status


# --- the actions


def reset(state: State, cfg: Config, running: bool, connector: bool = False) -> State | None:
    """`Scheduler.reset_prefix_cache(reset_running_requests=running, reset_connector=connector)`."""
    if not cfg.reset_and_pause:
        return None
    if running:
        while state.running:
            state = _preempt_dropping_output(state, cfg, state.running[-1])
        state = priority.in_priority_order(state, cfg)   # the priority heap: each pushed at its rank
        if any(state.pool.ref_counts):
            return state               # the pool's reset fails and vLLM raises, before the connector's reset
    after = _reset_prefix_cache(state)
    return _forget_offers(after) if connector and cfg.kv_connector is not None else after


def set_pause(state: State, cfg: Config, pause: Pause) -> State | None:
    """`Scheduler.set_pause_state(pause)`; disabled when it changes nothing."""
    if not cfg.reset_and_pause or state.pause is pause:
        return None
    return replace(state, pause=pause)


def _preempt_dropping_output(state: State, cfg: Config, victim: int) -> State:
    """`_preempt_request(victim, drop_stale_output=True)`: free, back to the
    head of `waiting`, its live entries orphaned (and marked as reset),
    its tokens in flight stale output to be dropped, no placeholders."""
    req = state.requests[victim]
    state = release_table(state, cfg, victim, req.block_table)     # `_free_request_blocks`: behind the fence
    state = replace(state, running=state.running[:-1], waiting=(victim,) + state.waiting,
                    scheduled_ids=state.scheduled_ids - {victim}, in_flight=tuple(
                        tuple(_orphan_at_reset(e) if e.req == victim else e for e in batch)
                        for batch in state.in_flight))
    return state.with_request(victim, status=Status.PREEMPTED, num_computed=0, num_drafts=0, block_table=(),
                              num_stale=req.num_in_flight, drop_stale=True, placeholders=0)


def _orphan_at_reset(e: Entry) -> Entry:
    """A reset request's entry: every one is marked; a live one is orphaned."""
    return replace(e, fate=Fate.ORPHANED if e.fate is Fate.LIVE else e.fate, reset=True)


def _reset_prefix_cache(state: State) -> State:
    """`BlockPool.reset_prefix_cache`: every label dropped when no block is
    held; otherwise nothing changes (it returns False)."""
    pool = state.pool
    if any(pool.ref_counts):
        return state
    return replace(state, pool=blocks.uncache(pool, tuple(range(len(pool.ref_counts)))))


def _forget_offers(state: State) -> State:
    """`reset_connector_cache`: the connector offers 0 to every arrived
    request whose offer is not taken (`Load.NONE`); `load_async` stays (its
    queue was chosen at its arrival)."""
    for r, q in enumerate(state.requests):
        if q.status.is_active and q.load is Load.NONE and q.external_hit > 0:
            state = state.with_request(r, external_hit=0, offer_reset=True)
    return state


# --- the scheduler's hooks


def runs_running_loop(state: State) -> bool:
    """`schedule()`'s running loop has a budget: not PAUSED_ALL."""
    return state.pause is not Pause.PAUSED_ALL


def runs_waiting_loop(state: State) -> bool:
    """`schedule()`'s waiting loop runs: not PAUSED_ALL. vLLM 0.33 and 0.34
    drain the requests that hold KV blocks (`kv_holding_waiting`) first, and
    under PAUSED_NEW only them (`takes_waiting_queue`): without a connector,
    the streaming sessions between turns (sessions.py)."""
    return state.pause is not Pause.PAUSED_ALL


def takes_waiting_queue(state: State) -> bool:
    """The waiting loop goes on from `kv_holding_waiting` to `waiting`: only
    UNPAUSED (`request_queue = self.waiting` only under UNPAUSED)."""
    return state.pause is Pause.UNPAUSED


def num_unfinished_requests(state: State) -> int:
    """`Scheduler.get_num_unfinished_requests()`: 0 under PAUSED_ALL, the
    running and KV-holding ones under PAUSED_NEW, else every active one;
    less, in both, the streaming sessions parked for their client's input
    (`num_waiting_for_streaming_input`, subtracted as vLLM 0.34 does, from
    `kv_holding_waiting`'s count under PAUSED_NEW even for a parked session
    that sits in `waiting`)."""
    if state.pause is Pause.PAUSED_ALL:
        return 0
    parked = sum(1 for q in state.requests if q.status.awaits_client)
    if state.pause is Pause.PAUSED_NEW:
        return len(state.running) + len(state.kv_holding) - parked
    return sum(1 for q in state.requests if q.status.is_active) - parked


def has_requests(state: State) -> bool:
    """`Scheduler.has_requests()`: an unfinished request by the count above,
    or (a KV connector's) finished request held for a transfer."""
    return num_unfinished_requests(state) > 0 or any(q.held for q in state.requests)


# --- the transition properties (labels in transitions.py: `Reset`, `SetPause`)


def rp1_paused_schedules_nothing(before: State, after: State, scheduled_entries: tuple, preempted: tuple) -> bool:
    """RP1: under PAUSED_ALL a schedule forms no entry and preempts nobody; under PAUSED_NEW it schedules only requests that were RUNNING before it or hold KV blocks in `kv_holding` (a streaming session's next turn): no admission, no resumption."""
    if before.pause is Pause.PAUSED_ALL:
        return not scheduled_entries and not preempted
    if before.pause is Pause.PAUSED_NEW:
        return all(before.requests[e.req].status is Status.RUNNING or e.req in before.kv_holding_set
                   for e in scheduled_entries)
    return True


def rp2_reset_drops_in_flight(before: State, after: State, running: bool) -> bool:
    """RP2: after a reset of the running requests none runs, and each one reset has every entry in flight marked as reset and not live, its stale output in drop mode equal to its tokens in flight, and no placeholders."""
    if not running:
        return True
    if after.running:
        return False
    for r in before.running:
        q, entries = after.requests[r], after.entries_of(r, fate=None)
        if any(e.fate is Fate.LIVE or not e.reset for e in entries):
            return False
        if entries and not q.drop_stale:
            return False
        if q.num_stale != q.num_in_flight or q.placeholders:
            return False
    return True


def rp3_reset_output_never_applied(before: State, after: State) -> bool:
    """RP3: a completion applies no output of an entry that was in flight at its request's reset: that request gains no token from it."""
    if not before.in_flight:
        return True
    return all(after.requests[e.req].num_output == before.requests[e.req].num_output
               for e in before.in_flight[0] if e.reset)


def rp4_prefix_cache_reset(before: State, after: State, running: bool) -> bool:
    """RP4: after a reset of the running requests no block is held and no label is cached; a reset without them clears every label or, when a block was held, changes nothing."""
    cleared = not any(after.pool.ref_counts) and all(label is None for label in after.pool.labels)
    if running:
        return cleared
    return cleared or (any(before.pool.ref_counts) and after.pool.labels == before.pool.labels)


def rp5_connector_reset_forgets_offers(before: State, after: State, scheduled_entries: tuple) -> bool:
    """RP5: no request whose offer a reset of the connector's cache forgot (the ghost `offer_reset`) is admitted with, or parks for, an external load."""
    forgotten = {r for r, q in enumerate(before.requests) if q.offer_reset}
    return (all(e.external == 0 for e in scheduled_entries if e.req in forgotten)
            and all(not after.requests[r].load.in_transfer for r in forgotten))
