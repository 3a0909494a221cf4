"""Self-checks of a scheduler's internal state, for tests and harnesses.

`consistency_errors` states what must hold between any two calls;
`leak_errors` what must hold once every request has finished or been
aborted (vLLM's `assert_scheduler_empty`). Both return readable problems
rather than raising, so a harness can print all of them at once.
"""

from __future__ import annotations

from collections import Counter

from .request import RequestStatus
from .scheduler import Scheduler


def consistency_errors(scheduler: Scheduler) -> list[str]:
    errors: list[str] = []
    cfg = scheduler.config
    kv = scheduler.kv_cache_manager
    pool = kv.block_pool
    running_ids = [r.request_id for r in scheduler.running]
    kv_waiting = list(scheduler.kv_holding_waiting)
    waiting_ids = [r.request_id for r in [*scheduler.waiting, *kv_waiting]]
    if len(set(running_ids)) != len(running_ids) or set(running_ids) & set(waiting_ids):
        errors.append(f"a request is queued twice: running={running_ids} waiting={waiting_ids}")
    if set(running_ids) | set(waiting_ids) != set(scheduler.requests):
        errors.append("requests and queues disagree: "
                      f"{sorted(scheduler.requests)} vs {sorted(running_ids + waiting_ids)}")
    for r in scheduler.running:
        if r.status != RequestStatus.RUNNING:
            errors.append(f"{r.request_id} in running with status {r.status.name}")
    for r in scheduler.waiting:
        if r.status not in (RequestStatus.WAITING, RequestStatus.PREEMPTED, RequestStatus.WAITING_FOR_STREAMING_REQ):
            errors.append(f"{r.request_id} in waiting with status {r.status.name}")
        if kv.req_to_blocks.get(r.request_id):
            errors.append(f"{r.request_id} waits but holds blocks")
    errors += _kv_connector_errors(scheduler)
    errors += _session_errors(scheduler)
    if len(scheduler.running) > cfg.max_num_seqs:
        errors.append(f"{len(scheduler.running)} running > max_num_seqs {cfg.max_num_seqs}")
    for r in scheduler.requests.values():
        limit = r.num_tokens_with_spec + r.num_output_placeholders   # (async: tokens in flight)
        if not 0 <= r.num_computed_tokens <= limit:
            errors.append(f"{r.request_id}: num_computed_tokens {r.num_computed_tokens} "
                          f"outside [0, {limit}]")
        if len(kv.req_to_blocks.get(r.request_id, ())) * cfg.block_size < r.num_computed_tokens:
            errors.append(f"{r.request_id}: block table does not cover its computed tokens")
        if r.num_tokens > cfg.max_model_len or r.num_output_tokens > r.max_tokens:
            errors.append(f"{r.request_id}: past its length limits")
    if not set(scheduler.scheduled_req_ids) <= set(running_ids):
        errors.append(f"scheduled_req_ids {sorted(scheduler.scheduled_req_ids)} not all running")
    # KV ownership: reference count = tables holding the block; free <=> count 0.
    holders = Counter(b.block_id for blocks in kv.req_to_blocks.values() for b in blocks)
    holders.update(b.block_id for _, blocks in scheduler.deferred_frees for b in blocks)
    unknown = set(kv.req_to_blocks) - set(scheduler.requests) - set(scheduler.kv_held)
    if unknown:
        errors.append(f"block tables of unknown requests: {unknown}")
    free = set(pool.free_block_queue)
    for block in pool.blocks:
        if block.ref_cnt != holders.get(block.block_id, 0):
            errors.append(f"block {block.block_id}: ref_cnt {block.ref_cnt} but "
                          f"{holders.get(block.block_id, 0)} tables hold it")
        if (block.ref_cnt == 0) != (block.block_id in free):
            errors.append(f"block {block.block_id}: ref_cnt {block.ref_cnt}, "
                          f"{'in' if block.block_id in free else 'not in'} the free queue")
        if block.block_hash is not None and pool.cached_block_hash_to_block.get(
                block.block_hash, {}).get(block.block_id) is not block:
            errors.append(f"block {block.block_id} has a hash the cache does not map to it")
    return errors + _hash_map_errors(scheduler)


def _hash_map_errors(scheduler: Scheduler) -> list[str]:
    """The prefix cache's hash map agrees with the blocks; no table holds a block twice."""
    errors: list[str] = []
    kv = scheduler.kv_cache_manager
    for h, copies in kv.block_pool.cached_block_hash_to_block.items():
        if not copies:
            errors.append(f"hash {h} maps to no block")
        for block in copies.values():
            if block.block_hash != h:
                errors.append(f"hash map entry for block {block.block_id} disagrees with the block")
    for req_id, blocks in kv.req_to_blocks.items():
        if len({b.block_id for b in blocks}) != len(blocks):
            errors.append(f"{req_id} holds a block twice")
    return errors


def leak_errors(scheduler: Scheduler) -> list[str]:
    """Nothing of any request may remain once all are finished or aborted."""
    kv = scheduler.kv_cache_manager
    pool = kv.block_pool
    leftovers = {
        "requests": scheduler.requests, "waiting": scheduler.waiting,
        "running": scheduler.running, "scheduled_req_ids": scheduler.scheduled_req_ids,
        "block tables": kv.req_to_blocks, "cached-block counts": kv.num_cached_block,
        "kv_holding_waiting": scheduler.kv_holding_waiting,
        "held for KV transfers": scheduler.kv_held, "deferred frees": scheduler.deferred_frees,
    }
    errors = [f"{name} not empty: {list(value)[:5]}" for name, value in leftovers.items() if value]
    held = [b.block_id for b in pool.blocks if b.ref_cnt != 0]
    if held:
        errors.append(f"blocks still held: {held[:10]}")
    if pool.get_num_free_blocks() != pool.num_blocks:
        errors.append(f"{pool.get_num_free_blocks()} of {pool.num_blocks} blocks free")
    return errors


def _kv_connector_errors(scheduler: Scheduler) -> list[str]:
    """The KV connector's queues and holds (kv_transfer.py): a parked
    request waits in `kv_holding_waiting` with a table covering its load; a
    held request is finished, out of `requests`, and holds a table or its
    blocks wait behind the fence."""
    errors: list[str] = []
    kv = scheduler.kv_cache_manager
    allowed = (RequestStatus.WAITING, RequestStatus.PREEMPTED, RequestStatus.WAITING_FOR_REMOTE_KVS,
               RequestStatus.WAITING_FOR_STREAMING_REQ)
    for r in scheduler.kv_holding_waiting:
        if r.status not in allowed:
            errors.append(f"{r.request_id} in a KV waiting queue with status {r.status.name}")
    for r in scheduler.waiting:
        if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            errors.append(f"{r.request_id} loads but is not in kv_holding_waiting")
    for req_id, r in scheduler.kv_held.items():
        if not r.is_finished() or req_id in scheduler.requests:
            errors.append(f"{req_id} held for a KV transfer but not finished and gone")
    if not set(scheduler._aborted_kv_loads) <= set(scheduler.kv_held):
        errors.append(f"aborted loads {sorted(scheduler._aborted_kv_loads)} not all held")
    fences = [fence for fence, _ in scheduler.deferred_frees]
    if any(fence > scheduler.sched_step_seq for fence in fences):
        errors.append(f"a deferred free waits for a step never scheduled: {fences}")
    return errors


def _session_errors(scheduler: Scheduler) -> list[str]:
    """Streaming sessions (sessions.py): the parked-session count is the
    parked sessions; a session between turns waits in `kv_holding_waiting`
    exactly while it has computed tokens; a parked one has no queued input
    and at most every token but its last sampled one computed."""
    errors: list[str] = []
    parked = [r for r in scheduler.requests.values() if r.status == RequestStatus.WAITING_FOR_STREAMING_REQ]
    if len(parked) != scheduler.num_waiting_for_streaming_input:
        errors.append(f"{len(parked)} parked sessions, counted {scheduler.num_waiting_for_streaming_input}")
    for r in [*scheduler.waiting, *scheduler.kv_holding_waiting]:
        if r.resumable and r.status != RequestStatus.PREEMPTED and \
                (r in scheduler.kv_holding_waiting) != (r.num_computed_tokens > 0):
            errors.append(f"session {r.request_id} in the wrong waiting queue")
    for r in parked:
        if r.streaming_queue or r.num_computed_tokens > r.num_tokens - 1:
            errors.append(f"parked session {r.request_id}: queued input or too many tokens computed")
    return errors
