"""KV8: no prefix hit on KV no batch wrote (docs/vllm-unwritten-kv-findings.md,
finding 1; the ground truth's `hits_on_unwritten_kv`).

vLLM caches a block's hash inside `KVCacheManager.allocate_slots`, before the
batch that writes its KV runs (0.33.0/0.34.0 kv_cache_manager.py: full
blocks through `min(num_computed + num_new, num_tokens)`). That is sound
while every block cached is covered by tokens some batch schedules. Under
the priority policy, 0.33.0/0.34.0 `Scheduler.schedule`'s running loop may
preempt a request it already scheduled in the same call (priority.py
`hand_back`): its chunk leaves the batch, but its allocation had cached the
blocks the chunk fills, and `_preempt_request` frees them with their hashes
(`BlockPool.free_blocks`). A later prefix hit on such a block reads KV
nobody computed.

`State.unwritten_kv`: (block, label) for each block so cached past what the
batches wrote: the handed-back victim's labelled blocks past its
`num_computed` (the tokens of earlier batches, in flight included: they run
first). A pair leaves it when a batch writes a token of the block (an
entry's `[start - external, start + n)` over it) or the block no longer
carries that label (evicted: popped fresh, or uncached). A history variable
like KV7's `invalid_kv` (kv_invalid.py): no action reads it, it is no part
of a state's identity; the trace checker reads it at each schedule event
(verification/traces/unwritten.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable

from .config import Config
from .kv_invalid import BatchEntry, prefix_reads, queued_batch
from .blocks import uncache
from .pool_store import label_of
from .state import State



def hand_back_blocks(state: State, cfg: Config, victim: int, entries: Iterable) -> State:
    """Before a priority victim scheduled in this call is handed back and
    preempted (`entries`: the call's ScheduledEntry list so far): its
    labelled blocks past its `num_computed` were cached for the chunk that
    will not run: they join `unwritten_kv`, under either rule (the history
    observes, it does not know the fix). Under the fix they are then
    uncached (`uncaches_handed_back`), so the call's `forget_written` drops
    each pair again (its block lost the label) and no hit can serve them."""
    if not any(e.req == victim for e in entries):
        return state
    cached = cached_past_computed(state, cfg, victim)
    if cached - state.unwritten_kv:
        state = replace(state, unwritten_kv=state.unwritten_kv | cached)
    if cached and uncaches_handed_back(cfg):
        state = replace(state, pool=uncache(state.pool, tuple(b for b, _ in cached)))
    return state


def cached_past_computed(state: State, cfg: Config, r: int) -> frozenset[tuple[int, int]]:
    """(block, label) for each labelled block of r's table that holds a
    token at or past its `num_computed` (the tokens of earlier batches, in
    flight included: the counter moves at launch). In the running loop no
    request takes a prefix hit, so only r's own allocation in this call can
    have cached them."""
    req, bs = state.requests[r], cfg.block_size
    return frozenset((b, label) for i, b in enumerate(req.block_table)
                     if (i + 1) * bs > req.num_computed and (label := label_of(state.pool, b)) is not None)


def uncaches_handed_back(cfg: Config) -> bool:
    """The seam of `Profile.hand_back_uncaches_unwritten` (finding 1's fix,
    no vLLM release; vLLM 0.33.0/0.34.0 `Scheduler.schedule`'s priority
    branch pops the victim's `req_to_new_blocks` and `_preempt_request`
    frees its blocks with the hashes `allocate_slots` gave them): the
    victim's blocks cached for the chunk that will not run leave the prefix
    cache (`BlockPool.evict_blocks`) before they are freed, so they join the
    free queue's head as unhashed blocks (`BlockPool.free_blocks`)."""
    return cfg.rules.hand_back_uncaches_unwritten


def written(batch: Iterable[BatchEntry], block_size: int) -> frozenset[int]:
    """The blocks of which an entry of the batch computes, or its sync load
    writes, at least one token."""
    return frozenset(block for _, start, n, table, external in batch
                     for i, block in enumerate(table)
                     if start - external < (i + 1) * block_size and i * block_size < start + n)


def still_unwritten(state: State) -> frozenset[int]:
    """The blocks of `unwritten_kv` that still carry the label they were
    cached with (a prefix hit can still serve them)."""
    return frozenset(b for b, label in state.unwritten_kv if label_of(state.pool, b) == label)


def kv8_reads(unwritten: frozenset[int], batch: list[BatchEntry], block_size: int) -> list[tuple[int, list[int]]]:
    """KV8's breaches in a batch: (request, blocks) for each entry whose
    computed prefix (the blocks of the tokens before its start) holds a
    block in `unwritten` that the batch does not write."""
    return prefix_reads(unwritten - written(batch, block_size), batch, block_size)


def forget_written(state: State, cfg: Config, entries: Iterable) -> State:
    """After a schedule call (`entries`: its ScheduledEntry list, `state`
    the call's): the blocks it writes, and those relabelled or out of the
    prefix cache, leave `unwritten_kv`."""
    if not state.unwritten_kv:
        return state
    batch = [(e.req, e.start, e.n, state.requests[e.req].block_table, e.external) for e in entries]
    gone = written(batch, cfg.block_size)
    kept = frozenset((b, label) for b, label in state.unwritten_kv
                     if b not in gone and label_of(state.pool, b) == label)
    return state if kept == state.unwritten_kv else replace(state, unwritten_kv=kept)


def schedule_unwritten_reads(before: State, after: State, cfg: Config) -> list[tuple[int, list[int]]]:
    """KV8 on a `schedule` step from `before` to `after`: the breaches of the
    batch it queued (each entry with its request's table after the call),
    against the blocks of `unwritten_kv` still labelled before the call
    (check-trace reads the same at a schedule event:
    verification/traces/unwritten.py). A block marked in the call itself is
    read by no entry of it: after a preemption the waiting loop does not run,
    and the running loop takes no prefix hit."""
    if not before.unwritten_kv or not after.in_flight:
        return []
    return kv8_reads(still_unwritten(before), queued_batch(after), cfg.block_size)


class UnwrittenKvState(State):
    """The spec's state with KV8's history variable in its identity (equal
    and hashed with `unwritten_kv`): the explicit search's states where KV8
    is checked (`Config.check_unwritten_kv`). The same scheduler state is
    reached with a block's KV written (the victim ran its chunk, then was
    preempted) and unwritten (handed back in its own call): merged, the
    second path would be dropped. Every action keeps the class, so only the
    initial state is made one (as kv_invalid.InvalidKvState)."""

    def __eq__(self, other: object) -> bool:
        return State.__eq__(self, other) is True and self.unwritten_kv == other.unwritten_kv  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((State.__hash__(self), self.unwritten_kv))


def with_unwritten_kv_identity(state: State) -> UnwrittenKvState:
    """`state` as an `UnwrittenKvState` (the same fields)."""
    tracked = object.__new__(UnwrittenKvState)
    tracked.__dict__.update({name: getattr(state, name) for name in state.__dataclass_fields__})
    return tracked
