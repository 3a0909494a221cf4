"""The order of admission: vLLM 0.34's opt-in cache-aware reorder of `waiting`.

FCFS admits from the head of `waiting`. vLLM 0.34
(`Scheduler._reorder_waiting_by_cached_prefix`, `Profile.cache_aware_admission`)
may first move the fresh requests with a cached prefix ahead of those that
would compute theirs, within a window at the head of the queue, once the KV
cache is used enough. The reorder is part of the `schedule` action: it runs
at the start of the waiting phase of a call that preempted nobody, and the
new order stays, whether or not anyone is then admitted.

Under the priority policy there is no reorder (vLLM keeps the window only
under FCFS). Beside a KV connector the reorder reads vLLM's `waiting` proper:
the requests that hold blocks are in `kv_holding`, and those a load limit
sets apart in `async_kv_waiting` (`kv_loads.may_load_async`, a view of
`waiting` here) keep their order, as vLLM's reorder never touches that queue;
its window and its two-request guard count `waiting` proper alone.
A call that defers prefills does not reorder (`if self.cache_aware_window
and not defer_prefills`): the local prefill cadence's hold (cadence.py).
Abstracted away: vLLM's DP prefill deferral (which skips the reorder too).
"""

from __future__ import annotations

from dataclasses import replace

from . import blocks
from .cadence import defers_prefills
from .config import Config
from .kv_loads import may_load_async
from .state import State, Status, content_label


def is_reorder_in_force(state: State, cfg: Config) -> bool:
    """The guards, in vLLM's order: the profile has the knob, the window is
    open (`cache_aware_admission_window > 0`, kept only with prefix caching
    on), the call does not defer prefills (the cadence), two requests wait
    at least, and the cache's usage has reached the threshold."""
    if not cfg.rules.cache_aware_admission or cfg.cache_aware_admission_window == 0:
        return False
    if defers_prefills(state, cfg):
        return False                    # `not defer_prefills` (vLLM 0.34 `Scheduler.schedule`)
    if cfg.scheduling_policy != "fcfs":
        return False                    # vLLM keeps the window only under FCFS (`cache_aware_window`)
    if not cfg.prefix_caching or len(reorderable(state, cfg)) < 2:
        return False
    return kv_cache_usage(state, cfg) >= cfg.cache_aware_admission_threshold


def reorderable(state: State, cfg: Config) -> tuple[int, ...]:
    """vLLM's `waiting` queue proper, in order: `waiting` less the requests
    of `async_kv_waiting` (a view of `waiting` here, kv_loads.py), the only
    queue `_reorder_waiting_by_cached_prefix` reads and reorders."""
    return tuple(r for r in state.waiting if not may_load_async(state, cfg, r))


def kv_cache_usage(state: State, cfg: Config) -> float:
    """vLLM's `BlockPool.get_usage`: `1.0 - free / usable` (its pool less
    the null block is the spec's pool), as the same float, so the test
    against the threshold falls the same way at its edges."""
    return 1.0 - (len(state.pool.free_queue) / cfg.num_blocks)


def num_cached_tokens(state: State, cfg: Config, r: int) -> int:
    """vLLM `KVCacheManager.get_num_cached_tokens`: the tokens of r's cached
    prefix, its last token left out (as an admission's hit), probed without
    touching the pool; 0 for a prompt-logprobs request (its lookup is off: lora.py)."""
    req = state.requests[r]
    if req.prompt_logprobs:
        return 0
    labels = [content_label(state, r, i, cfg.block_size) for i in range(req.num_tokens // cfg.block_size)]
    return len(blocks.lookup_hit(state.pool, labels, (req.num_tokens - 1) // cfg.block_size)) * cfg.block_size


def reorder_waiting(state: State, cfg: Config) -> State:
    """The fresh requests (WAITING, never scheduled) among the first `window`
    of vLLM's `waiting` (`reorderable`), sorted by cached prefix, deepest
    first, arrival order (their place) breaking ties, into the slots they
    held; preempted requests keep theirs, and so does every request of
    `async_kv_waiting`. Nothing moves when fewer than two are fresh."""
    if not is_reorder_in_force(state, cfg):
        return state
    head = reorderable(state, cfg)[:cfg.cache_aware_admission_window]
    slots = [i for i, r in enumerate(head) if state.requests[r].status is Status.WAITING]
    if len(slots) < 2:
        return state
    cached = {i: num_cached_tokens(state, cfg, head[i]) for i in slots}
    order = sorted(slots, key=lambda i: (-cached[i], i))
    reordered = list(head)
    for slot, source in zip(slots, order):
        reordered[slot] = head[source]
    moved = iter(reordered)                 # the window's places in `waiting`, refilled in the new order
    return replace(state, waiting=tuple(next(moved) if r in head else r for r in state.waiting))
