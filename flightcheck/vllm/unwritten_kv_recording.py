"""The recorder's watch on prefix hits that take KV no batch wrote (ground
truth `hits_on_unwritten_kv`).

vLLM caches a block (gives it the hash of its tokens, so a later request's
`get_computed_blocks` can take it as a prefix hit) in
`KVCacheManager.allocate_slots`, before the batch it allocates for runs.
That is sound only if no block is cached past the tokens scheduled: a batch
runs before any later one (batches run in order through the pipeline), so
a hit in a later batch, or in the same one (each layer writes the batch's
KV before it attends), reads what the writer's batch wrote. vLLM 0.8.4 and
0.8.5 (`KVCacheManager.allocate_slots`, kv_cache_manager.py) cache through
`num_full_blocks_after_append = (num_computed_tokens + num_tokens -
len(request.spec_token_ids)) // block_size`, negative for a request resumed
holding more drafts than the tokens it is given, and
`BlockPool.cache_full_blocks` slices `blocks[num_cached_blocks:
num_full_blocks]`: every block of the table but the last, in 0.8.4 (its
`num_preallocate_blocks`) possibly one past the tokens scheduled
(flightcheck/vllm/README.md, `negative_count_caches_blocks`). 0.33.0 and
0.34.0 cap the tokens they cache at `request.num_tokens` and at the tokens
computed and scheduled (`allocate_slots`: `num_tokens_to_cache`); a
connector's async load is cached once it is received
(`Scheduler._update_waiting_for_remote_kv`, `cache_blocks`). But under the
priority policy their `Scheduler.schedule` may preempt a request its
running loop already scheduled in the step (`if preempted_req in
scheduled_running_reqs`: its tokens are taken back), after that request's
`allocate_slots` cached the chunk's blocks: the chunk never runs and the
blocks stay cached (docs/vllm-unwritten-kv-findings.md, finding 1).

The watch, by block id (no tokens): how far into each block a batch
scheduled, or a load, has written since the block was last handed out
fresh (`BlockPool.get_new_blocks`: an evicted block's old KV is another
prefix's); a sync load writes its tokens in its entry's batch (`external`),
an async one when the connector reports it received (`finished_recving`;
one that failed is KV7's: kv_invalid_recording.py). An admission (an entry
with `cached`: its `num_computed_tokens` from `get_computed_blocks`, and a
load's tokens) that takes a block not wholly written by then is a finding,
with who cached the block (`BlockPool.cache_full_blocks`, wrapped: called
with the same arguments, its result returned). A block cached while its
writing falls short of it is noted too (`blocks_cached_unwritten`: no
finding by itself; it names the cause of a later hit).

Standard library only: this module never imports vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, overload


@dataclass
class UnwrittenKV:
    """Which blocks hold KV a batch or load wrote, and who cached them."""

    block_size: int
    written: dict[int, int] = field(default_factory=dict)          # block -> tokens written from its start
    cached_by: dict[int, dict[str, Any]] = field(default_factory=dict)
    # blocks cached since the last batch was read (their writing is judged then)
    just_cached: list[int] = field(default_factory=list)

    def handed_out(self, blocks: list[int]) -> None:
        """Blocks `get_new_blocks` handed out: whatever they held is gone."""
        for block in blocks:
            self.written.pop(block, None)
            self.cached_by.pop(block, None)

    def cached(self, blocks: list[tuple[int, int]], req_id: str, step: int) -> None:
        """(block, index in the request's table) just given a hash for `req_id`."""
        for block, index in blocks:
            self.cached_by[block] = {"req": req_id, "step": step, "index": index}
            self.just_cached.append(block)

    def write(self, table: Sequence[int], first: int, last: int) -> None:
        """Tokens [first, last) of the request whose table it is are written."""
        bs = self.block_size
        for index in range(max(0, first) // bs, min(len(table), -(-last // bs))):
            block = table[index]
            self.written[block] = max(self.written.get(block, 0), min(bs, last - index * bs))

    def write_batch(self, entries: list[dict[str, Any]], tables: dict[str, Sequence[int]]) -> None:
        """A batch's entries (`req`, `start`, `n`; `external`: the tokens before
        `start` its sync load brings): each writes its tokens, drafts included
        (an accepted draft's KV is the token's)."""
        for entry in entries:
            self.write(tables.get(entry["req"], []), entry["start"] - entry.get("external", 0),
                       entry["start"] + entry["n"])

    def unwritten_hits(self, entries: list[dict[str, Any]], tables: dict[str, Sequence[int]],
                       step: int, batch: int | None) -> list[dict[str, Any]]:
        """Each admission's full blocks below its start (its prefix hit, and
        the tokens a load brought) not wholly written: one record a block."""
        found = []
        for entry in entries:
            table = tables.get(entry["req"], [])
            for index, block in enumerate(table[:entry.get("cached", 0) // self.block_size]):
                if self.written.get(block, 0) < self.block_size:
                    found.append({"step": step, "batch": batch, "req": entry["req"], "hit": entry["cached"],
                                  "block": block, "index": index, "written": self.written.get(block, 0),
                                  "cached_by": self.cached_by.get(block)})
        return found

    def cached_short(self, step: int) -> list[dict[str, Any]]:
        """The blocks cached since the last call whose writing, this batch's
        included, falls short of them (read once the batch is written)."""
        short = [{"step": step, "block": block, "written": self.written.get(block, 0),
                  "cached_by": self.cached_by[block]}
                 for block in dict.fromkeys(self.just_cached)
                 if block in self.cached_by and self.written.get(block, 0) < self.block_size]
        self.just_cached = []
        return short


class BlockIds(Sequence[int]):
    """A request's live block list read as block ids, one index at a time:
    the watch touches only the blocks an entry writes or a hit takes, never
    a whole table (a long context's runs to thousands of blocks)."""

    def __init__(self, blocks: Sequence[Any]) -> None:
        self._blocks = blocks

    def __len__(self) -> int:
        return len(self._blocks)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            return [block.block_id for block in self._blocks[index]]
        return int(self._blocks[index].block_id)


def newly_hashed(blocks: Sequence[Any], indexes: Sequence[int], before: list[bool]) -> list[tuple[int, int]]:
    """(block id, index) of the blocks at `indexes` that had no hash before
    (`before`, in the same order) and have one now."""
    return [(blocks[index].block_id, index) for index, had in zip(indexes, before)
            if not had and blocks[index].block_hash is not None]


def sliced_indexes(blocks: Sequence[Any], kwargs: dict[str, Any]) -> Sequence[int]:
    """The table indexes `cache_full_blocks` may hash: `blocks[num_cached_blocks:
    num_full_blocks]` as vLLM slices them (0.8.x and 0.33/0.34 pass both by
    keyword; a negative count slices from the end, as in 0.8.x), else every one."""
    indexes = range(len(blocks))
    if "num_cached_blocks" in kwargs and "num_full_blocks" in kwargs:
        return indexes[kwargs["num_cached_blocks"]:kwargs["num_full_blocks"]]
    return indexes


class UnwrittenKVRecordingMixin:
    """Put in front of the other recorder mixins (recorder.py): wraps the
    block pool's `get_new_blocks` and `cache_full_blocks` and reads each
    schedule() call's entries."""

    _fc_unwritten: UnwrittenKV | None = None

    def _fc_start_ground_truth(self, spec_decoding: bool) -> None:
        super()._fc_start_ground_truth(spec_decoding)  # type: ignore[misc]
        manager = getattr(self, "kv_cache_manager", None)
        if manager is None or not bool(self.cache_config.enable_prefix_caching):  # type: ignore[attr-defined]
            return
        self._fc_unwritten = UnwrittenKV(int(self.cache_config.block_size))  # type: ignore[attr-defined]
        self._fc_watch_block_pool(manager.block_pool)

    def _fc_watch_block_pool(self, pool: Any) -> None:
        """`get_new_blocks` and `cache_full_blocks` of this pool, called as
        vLLM calls them (0.8.x and 0.33/0.34 alike pass `request` and `blocks`
        first, by keyword in `allocate_slots`), their results returned."""
        watch = self._fc_unwritten
        assert watch is not None
        get_new_blocks, cache_full_blocks = pool.get_new_blocks, pool.cache_full_blocks

        def handing_out(*args: Any, **kwargs: Any) -> Any:
            blocks = get_new_blocks(*args, **kwargs)
            watch.handed_out([block.block_id for block in blocks])
            return blocks

        def caching(*args: Any, **kwargs: Any) -> Any:
            request = kwargs["request"] if "request" in kwargs else args[0]
            blocks = kwargs["blocks"] if "blocks" in kwargs else args[1]
            indexes = sliced_indexes(blocks, kwargs)
            before = [blocks[index].block_hash is not None for index in indexes]
            result = cache_full_blocks(*args, **kwargs)
            # the call in progress belongs to the event the recorder writes next
            watch.cached(newly_hashed(blocks, indexes, before), request.request_id,
                         self.flightcheck_step + 1)  # type: ignore[attr-defined]
            return result

        pool.get_new_blocks, pool.cache_full_blocks = handing_out, caching

    def _fc_table(self, req_id: str) -> BlockIds:
        """The request's blocks, read lazily as ids: 0.8.x `req_to_blocks`,
        0.33/0.34 `get_blocks` (one group: the coordinator's own lists)."""
        manager = self.kv_cache_manager  # type: ignore[attr-defined]
        tables = getattr(manager, "req_to_blocks", None)
        if tables is not None:
            return BlockIds(tables.get(req_id, ()))
        groups = manager.get_blocks(req_id).blocks
        return BlockIds(groups[0] if groups else ())

    def _fc_entries(self, output: Any) -> list[tuple[Any, dict[str, Any]]]:
        """The call's entries written first (one batch), then its admissions' hits read."""
        entries = super()._fc_entries(output)  # type: ignore[misc]
        watch = self._fc_unwritten
        if watch is None:
            return entries
        written = [event for _, event in entries]
        tables = {event["req"]: self._fc_table(event["req"]) for event in written}
        watch.write_batch(written, tables)
        observations = self.flightcheck_observations  # type: ignore[attr-defined]
        step = self.flightcheck_step  # type: ignore[attr-defined]
        batch = self._fc_next_batch if output.total_num_scheduled_tokens > 0 else None  # type: ignore[attr-defined]
        observations.blocks_cached_unwritten.extend(watch.cached_short(step))
        observations.hits_on_unwritten_kv.extend(watch.unwritten_hits(written, tables, step, batch))
        return entries

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        """An async load the connector reports received wrote the request's
        tokens up to its `num_computed_tokens` (read before vLLM caches them)."""
        report = getattr(model_runner_output, "kv_connector_output", None)
        watch = self._fc_unwritten
        if watch is not None and report is not None:
            for req_id in getattr(report, "finished_recving", None) or ():
                request = self.requests.get(req_id)  # type: ignore[attr-defined]
                if request is not None:
                    watch.write(self._fc_table(req_id), 0, int(request.num_computed_tokens))
        return super().update_from_output(scheduler_output, model_runner_output)  # type: ignore[misc]
