"""The KV connector's named properties (docs/kv-connector.md, "Named
properties"): the predicates of KV1, KV2, KV4, KV5 and KV6 (invariants,
registered in invariants.py), each applicable only with
`Config.kv_connector` (KV3 and P_KV_preemption_frees, transition
properties, are in transitions.py). Also `holds_kv_blocks`, the reading of
S1 and S9 a connector needs: a waiting request may hold blocks.

Abstracted away: everything kv_loads.py, kv_fence.py and kv_reports.py
abstract; the contract clauses C1-C4 are properties of the environment,
checked on the connector's reports by the trace checker.
"""

from __future__ import annotations

from dataclasses import replace

from . import lookahead
from .config import Config
from .kv_fence import batches_in_flight
from .kv_loads import load_limit, loads_in_flight
from .sessions import session_holds_blocks
from .state import Load, Request, State, Status


def holds_kv_blocks(q: Request) -> bool:
    """A waiting request that holds blocks (vLLM's `_holds_kv_blocks`): a
    parked load, or a landed one promoted and not yet running, or a
    streaming session between turns (spec/sessions.py)."""
    return (q.status is Status.WAITING_FOR_REMOTE_KVS or (q.status is Status.WAITING and q.load is Load.RECEIVED)
            or session_holds_blocks(q))


def may_hold_table(q: Request) -> bool:
    """Whose table may be non-empty: RUNNING requests, block-holding waiting
    ones, and finished ones held for a transfer."""
    return q.status is Status.RUNNING or holds_kv_blocks(q) or (q.status.is_finished and q.held)


def transfers_in_flight(s: State) -> bool:
    """A load or a send is still to be reported: the scheduler alone may
    have to wait for the connector."""
    return any(q.load.in_transfer or q.held for q in s.requests)


def moves_a_load(before: State, after: State) -> bool:
    """A schedule step that started an async load or promoted a landed one:
    progress, though it forms no batch (L2)."""
    return any(a.load is not b.load or a.status is not b.status for a, b in zip(after.requests, before.requests))


def kv1_no_reuse_under_transfer(s: State, cfg: Config) -> bool:
    """KV1: no block referenced by in-flight work is in the free queue: the table of a request whose load is in flight (aborted ones included), the table of a finished request held for a send, and, where the version fences (a consumer with more than one batch in flight), every block an in-flight batch writes."""
    free = set(s.pool.free_queue)
    if any(free.intersection(q.block_table) for q in s.requests if q.load.in_transfer or q.held):
        return False
    if not cfg.fences_freed_blocks:
        return True
    return not any(free.intersection(e.blocks) for batch in s.in_flight for e in batch)


def kv2_loading_not_scheduled(s: State, cfg: Config, r: int) -> bool:
    """KV2: a request in WAITING_FOR_REMOTE_KVS has a load in flight or landed, is not running and has no live entry in flight (so no schedule step gives it one before its promotion)."""
    q = s.requests[r]
    if q.status is not Status.WAITING_FOR_REMOTE_KVS:
        return True
    if q.load not in (Load.IN_FLIGHT, Load.FAILED, Load.RECEIVED):
        return False
    return r not in s.running_set and not s.entries_of(r)


def kv4_finished_holds_nothing(s: State, cfg: Config, r: int) -> bool:
    """KV4 for one request: a finished request holds no block unless it is held for a transfer still to be reported (its load in flight, or a send), and a held one holds its table."""
    q = s.requests[r]
    if not q.status.is_finished:
        return not q.held
    kv = cfg.kv_connector
    held_for_send = (kv is not None and kv.producer
                     and q.status in (Status.FINISHED_STOPPED, Status.FINISHED_LENGTH))
    if q.held and not (q.load.in_transfer or held_for_send):
        return False                    # held for no transfer: nothing will free it
    return bool(q.block_table) == q.held


def kv4_deferred_frees_drain(s: State, cfg: Config) -> bool:
    """KV4: every deferred free waits only for batches still in flight (1 to the non-empty batches in flight), so it drains once they are done, and none is left when nothing is in flight; only under the fence (a table the fail policy finished waits so for the end of its output's update, fence or none)."""
    if s.deferred_frees and not cfg.fences_freed_blocks:
        return False
    in_flight = batches_in_flight(s)
    return all(1 <= left <= in_flight and table for left, table, *_ in s.deferred_frees + s.error_frees)


def kv5_loaded_not_starved(s: State, cfg: Config) -> bool:
    """KV5 as safety, checked like L2: with no batch in flight and a load landed, schedule promotes a landed request, or the running requests leave no seat or budget, or the loop met no plain waiting request before the landed ones (a blocked plain waiting request never keeps a landed load waiting: the deadlock of vLLM #45388), or the loop does not run (PAUSED_ALL)."""
    from .reset_pause import runs_waiting_loop
    from .schedule import schedule
    landed = {r for r, q in enumerate(s.requests)
              if q.status is Status.WAITING_FOR_REMOTE_KVS and q.load is Load.RECEIVED}
    if any(s.in_flight) or not landed or not runs_waiting_loop(s):
        return True
    scheduled = schedule(replace(s, in_flight=()), cfg)
    if scheduled is None:
        return False
    if scheduled.preempted or any(scheduled.state.requests[r].status is not Status.WAITING_FOR_REMOTE_KVS
                                  for r in landed):
        return True
    used = [e.n for e in scheduled.entries if s.requests[e.req].status is Status.RUNNING]
    if len(s.running) >= cfg.max_num_seqs or lookahead.budget_spent(cfg, used):      # lookahead.py
        return True
    order = s.kv_holding + s.waiting                # the waiting loop's order of queues
    first_landed = min(order.index(r) for r in landed)
    return all(holds_kv_blocks(s.requests[r]) for r in order[:first_landed])


def kv6_load_limit(s: State, cfg: Config) -> bool:
    """KV6: loads in flight, landed and not yet running, and aborted ones still to report never exceed max_num_inflight_kv_loads (vLLM 0.34)."""
    limit = load_limit(cfg)
    return limit is None or loads_in_flight(s) <= limit
