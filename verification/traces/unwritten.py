"""KV8 at each schedule event of a trace: no entry's computed prefix holds
a block cached for a chunk no batch ran (spec/kv_unwritten.py; vLLM
0.33.0/0.34.0 `Scheduler.schedule`'s priority branch preempting a request
it scheduled earlier in the same call: docs/vllm-unwritten-kv-findings.md,
finding 1). Checked, as KV7 (connector.py `_check_invalid_kv`), before the
event's decisions are compared with the spec's, on the trace's batch."""

from __future__ import annotations

from typing import Any

from flightcheck.spec import Scheduled, State
from flightcheck.spec.config import Config
from flightcheck.spec.kv_invalid import BatchEntry
from flightcheck.spec.kv_unwritten import kv8_reads, still_unwritten


def trace_batch(slot: dict[str, int], before: State, scheduled: Scheduled | None, trace_entries: list[dict],
                block_size: int) -> list[BatchEntry]:
    """The trace's batch as KV7's and KV8's reads take it: each entry with
    the spec's block table after its call, or before it where the spec's is
    shorter than the entry's start."""
    after = scheduled.state if scheduled is not None else before
    batch = []
    for x in trace_entries:
        r = slot.get(x["req"])
        if r is not None:
            table = after.requests[r].block_table
            if len(table) * block_size < x["start"]:
                table = before.requests[r].block_table
            batch.append((r, x["start"], x["n"], table, x.get("external", 0)))
    return batch


class UnwrittenKv:
    """The trace checker's KV8 (a mixin of replay.TraceChecker)."""

    state: State
    cfg: Config
    slot: dict[str, int]

    def _check_unwritten_kv(self, scheduled: Scheduled | None, trace_entries: list[dict]) -> None:
        """An entry of the trace's batch whose computed prefix holds a block
        of `unwritten_kv` (still labelled as cached) that the batch does not
        write. The tables: the spec's after its call, or before it where the
        spec's is shorter than the entry's start."""
        if not self.state.unwritten_kv or not trace_entries:
            return
        unwritten, bs = still_unwritten(self.state), self.cfg.block_size
        batch = trace_batch(self.slot, self.state, scheduled, trace_entries, bs)
        for r, blocks in kv8_reads(unwritten, batch, bs):
            x = next(x for x in trace_entries if self.slot.get(x["req"]) == r)
            raise self._violation("KV8_no_hit_on_unwritten_kv", f"{self._quoted_name(r)} is scheduled "
                                  f"@{x['start']}+{x['n']} with a prefix hit on blocks "
                                  f"{[self._trace_id(b) for b in blocks]} (the trace's ids), cached for a "
                                  "chunk a priority preemption took back in its own step: no batch wrote "
                                  "their KV")

    @staticmethod
    def _violation(prop: str, message: str) -> Exception:  # replay.py's
        raise NotImplementedError

    def _quoted_name(self, r: int) -> str:  # replay.py's
        raise NotImplementedError

    def _trace_id(self, spec_block: int) -> Any:  # replay.py's
        raise NotImplementedError
