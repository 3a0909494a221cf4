"""The abstraction function's KV connector part (abstraction.py calls it):
a reference request's connector fields, and the scheduler's connector
queues, as the spec's (docs/kv-connector.md). Nothing of it runs without a
connector (`SchedulerConfig.kv_connector` None).

* The offer (`Request.external_hit`, `load_async`): the request's `KvOffer`
  as the spec keeps it from arrival: none for a producer-only connector, an
  async flag only with a hit and where the profile has async loads; a hit
  a reset of the connector's cache forgot is 0 (`Request.offer_reset`).
* The load (`Request.load`): the reference's `kv_load` (in flight, failed,
  landed: landed stays so until the request is scheduled, as the spec's
  RECEIVED), else DONE once the connector was asked and the request was
  admitted or parked (its promise spent: `FabricatedConnector` remembers
  it), NONE before. A finished request held for its load keeps the load's
  state until its report.
* `Request.external`: an async load's tokens past the local hit, while the
  load is not yet promoted; `Request.held` and a held request's table: the
  reference keeps such a request in `Scheduler.kv_held`.
* `State.kv_holding` is `kv_holding_waiting`; `State.deferred_frees` the
  fence's `(fence step, blocks)` as `(non-empty batches still to complete,
  blocks)` (`fence - processed_step_seq`); `State.arrivals` (kept only under
  vLLM 0.34's load limit) every arrival in order.
"""

from __future__ import annotations

from typing import Any

from flightcheck.reference import Request, Scheduler
from flightcheck.reference.request import KvLoad
from flightcheck.spec import Load

LOAD: dict[KvLoad, Load] = {KvLoad.IN_FLIGHT: Load.IN_FLIGHT, KvLoad.FAILED: Load.FAILED,
                            KvLoad.RECEIVED: Load.RECEIVED}


def request_fields(scheduler: Scheduler, r: Request) -> dict[str, Any]:
    """The spec's connector fields of request r (finished or not)."""
    connector = scheduler.connector
    offer = r.kv_offer
    hit, load_async = 0, False
    if offer is not None and connector.config.consumer:
        hit = offer.hit
        load_async = offer.load_async and hit > 0 and connector.async_loads
    held = scheduler.kv_held.get(r.request_id) is r
    load = LOAD.get(r.kv_load, Load.DONE if connector.was_asked(r) else Load.NONE)
    forgot = connector.forgot(r) and hit > 0
    fields: dict[str, Any] = dict(external_hit=0 if forgot else hit, load_async=load_async, load=load,
                                  external=r.kv_external, held=held, offer_reset=forgot)
    if held:
        fields["block_table"] = tuple(scheduler.kv_cache_manager.get_block_ids(r.request_id))
    return fields


def queues(scheduler: Scheduler, ledger: Any) -> dict[str, Any]:
    """The spec's `kv_holding`, `deferred_frees` and `arrivals` (empty
    without a connector)."""
    if scheduler.connector is None:
        return {}
    processed = scheduler.processed_step_seq
    deferred = tuple((fence - processed, tuple(b.block_id for b in blocks))
                     for fence, blocks in scheduler.deferred_frees)
    arrivals: tuple[int, ...] = ()
    if scheduler._max_inflight_loads is not None and scheduler.connector.config.consumer:
        arrivals = tuple(range(len(ledger.requests)))
    return dict(kv_holding=tuple(ledger.slot_of(r) for r in scheduler.kv_holding_waiting),
                deferred_frees=deferred, arrivals=arrivals)
