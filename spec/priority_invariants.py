"""The priority policy's named properties (docs/request-states.md, "Priority
scheduling"), each checked only under `Config.scheduling_policy == "priority"`:

* PR1_waiting_in_priority_order (safety, a state invariant): `waiting` is in
  (priority, arrival) order, as vLLM's heap yields it, and every queued
  request's arrival is known.
* PR4_kv_holding_in_priority_order (safety, a state invariant; with a KV
  connector whose `kv_holding_waiting` is a heap): the waiting requests
  that hold KV blocks (parked and landed loads) are in (priority, arrival)
  order, so the waiting loop takes the first-ranked load first.
* PR2_victim_leaves_no_trace (safety, of a `schedule` step): a request the
  step preempted has no entry in the batch it forms (no tokens, no drafts:
  vLLM #23347, #28558), holds no block, and the batch stays within the
  token budget.
* PR3_running_loop_skips_nothing (progress, of a `schedule` step): once the
  step is formed, every request still running that was left out of the
  batch had nothing to schedule (its tokens in flight, the async guards, a
  prefill chunk the prefill cadence holds back: cadence.py), or the step's
  token budget is spent (vLLM #49097: a request skipped
  because the victim sat before the loop's index).

The step properties read the step's own record (`Scheduled`), as S12 does;
transitions.py labels them. Abstracted away: the KV connector (its fence
may stop the running loop: PR3 is not checked with one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import cadence, lookahead
from .config import Config
from .state import Request, State

if TYPE_CHECKING:
    from .schedule import Scheduled


def waiting_in_priority_order(s: State, cfg: Config) -> bool:
    """PR1: under the priority policy `waiting` is sorted by (priority, arrival), and every waiting or running request's arrival is recorded."""
    if cfg.scheduling_policy != "priority":
        return True
    arrived = set(s.arrivals)
    if not (s.waiting_set | s.running_set) <= arrived:
        return False
    keys = [(s.requests[r].priority, s.arrivals.index(r)) for r in s.waiting]
    return keys == sorted(keys)


def kv_holding_in_priority_order(s: State, cfg: Config) -> bool:
    """PR4: under the priority policy with a KV connector, the waiting requests that hold KV blocks (parked and landed loads, `kv_holding_waiting`) are sorted by (priority, arrival), and each one's arrival is recorded."""
    if cfg.scheduling_policy != "priority" or cfg.kv_connector is None or not cfg.rules.priority_orders_kv_holding:
        return True
    if not set(s.kv_holding) <= set(s.arrivals):
        return False
    keys = [(s.requests[r].priority, s.arrivals.index(r)) for r in s.kv_holding]
    return keys == sorted(keys)


def victim_leaves_no_trace(after: State, scheduled: Scheduled | None, cfg: Config) -> bool:
    """The step's record against PR2 (see the module's docstring)."""
    if scheduled is None or not scheduled.preempted:
        return True
    victims = set(scheduled.preempted)
    if any(e.req in victims for e in scheduled.entries):
        return False
    if any(after.requests[v].block_table for v in victims if v not in after.running_set):
        return False
    return sum(e.n for e in scheduled.entries) <= cfg.max_num_batched_tokens


def _nothing_to_schedule(before: State, q: Request, r: int, cfg: Config) -> bool:
    """r's own reasons to be passed over by the running loop, read from its
    record (which a step that leaves r out does not change): the async
    max_tokens guard, the decode stagger, one batch per request, no new
    token (all in flight), or no room below max_model_len."""
    if q.placeholders > 0 and q.num_computed + 2 - q.placeholders >= q.prompt_len + q.max_tokens:
        return True
    if q.decode_countdown > 0:
        return True
    if not cfg.continue_prefill and r in before.scheduled_ids:
        return True
    new_tokens = q.num_tokens_with_spec + q.placeholders - q.num_computed
    room = cfg.max_model_len - q.num_computed - cfg.rules.sampled_token_slot
    return new_tokens <= 0 or room <= 0


def running_loop_skips_nothing(before: State, after: State, scheduled: Scheduled | None, cfg: Config) -> bool:
    """The step's record against PR3 (see the module's docstring)."""
    if scheduled is None or cfg.kv_connector is not None:
        return True
    if lookahead.budget_spent(cfg, [e.n for e in scheduled.entries]):      # a draft model's slots too
        return True
    in_batch = {e.req for e in scheduled.entries}
    defers = cadence.defers_prefills(before, cfg)     # a call that defers prefills skips their chunks
    return all(_nothing_to_schedule(before, after.requests[r], r, cfg) or cadence.skips_running(before, r, defers)
               for r in after.running if r not in in_batch)
