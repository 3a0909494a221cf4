"""KV7: no batch computes on KV a load reported invalid
(docs/kv-connector.md, "KV7").

Under the recompute policy a failed sync load's blocks stay in the prefix
cache (vLLM 0.33.0/0.34.0 `Scheduler._handle_invalid_blocks` evicts only
under the fail policy: "blocks will be recomputed and reused by other
requests sharing them"), and `_update_requests_with_invalid_blocks` lets a
request whose invalid blocks an earlier one in its scan marked keep them
as computed. The intended reading: a block a load reported invalid may be
read (counted in a scheduled entry's computed prefix) only once a batch
has recomputed it, that batch included (each layer writes the batch's KV
before it attends). vLLM breaks it where nobody recomputes: a parked
marker rolled back to nothing is freed and takes the stale blocks back as
a prefix hit (`_update_waiting_for_remote_kv`, "There may be a local cache
hit on retry"), and its sharers, parked or new, compute on them (vLLM
#37827, closed unmerged; the sharer case of #49250).

`State.invalid_kv`: the blocks a recompute failure of a sync load made
invalid (kv_reports.py marks them), until a batch computes a block's first
token or the block leaves the prefix cache (popped fresh: whoever gets it
writes or loads it before reading it). The spec's own prefix hit still
offers them (as vLLM does); KV7 is checked on the scheduler's batches by
the trace checker (verification/traces/connector.py), and, where a model
asks for it (`Config.check_invalid_kv`), by the explicit search as a
transition property of `schedule` (`schedule_reads`). A history variable
is no part of a state's identity, so a search that checks KV7 must make it
one (`InvalidKvState`): the same scheduler state with and without stale
blocks leads to different verdicts, and a breadth-first search that
merged them would drop the second path (a failure that changes nothing
but `invalid_kv`, an aborted loader's, reaches a state it already saw).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable

from .blocks import cdiv
from .config import Config
from .pool_store import label_of
from .state import State

# (request, start, tokens, its block table, tokens of `start` its sync load
# brings in the batch): one entry of a batch
BatchEntry = tuple[int, int, int, tuple[int, ...], int]


def mark_invalid(state: State, blocks: Iterable[int]) -> State:
    """The blocks a recompute failure reports invalid join `invalid_kv`."""
    added = frozenset(blocks) - state.invalid_kv
    return replace(state, invalid_kv=state.invalid_kv | added) if added else state


def rewritten(batch: Iterable[BatchEntry], block_size: int) -> frozenset[int]:
    """The blocks whose first token an entry of the batch computes or its
    sync load writes (`[start - external, start + n)`)."""
    return frozenset(block for _, start, n, table, external in batch
                     for i, block in enumerate(table) if start - external <= i * block_size < start + n)


def kv7_reads(invalid: frozenset[int], batch: list[BatchEntry], block_size: int) -> list[tuple[int, list[int]]]:
    """KV7's breaches in a batch: (request, invalid blocks) for each entry
    whose computed prefix (the blocks of the tokens before its start)
    holds a block in `invalid` that the batch does not recompute."""
    return prefix_reads(invalid - rewritten(batch, block_size), batch, block_size)


def prefix_reads(blocks: frozenset[int], batch: list[BatchEntry], block_size: int) -> list[tuple[int, list[int]]]:
    """(request, blocks read) for each entry of the batch whose computed
    prefix (the blocks of the tokens before its start) holds one of `blocks`
    (KV7's and KV8's reads, kv_unwritten.py)."""
    found = []
    for r, start, _, table, _ in batch:
        read = [b for b in table[:cdiv(start, block_size)] if b in blocks]
        if read:
            found.append((r, read))
    return found


def forget_rewritten(state: State, cfg: Config, entries: Iterable) -> State:
    """After a schedule call (`entries`: its ScheduledEntry list, `state`
    the call's): the blocks it recomputes, and those out of the prefix
    cache, are no longer invalid."""
    if not state.invalid_kv:
        return state
    batch = [(e.req, e.start, e.n, state.requests[e.req].block_table, e.external) for e in entries]
    gone = rewritten(batch, cfg.block_size)
    kept = frozenset(b for b in state.invalid_kv if b not in gone and label_of(state.pool, b) is not None)
    return replace(state, invalid_kv=kept)


def schedule_reads(before: State, after: State, cfg: Config) -> list[tuple[int, list[int]]]:
    """KV7 on a `schedule` step from `before` to `after`: the breaches of the
    batch it queued (`after.in_flight[-1]`, each entry with its request's
    table after the call, where its blocks were allocated), against the
    blocks invalid before the call (check-trace reads the same at a
    schedule event: verification/traces/connector.py `_check_invalid_kv`)."""
    if not before.invalid_kv or not after.in_flight:
        return []
    return kv7_reads(before.invalid_kv, queued_batch(after), cfg.block_size)


def queued_batch(after: State) -> list[BatchEntry]:
    """The batch a `schedule` step queued (`after.in_flight[-1]`), each
    entry with its request's table after the call, where its blocks were
    allocated (KV7's and KV8's reads)."""
    return [(e.req, e.start, e.n, after.requests[e.req].block_table, e.external) for e in after.in_flight[-1]]


class InvalidKvState(State):
    """The spec's state with KV7's history variable in its identity (equal
    and hashed with `invalid_kv`): the explicit search's states where KV7 is
    checked (`Config.check_invalid_kv`). Every action keeps the class
    (`state.evolve` and `dataclasses.replace` build the successor from the
    same class), so only the initial state is made one."""

    def __eq__(self, other: object) -> bool:
        return State.__eq__(self, other) is True and self.invalid_kv == other.invalid_kv  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((State.__hash__(self), self.invalid_kv))


def with_invalid_kv_identity(state: State) -> InvalidKvState:
    """`state` as an `InvalidKvState` (the same fields)."""
    tracked = object.__new__(InvalidKvState)
    tracked.__dict__.update({name: getattr(state, name) for name in state.__dataclass_fields__})
    return tracked


def quarantined(state: State, cfg: Config) -> bool:
    """KV7's strengthening under finding 7's fix (`Profile.kv_recompute_quarantines_invalid`):
    every block in `invalid_kv` is out of the prefix cache and in no
    request's computed prefix. From such a state no `schedule` breaks KV7:
    an entry's computed prefix is its prefix before the call or a prefix hit,
    and a block out of the cache is hit only once an entry of the call has
    cached it again by computing it (so the batch rewrites it). The
    auxiliary invariant a k-induction of KV7 would take (docs/proofs.md,
    "KV7"); under vLLM's rules it fails at the first failure with a sharer
    (the blocks stay cached)."""
    if not state.invalid_kv:
        return True
    if any(label_of(state.pool, b) is not None for b in state.invalid_kv):
        return False
    return not any(state.invalid_kv.intersection(q.block_table[:cdiv(q.num_computed, cfg.block_size)])
                   for q in state.requests)
