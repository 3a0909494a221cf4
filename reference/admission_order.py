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

from .kv_cache_manager import KVCacheManager
from .request import Request, RequestStatus


def reorder_by_cached_prefix(waiting: deque[Request], kv_cache_manager: KVCacheManager,
                             window: int, threshold: float) -> None:
    """Reorder `waiting` in place: among its first `window` requests, the
    fresh ones (WAITING, nothing computed) are sorted deepest cached prefix
    first, arrival order breaking ties, into the slots they held; preempted
    ones keep their slots. Nothing happens with fewer than two waiting, a
    KV cache used below `threshold`, or fewer than two fresh in the window."""
    if len(waiting) < 2 or kv_cache_manager.usage < threshold:
        return
    head = list(itertools.islice(waiting, window))
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
    for _ in head:
        waiting.popleft()
    waiting.extendleft(reversed(reordered))

