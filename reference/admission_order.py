"""vLLM 0.34's opt-in cache-aware admission order
(`Scheduler._reorder_waiting_by_cached_prefix`): before the waiting loop,
fresh requests whose prompt is already in the prefix cache move ahead of
those that would compute theirs, within a window at the head of `waiting`,
so a cold request does not evict blocks a warm one is about to hit. Only
under a profile with `cache_aware_admission`, with prefix caching on and a
window configured (`SchedulerConfig.cache_aware_admission_window`)."""

from __future__ import annotations

import itertools
from collections import deque
from typing import Callable

from .kv_cache_manager import KVCacheManager
from .request import Request, RequestStatus


def reorder_by_cached_prefix(waiting: deque[Request], kv_cache_manager: KVCacheManager,
                             window: int, threshold: float,
                             in_queue: Callable[[Request], bool] = lambda request: True) -> None:
    """Reorder `waiting` in place: among the first `window` requests of the
    queue (those of `waiting` that `in_queue` keeps: beside a KV connector,
    vLLM's `waiting` proper, not its `async_kv_waiting`, which this deque
    also holds and whose order stays), the fresh ones (WAITING, nothing
    computed) are sorted deepest cached prefix first, arrival order breaking
    ties, into the slots they held; preempted ones keep their slots. Nothing
    happens with fewer than two in the queue, a KV cache used below
    `threshold`, or fewer than two fresh in the window."""
    queue = [request for request in waiting if in_queue(request)]
    if len(queue) < 2 or kv_cache_manager.usage < threshold:
        return
    head = queue[:window]
    slots = [i for i, request in enumerate(head)
             if request.status == RequestStatus.WAITING and not request.num_computed_tokens]
    if len(slots) < 2:
        return
    cached = {i: kv_cache_manager.get_num_cached_tokens(head[i]) for i in slots}
    order = sorted(slots, key=lambda i: (-cached[i], i))
    if order == slots:
        return
    reordered = list(head)
    for slot, source in zip(slots, order):
        reordered[slot] = head[source]
    moved, in_window = iter(reordered), set(map(id, head))      # the window's places, refilled in order
    refilled = [next(moved) if id(request) in in_window else request for request in waiting]
    waiting.clear()
    waiting.extend(refilled)
