"""The priority scheduling policy: vLLM's `SchedulingPolicy.PRIORITY`
(`Config.scheduling_policy == "priority"`, `Profile.priority_policy`: 0.33 and 0.34,
the same code in both; docs/request-states.md, "Priority scheduling").

* The waiting queue is vLLM's `PriorityRequestQueue`: a heap ordered by
  `Request.__lt__`, priority first (lower runs first), then arrival time.
  Here `waiting` is kept sorted by that key (`rank`): a request joins at its
  place when it arrives and when it is preempted (`prepend_request` is a
  heap push). The waiting loop's skipped requests are put back with the
  same push, so iterating the sorted tuple and skipping in place is the
  loop's order.
* The running loop's victim is `max(running, key=(priority,
  arrival_time))` (`choose_victim`), not the tail: it may be a request the
  loop already scheduled in this call, whose entry, token budget, new
  blocks and scheduled drafts are handed back (`hand_back`); or one it
  visited and skipped (its tokens all in flight), before the current index,
  which then moves back by one (`victim_index < req_index`). A request that
  preempts itself leaves the loop at the next request instead of stopping it.
* `running` keeps admission order, as vLLM's list does.

The environment gives a request its priority at arrival (`Prompt.priority`,
a small domain per model). The arrival order is `State.arrivals`.

* With a KV connector (the profile's `priority_orders_kv_holding`,
  `priority_orders_async_kv`, read here only): `kv_holding` is a heap too,
  kept sorted by `rank` (`kv_holding_ranked`: a parked load joins at its
  place, not the tail), and the head of `async_kv_waiting` goes before
  `waiting`'s when it ranks first (`async_head_first`), not when it
  arrived first. The victim rule above does not change with a connector:
  the step fence's "a deferred free will not help" is asked of the
  priority victim (schedule.py `_victim_frees_at_once`).

Abstracted away: `Request.__lt__`'s last tie-breaks (request id, then
object identity: the spec's arrival order is total), and the encoder
budget a victim gives back (no encoder inputs here).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from .config import Config
from .state import State


class StepUnderConstruction(Protocol):
    """What `hand_back` reads and writes of `schedule`'s batch under
    construction (`schedule._Step`)."""

    state: State
    cfg: Config
    budget: int
    entries: list  # list[schedule.ScheduledEntry]
    taken_back: list  # list[int]: the requests handed back (schedule.Scheduled.taken_back)


def is_priority(cfg: Config) -> bool:
    return cfg.scheduling_policy == "priority"


def rank(state: State, r: int) -> tuple[int, int]:
    """`Request.__lt__`'s key: (priority, arrival)."""
    return state.requests[r].priority, state.arrivals.index(r)


def arrive_with_priority(state: State, cfg: Config, r: int, priority: int) -> State:
    """`Scheduler.add_request` under the priority policy: r keeps its
    priority and its arrival, and joins `waiting` at its place
    (`PriorityRequestQueue.add_request`). FCFS: nothing changes."""
    if not is_priority(cfg):
        return state
    if r not in state.arrivals:
        state = replace(state, arrivals=state.arrivals + (r,))
    return in_priority_order(state.with_request(r, priority=priority), cfg)


def in_priority_order(state: State, cfg: Config) -> State:
    """`waiting` as its heap yields it after a push onto it (a preemption,
    an arrival): sorted by `rank`. `kv_holding` is a heap of its own, which
    that push does not sift: it stays as it is, out of rank order too where
    a parked session took an input in it (`sessions.send_input`; hunt seed
    333 index 8: a preemption's push sorted it here, and a load went ahead
    of the session vLLM admitted). FCFS: unchanged."""
    return ranked(state, "waiting") if is_priority(cfg) else state


def kv_holding_in_rank_order(state: State, cfg: Config) -> State:
    """`kv_holding` as its heap yields it after a push onto it (a load
    started), where it is a heap (`kv_holding_ranked`); `waiting` as it is."""
    return ranked(state, "kv_holding") if kv_holding_ranked(cfg) else state


def ranked(state: State, queue: str) -> State:
    """The queue named (`waiting`, `kv_holding`) sorted by `rank`."""
    requests: tuple[int, ...] = getattr(state, queue)
    ordered = tuple(sorted(requests, key=lambda r: rank(state, r)))
    return state if ordered == requests else replace(state, **{queue: ordered})


def kv_holding_ranked(cfg: Config) -> bool:
    """`kv_holding_waiting` is a `PriorityRequestQueue` (`Scheduler.__init__`:
    `create_request_queue(self.policy)`; `Profile.priority_orders_kv_holding`)."""
    return is_priority(cfg) and cfg.rules.priority_orders_kv_holding


def async_head_first(state: State, cfg: Config, async_head: int, plain: int) -> bool | None:
    """`_next_waiting_queue` under the priority policy: `async_kv_waiting`'s
    head goes first when `async_head < head` (`Request.__lt__`: `rank`;
    `Profile.priority_orders_async_kv`). None: the FCFS rule (arrival time)
    applies."""
    if not (is_priority(cfg) and cfg.rules.priority_orders_async_kv):
        return None
    return rank(state, async_head) < rank(state, plain)


def choose_victim(state: State, cfg: Config) -> int:
    """The running loop's victim: the tail under FCFS, the running request
    of the largest (priority, arrival) under the priority policy."""
    if not is_priority(cfg):
        return state.running[-1]
    return max(state.running, key=lambda r: rank(state, r))


def to_tail(state: State, victim: int) -> State:
    """`running` with the victim moved last, the others in their order, so
    that a preemption (which takes the tail) takes it: the `del
    self.running[victim_index]` of vLLM's priority branch."""
    if state.running[-1] == victim:
        return state
    return replace(state, running=tuple(r for r in state.running if r != victim) + (victim,))


def index_after_removal(state: State, victim: int, i: int) -> int:
    """The running loop's index once the victim is removed from `running`:
    one less when the victim sat before it (`victim_index < req_index`,
    vLLM #49097), else the same."""
    return i - 1 if state.running.index(victim) < i else i


def hand_back(step: StepUnderConstruction, victim: int) -> None:
    """A victim the loop already scheduled in this call leaves the batch:
    its entry (its tokens, its drafts: `num_scheduled_tokens`,
    `scheduled_spec_decode_tokens`) is dropped and its tokens return to the
    budget (`token_budget += restored`). Its new blocks go back with its
    table in the preemption; its counter moves only at launch, so nothing
    else of the entry remains, but the call keeps having scheduled it
    (`taken_back`: vLLM's `prefill_scheduled` is not undone)."""
    kept = [e for e in step.entries if e.req != victim]
    if len(kept) == len(step.entries):
        return
    step.budget += sum(e.n + step.cfg.draft_input_slots for e in step.entries if e.req == victim)   # lookahead.py
    step.entries[:] = kept
    step.taken_back.append(victim)
