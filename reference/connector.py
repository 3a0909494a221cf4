"""A fabricated KV connector: what it offers each request, and when its
transfers report back (vLLM's `KVConnectorBase_V1`, scheduler and worker
sides in one object; docs/kv-connector.md).

Abstracted away: connector metadata, the worker's transfers themselves (only
their reports reach the scheduler), HMA (one KV cache group), partial-tail
offloads, statistics and KV events.

* **Configuration** (`KvConnectorConfig`): the role (`consumer`: it loads;
  `producer`: it sends a finished request's KV), the load failure policy and
  vLLM 0.34's `max_num_inflight_kv_loads`.
* **The offer** (`KvOffer`, one per request, chosen when it arrives): `hit`
  tokens beyond the local prefix hit (block aligned), loaded synchronously
  (by the batch that schedules the request) or asynchronously (the request
  parks until the load lands); how many outputs later an async load or a
  send reports; whether the load fails, from which block of the request's
  table (`fail_from_block`) or as a whole (`fail_whole`).
* **Matching** (`get_num_new_matched_tokens`): the offer, cut so that the
  local hit plus the load stays within the request's known tokens (a sync
  load leaves the last one for the batch to compute, and stays block
  aligned); 0 once the request was admitted or parked
  (`update_state_after_alloc`): the connector promises a load once, and a
  preempted request gets no second one (contract C1).
* **Timing** (`worker_output`, called at the start of every
  `update_from_output`, empty batches included): the outputs processed are
  counted; an async load started while `c` had been processed reports
  `finished_recving` (with its failure, if any) with output `c +
  load_steps`; a send started in output `u` reports `finished_sending` with
  output `u + send_steps`; a failing sync load reports its invalid blocks
  with the output of the batch that carried it.
* **Sends** (`request_finished`): a producer holds the blocks of a request
  that stopped by itself (stop or length) and holds any; aborts and errors
  send nothing.
* **Reset** (`reset_cache`, vLLM's `KVConnectorBase_V1.reset_cache`, called
  by `reset_prefix_cache(reset_connector=True)`): the store is emptied, so
  every request already added whose promise is not spent is offered 0 from
  then on; a request added later offers its own (the store refills from
  other producers); loads already started land as scheduled and sends go
  on. Its place in vLLM 0.34's `async_kv_waiting` does not change
  (`may_load_async` is asked when a request is enqueued, before the reset):
  met there, it is offered nothing. It always succeeds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from .request import Request, RequestStatus

LOAD_FAILURE_POLICIES = ("recompute", "fail")


@dataclass(frozen=True)
class KvConnectorConfig:
    consumer: bool = True
    producer: bool = False
    load_failure_policy: str = "recompute"
    max_inflight_loads: int | None = None

    def __post_init__(self) -> None:
        if self.load_failure_policy not in LOAD_FAILURE_POLICIES:
            raise ValueError(f"load_failure_policy must be one of {LOAD_FAILURE_POLICIES}, "
                             f"got {self.load_failure_policy!r}")
        if self.max_inflight_loads is not None and self.max_inflight_loads < 1:
            raise ValueError(f"max_inflight_loads must be >= 1 or None, got {self.max_inflight_loads}")

    def to_json(self) -> dict[str, Any]:
        """The trace's `config.kv_connector` (and the workload's)."""
        return {"consumer": self.consumer, "producer": self.producer,
                "load_failure_policy": self.load_failure_policy,
                "max_inflight_loads": self.max_inflight_loads}


@dataclass(frozen=True)
class KvOffer:
    hit: int = 0
    load_async: bool = False
    load_steps: int = 1
    fail_from_block: int | None = None
    fail_whole: bool = False
    send_steps: int = 1

    def __post_init__(self) -> None:
        if self.hit < 0 or self.load_steps < 1 or self.send_steps < 1:
            raise ValueError(f"bad KV offer {self}: hit >= 0, load_steps >= 1, send_steps >= 1")
        if self.fail_from_block is not None and self.fail_from_block < 0:
            raise ValueError(f"fail_from_block must be >= 0, got {self.fail_from_block}")

    @property
    def fails(self) -> bool:
        return self.fail_whole or self.fail_from_block is not None


@dataclass
class KvConnectorOutput:
    """What the worker side reports with one batch's output (vLLM's
    `KVConnectorOutput`)."""
    finished_recving: list[str] = field(default_factory=list)
    finished_sending: list[str] = field(default_factory=list)
    failed_recving: list[str] = field(default_factory=list)
    invalid_block_ids: set[int] = field(default_factory=set)
    # The requests whose own load reported invalid blocks, with the index in
    # its table of the first (the trace's `kv_failed`: a request holding an
    # invalid block through a prefix hit has no load of its own that failed,
    # and an aborted request's load still reports).
    failed_loads: dict[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.finished_recving or self.finished_sending or self.failed_recving
                    or self.invalid_block_ids)


@dataclass
class _Load:
    """A load the connector was given blocks for (`update_state_after_alloc`)."""
    req_id: str
    incarnation: int
    block_ids: list[int]              # the request's table when the load started
    first_block: int                  # the first block the load writes
    end_block: int                    # one past the last
    offer: KvOffer
    due: int | None                   # async: the output that reports it

    def invalid_block_ids(self) -> set[int]:
        """The blocks a failing load reports: from its failing block to its
        end (`fail_from_block` is a table index, raised to the load's first
        block; past the load's end nothing fails), or all for `fail_whole`."""
        offer = self.offer
        return set(self.block_ids[self.first_failed_block():self.end_block])

    def first_failed_block(self) -> int:
        """The index, in the request's table, of the load's first invalid block."""
        offer = self.offer
        return self.first_block if offer.fail_whole else max(offer.fail_from_block or 0, self.first_block)

    def report_failure(self, out: KvConnectorOutput) -> None:
        """Its invalid blocks (if any) into the worker's output, as its own."""
        invalid = self.invalid_block_ids()
        if invalid:
            out.invalid_block_ids |= invalid
            out.failed_loads[self.req_id] = self.first_failed_block()


class FabricatedConnector:
    def __init__(self, config: KvConnectorConfig, block_size: int, async_loads: bool,
                 load_failures: bool) -> None:
        self.config = config
        self.block_size = block_size
        self.async_loads = async_loads          # profiles.py `kv_async_loads`
        self.load_failures = load_failures      # profiles.py `kv_load_failures`
        self.outputs_processed = 0
        self.outputs_reporting = 0              # outputs with a report (`worker_output`)
        self._promised: set[Request] = set()    # requests admitted or parked: offered 0 since
        self._forgotten: set[Request] = set()   # requests unserved at a `reset_cache`: offered 0 since
        self._async_loads: list[_Load] = []
        self._sync_loads: dict[tuple[str, int], _Load] = {}
        self._sends: list[tuple[int, str]] = []  # (due output, request id)
        # Scripted (a refinement driver's): no timing of its own; the next
        # output brings `next_output`, whatever the driver put there.
        self.scripted = False
        self.next_output: KvConnectorOutput | None = None

    # -- scheduler side ------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Request, num_local: int) -> tuple[int, bool]:
        """(tokens the connector can load beyond `num_local`, asynchronously?)."""
        offer: KvOffer | None = request.kv_offer
        if (offer is None or not offer.hit or not self.config.consumer or request in self._promised
                or request in self._forgotten):
            return 0, False
        load_async = offer.load_async and self.async_loads
        if load_async:
            num_external = min(offer.hit, request.num_tokens - num_local)
        else:                                 # the last token left to compute, block aligned
            num_external = min(offer.hit, request.num_tokens - 1 - num_local)
            num_external -= num_external % self.block_size
        if num_external <= 0:
            return 0, False
        return num_external, load_async

    def was_asked(self, request: Request) -> bool:
        """The request was admitted or parked with this connector: its
        promise is spent (it is offered 0 from now on)."""
        return request in self._promised

    def forgot(self, request: Request) -> bool:
        """A `reset_cache` emptied the store before the request was served."""
        return request in self._forgotten

    def reset_cache(self, added: Iterable[Request]) -> bool:
        """`reset_cache` (the module doc): `added`, the scheduler's requests,
        forgotten where their promise is not spent. True: it succeeded."""
        self._forgotten |= {request for request in added if request not in self._promised}
        return True

    def may_load_async(self, request: Request) -> bool:
        """vLLM 0.34's `may_load_async`: the connector would load it async
        (asked at the request's enqueue: a later `reset_cache` leaves the
        answer, its place in `async_kv_waiting`, as it was)."""
        offer: KvOffer | None = request.kv_offer
        return (offer is not None and offer.hit > 0 and offer.load_async and self.async_loads
                and self.config.consumer and request not in self._promised)

    def update_state_after_alloc(self, request: Request, block_ids: list[int], num_local: int,
                                 num_external: int, load_async: bool) -> None:
        """The request is admitted or parked: the promise is spent (asked
        and settled: contract C1); a load starts, an async one due
        `load_steps` outputs from now, a failing sync one reported with its
        batch (`worker_output`)."""
        self._promised.add(request)
        if num_external == 0:
            return
        offer: KvOffer = request.kv_offer
        end = -(-(num_local + num_external) // self.block_size)
        load = _Load(request.request_id, request.incarnation, list(block_ids),
                     num_local // self.block_size, end, offer,
                     self.outputs_processed + offer.load_steps if load_async else None)
        if load_async:
            self._async_loads.append(load)
        elif offer.fails and self.load_failures:
            self._sync_loads[(request.request_id, request.incarnation)] = load

    def request_finished(self, request: Request, block_ids: list[int]) -> bool:
        """Whether the blocks stay held for a send (vLLM's `delay_free`)."""
        if not (self.config.producer and block_ids and request.status in _SENT_STATUSES):
            return False
        offer: KvOffer | None = request.kv_offer
        steps = offer.send_steps if offer is not None else 1
        self._sends.append((self.outputs_processed + steps, request.request_id))
        return True

    def has_pending_reports(self) -> bool:
        return bool(self._async_loads or self._sends)

    # -- worker side -----------------------------------------------------------

    def worker_output(self, entries: list[Any]) -> KvConnectorOutput:
        """The reports that come with the next output, the batch of `entries`;
        `outputs_reporting` counts the outputs that carry any (an engine step
        whose output reports a transfer has news: vLLM 0.33/0.34
        `Scheduler._update_from_kv_xfer_finished` frees a finished send's
        blocks and forgets the request; flightcheck/vllm/reference_run.py)."""
        self.outputs_processed += 1
        out = self._reports_due(entries)
        self.outputs_reporting += bool(out)
        return out

    def _reports_due(self, entries: list[Any]) -> KvConnectorOutput:
        if self.scripted:
            out, self.next_output = self.next_output or KvConnectorOutput(), None
            return out
        now = self.outputs_processed
        out = KvConnectorOutput()
        for entry in entries:
            load = self._sync_loads.pop((entry.req_id, entry.incarnation), None)
            if load is not None and getattr(entry, "external", 0):
                load.report_failure(out)
        due = [load for load in self._async_loads if load.due == now]
        self._async_loads = [load for load in self._async_loads if load.due != now]
        for load in due:
            if not self.load_failures:
                pass
            elif load.offer.fail_whole:
                out.failed_recving.append(load.req_id)
            elif load.offer.fail_from_block is not None:
                load.report_failure(out)
            out.finished_recving.append(load.req_id)
        out.finished_sending = [req_id for due_at, req_id in self._sends if due_at == now]
        self._sends = [(due_at, req_id) for due_at, req_id in self._sends if due_at != now]
        return out


_SENT_STATUSES = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED)


def connector_from_json(raw: Any) -> KvConnectorConfig | None:
    """A workload's `kv_connector` object (None: no connector)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError("kv_connector must be an object")
    unknown = set(raw) - {"consumer", "producer", "load_failure_policy", "max_inflight_loads"}
    if unknown:
        raise ValueError(f"kv_connector has unknown keys {sorted(unknown)}")
    return KvConnectorConfig(consumer=bool(raw.get("consumer", True)), producer=bool(raw.get("producer", False)),
                             load_failure_policy=raw.get("load_failure_policy", "recompute"),
                             max_inflight_loads=raw.get("max_inflight_loads"))


def offer_from_json(raw: Any) -> KvOffer | None:
    """A workload request's `kv` object (None: no offer)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError("a request's kv must be an object")
    unknown = set(raw) - {"hit", "async", "load_steps", "fail_from_block", "fail_whole", "send_steps"}
    if unknown:
        raise ValueError(f"kv has unknown keys {sorted(unknown)}")
    return KvOffer(hit=int(raw.get("hit", 0)), load_async=bool(raw.get("async", False)),
                   load_steps=int(raw.get("load_steps", 1)), fail_from_block=raw.get("fail_from_block"),
                   fail_whole=bool(raw.get("fail_whole", False)), send_steps=int(raw.get("send_steps", 1)))
