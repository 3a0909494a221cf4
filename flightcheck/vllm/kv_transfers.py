"""The fabricated connector's transfers in flight: the state its scheduler
side (`kv_connector.FlightcheckKVConnector`, inside vLLM's scheduler) and
its worker side (`KVTransfers.report`, called by the replay's engine right
before each `update_from_output`) share, as one process.

What the connector offers, when a transfer ends and what fails follow the
workload (kv_workload.py, whose module doc states the timing rule); this
module only keeps the ledger:

* `offer` / `allocated`: `get_num_new_matched_tokens` and
  `update_state_after_alloc`. An allocation ends the request's promise (a
  Request object is one incarnation); a positive one starts a load: an
  async load is due at update `updates + load_steps`, a sync load is
  carried by the batch being scheduled (`take_started` hands the loads of
  one `schedule()` call to `build_connector_meta`).
* `finished`: `request_finished`; a producer holds a request that finished
  by stop or length (vLLM then keeps its blocks) and sends it, due at
  update `updates + send_steps`.
* `report`: the worker's `KVConnectorOutput` for the next update: the
  transfers due then, and the failures of the sync loads the batch carried.
* `reset_cache`: `KVConnectorBase_V1.reset_cache` (vLLM 0.33/0.34
  `Scheduler.reset_connector_cache`, called by `reset_prefix_cache(...,
  reset_connector=True)`). The fabricated connector's rule: its store is
  emptied, so every request already added whose promise is not yet spent
  (never allocated) is offered 0 from then on (and may no longer load
  asynchronously); a request added later offers what its workload says
  (the store refills from other producers); loads already started land as
  scheduled (their data left the store when the load began), and sends go
  on. It always succeeds (True).

Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .kv_workload import (NO_KV, KVConnectorConfig, KVRequestSpec, failed_blocks, loaded_blocks,
                          offered_tokens)

# vLLM's statuses (by name) of a request that finished on its own: a producer sends those.
SENT_STATUSES = ("FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED")


@dataclass
class Load:
    req_id: str
    load_async: bool
    block_ids: list[int]              # the request's table when vLLM allocated for the load
    blocks: range                     # indices of the loaded blocks in that table
    spec: KVRequestSpec
    num_external_tokens: int = 0
    due: int | None = None            # the update that reports an async load

    def invalid_block_ids(self) -> set[int]:
        return {self.block_ids[i] for i in failed_blocks(self.spec, self.blocks) if i < len(self.block_ids)}

    def first_failed_block(self) -> int:
        """The index, in the request's table, of the load's first invalid block."""
        return failed_blocks(self.spec, self.blocks).start


@dataclass
class Report:
    """What one update's `KVConnectorOutput` carries."""
    finished_recving: set[str] = field(default_factory=set)
    finished_sending: set[str] = field(default_factory=set)
    invalid_block_ids: set[int] = field(default_factory=set)
    failed_recving: set[str] = field(default_factory=set)
    # The requests whose own load reported invalid blocks, with the index of
    # the first in the load's table (the recorder's `kv_failed`: a request
    # that shares an invalid block through its prefix hit has no load of its
    # own to fail, and a request preempted since no longer holds the blocks).
    failed_loads: dict[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.finished_recving or self.finished_sending or self.invalid_block_ids or self.failed_recving)


class KVTransfers:
    """The ledger (module doc)."""

    def __init__(self, config: KVConnectorConfig, block_size: int) -> None:
        self.config = config
        self.block_size = block_size
        self.updates = 0                               # update_from_output calls begun
        self.arrivals = 0                              # requests added
        self._specs: dict[str, KVRequestSpec] = {}     # vLLM id -> the request now under it
        self._asked: dict[int, tuple[Any, int]] = {}   # id(Request) -> (it, local tokens presented)
        self._served: dict[int, Any] = {}              # id(Request) -> it: promise used
        self._started: list[Load] = []                 # since the last take_started
        self._due: list[tuple[int, str, Any]] = []     # (update, "recv" | "send", Load | req_id)
        self._forgotten: set[str] = set()              # ids added before a reset_cache: offered 0
        self.cache_resets = 0                          # reset_cache calls

    # -- the scheduler side ------------------------------------------------------------

    def bind(self, req_id: str, spec: KVRequestSpec, fresh: bool = True) -> None:
        """The request about to be added under `req_id`: `fresh`, a new
        request (added after any `reset_cache`: it offers what its workload
        says); else a streaming session's next input under its live id,
        the same Request (what a reset forgot of it stays forgotten)."""
        self._specs[req_id] = spec
        if fresh:
            self._forgotten.discard(req_id)

    def reset_cache(self) -> bool:
        """`reset_cache`: the module doc's rule. The ids bound so far are
        forgotten (a spent promise offers 0 anyway)."""
        self._forgotten |= set(self._specs)
        self.cache_resets += 1
        return True

    def spec(self, req_id: str) -> KVRequestSpec:
        return self._specs.get(req_id, NO_KV)

    def may_load_async(self, request: Any) -> bool:
        spec = self.spec(request.request_id)
        return (self.config.consumer and spec.load_async and spec.hit > 0 and id(request) not in self._served
                and request.request_id not in self._forgotten)

    def offer(self, request: Any, num_local_tokens: int) -> tuple[int, bool]:
        """`get_num_new_matched_tokens`: (tokens, async)."""
        spec = self.spec(request.request_id)
        if not self.config.consumer or id(request) in self._served or request.request_id in self._forgotten:
            return 0, False
        tokens = offered_tokens(spec, num_local_tokens, request.num_tokens, self.block_size)
        self._asked[id(request)] = (request, num_local_tokens)
        return tokens, tokens > 0 and spec.load_async

    def offered_at_arrival(self, request: Any) -> tuple[int, bool]:
        """What the workload has the connector offer this request (the trace's `arrive`)."""
        spec = self.spec(request.request_id)
        if not self.config.consumer or spec.hit == 0:
            return 0, False
        return spec.hit, spec.load_async

    def allocated(self, request: Any, block_ids: list[int], num_external_tokens: int) -> None:
        """`update_state_after_alloc`: the promise is spent (admitted or parked)."""
        self._served[id(request)] = request
        if num_external_tokens <= 0:
            return
        spec = self.spec(request.request_id)
        _, local = self._asked.get(id(request), (request, 0))
        # vLLM 0.34 may drop a partial local tail and load it: the load starts
        # at the block-aligned local hit it presented.
        load = Load(request.request_id, spec.load_async, list(block_ids),
                    loaded_blocks(local, num_external_tokens, self.block_size), spec, num_external_tokens)
        if spec.load_async:
            load.due = self.updates + spec.load_steps
            self._due.append((load.due, "recv", load))
        self._started.append(load)

    def take_started(self) -> list[Load]:
        """The loads started since the last call (`build_connector_meta`)."""
        started, self._started = self._started, []
        return started

    def finished(self, request: Any, status: str, block_ids: list[int]) -> bool:
        """`request_finished`: whether vLLM must hold the request's blocks for a
        send. As vLLM's producers hold a table only when it has blocks
        (NixlConnector's and MooncakeConnector's `request_finished`:
        `delay_free_blocks` only when a group has any): vLLM 0.33/0.34 finish
        a waiting request that never had blocks by the length cap when an older
        request's output, looked up by its reused id, reaches it
        (`reused_id_output_dropped`), and there is nothing to send."""
        if not self.config.producer or status not in SENT_STATUSES or not block_ids:
            return False
        spec = self.spec(request.request_id)
        self._due.append((self.updates + spec.send_steps, "send", request.request_id))
        return True

    # -- the worker side -----------------------------------------------------------------

    def pending(self) -> int:
        """Transfers not yet reported."""
        return len(self._due)

    def report(self, carried: list[Load]) -> Report:
        """The next update's KVConnectorOutput: `carried` are the loads of
        the batch it completes (their sync failures are reported now)."""
        self.updates += 1
        report = Report()
        for load in carried:
            if not load.load_async and load.invalid_block_ids():
                report.invalid_block_ids |= load.invalid_block_ids()
                report.failed_loads[load.req_id] = load.first_failed_block()
        due = [item for item in self._due if item[0] == self.updates]
        self._due = [item for item in self._due if item[0] != self.updates]
        for _, kind, item in due:
            if kind == "send":
                report.finished_sending.add(item)
                continue
            report.finished_recving.add(item.req_id)
            if item.spec.fail_whole:
                report.failed_recving.add(item.req_id)
            elif item.invalid_block_ids():
                report.invalid_block_ids |= item.invalid_block_ids()
                report.failed_loads[item.req_id] = item.first_failed_block()
        return report


_ACTIVE: KVTransfers | None = None


def install(transfers: KVTransfers | None) -> None:
    """The ledger the next connector vLLM builds uses (kv_connector.py)."""
    global _ACTIVE
    _ACTIVE = transfers


def active() -> KVTransfers | None:
    return _ACTIVE
