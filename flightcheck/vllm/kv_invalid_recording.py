"""The recorder's watch on KV a load reported invalid (ground truth
`kv_computed_on_invalid_kv`; the spec's rule: spec/kv_invalid.py, KV7).

Under the recompute policy vLLM 0.33.0/0.34.0 keep a failed load's blocks
in the prefix cache (`Scheduler._handle_invalid_blocks` evicts only under
the fail policy: "blocks will be recomputed and reused by other requests
sharing them") and `_update_requests_with_invalid_blocks` lets a request
whose invalid blocks an earlier one in the scan marked keep them as
computed ("this request can still consider this block as computed";
"Async loading does not yet support block sharing"). That is sound only
if the marking request recomputes the blocks before, or in the same batch
as, any request that reads them. vLLM #37827 (closed unmerged) and the
sharer case of #49250: a parked marker rolled back to 0 is freed by
`_update_waiting_for_remote_kv` and takes the stale blocks back as a
prefix hit, so nobody recomputes them and every sharer computes on them.

The watch: a block is invalid from the update whose `invalid_block_ids`
name it (recompute policy) until a batch computes its first token, or it
leaves the prefix cache (`block_hash` None: whoever is handed it next
writes or loads it before reading it). A scheduled entry reads every
block holding a token before its `start`; one reading an invalid block
no entry of its own batch rewrites (computes its first token, or loads
it by a sync load) is a finding (same batch: each layer
writes the batch's KV before it attends, so the rewrite is seen).

Standard library only: this module never imports vLLM.
"""

from __future__ import annotations

from typing import Any


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def rewritten_blocks(entries: list[dict[str, Any]], tables: dict[str, list[int]], block_size: int) -> set[int]:
    """The blocks whose first token an entry of the batch computes or its
    sync load writes (`external`: the tokens before `start` it brings)."""
    found: set[int] = set()
    for entry in entries:
        table = tables.get(entry["req"], [])
        first, last = entry["start"] - entry.get("external", 0), entry["start"] + entry["n"]
        found.update(block for i, block in enumerate(table) if first <= i * block_size < last)
    return found


def invalid_reads(entries: list[dict[str, Any]], tables: dict[str, list[int]], block_size: int,
                  invalid: set[int]) -> list[tuple[str, int, list[int]]]:
    """(request, start, blocks) for each entry reading an invalid block that
    its batch does not rewrite."""
    fresh = invalid - rewritten_blocks(entries, tables, block_size)
    found = []
    for entry in entries:
        read = [b for b in tables.get(entry["req"], [])[:cdiv(entry["start"], block_size)] if b in fresh]
        if read:
            found.append((entry["req"], entry["start"], read))
    return found


class InvalidKVRecordingMixin:
    """Put in front of KVRecordingMixin (kv_recording.py)."""

    # block id -> the step whose update reported it invalid
    _fc_invalid_kv: dict[int, int] = {}
    # (request, block): reads already noted (each request's first read of a block)
    _fc_invalid_noted: frozenset[tuple[str, int]] = frozenset()

    def _fc_note_invalid_blocks(self, report: Any) -> None:
        """The blocks an update's `invalid_block_ids` name, under the
        recompute policy (the fail policy evicts the cached ones and fails
        every request holding them)."""
        if not getattr(self, "recompute_kv_load_failures", False):
            return
        blocks = set(getattr(report, "invalid_block_ids", None) or ())
        if blocks:
            step = self.flightcheck_step  # type: ignore[attr-defined]
            self._fc_invalid_kv = {**self._fc_invalid_kv, **{b: step for b in blocks}}

    def _fc_check_invalid_reads(self, entries: list[dict[str, Any]]) -> None:
        """A schedule call's entries (as written: `req`, `start`, `n`),
        against the invalid blocks; then forget those its batch rewrites
        and those out of the prefix cache."""
        if not self._fc_invalid_kv:
            return
        bs = int(self.block_size)  # type: ignore[attr-defined]
        tables = {entry["req"]: self._fc_block_table(entry["req"]) for entry in entries}  # type: ignore
        for req_id, start, read in invalid_reads(entries, tables, bs, set(self._fc_invalid_kv)):
            blocks = [b for b in read if (req_id, b) not in self._fc_invalid_noted]
            if not blocks:
                continue
            self._fc_invalid_noted = self._fc_invalid_noted | {(req_id, b) for b in blocks}
            self.flightcheck_observations.kv_computed_on_invalid_kv.append({  # type: ignore[attr-defined]
                "step": self.flightcheck_step, "req": req_id, "start": start, "blocks": blocks,  # type: ignore
                "reported": sorted({self._fc_invalid_kv[b] for b in blocks})})
        gone = rewritten_blocks(entries, tables, bs)
        pool = self.kv_cache_manager.block_pool.blocks  # type: ignore[attr-defined]
        self._fc_invalid_kv = {b: s for b, s in self._fc_invalid_kv.items()
                               if b not in gone and pool[b].block_hash is not None}
        self._fc_invalid_noted = frozenset(n for n in self._fc_invalid_noted if n[1] in self._fc_invalid_kv)

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        report = getattr(model_runner_output, "kv_connector_output", None)
        if report is not None and getattr(self, "connector", None) is not None:
            self._fc_note_invalid_blocks(report)
        return super().update_from_output(scheduler_output, model_runner_output)  # type: ignore[misc]

    def _fc_entries(self, output: Any) -> list[tuple[Any, dict[str, Any]]]:
        entries = super()._fc_entries(output)  # type: ignore[misc]
        if getattr(self, "connector", None) is not None:
            self._fc_check_invalid_reads([written for _, written in entries])
        return entries
