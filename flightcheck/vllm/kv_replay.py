"""The replay worker's side of a workload with a KV connector: the vLLM
configuration that loads the fabricated connector (kv_connector.py), and
the worker side that fills each ModelRunnerOutput's `kv_connector_output`.

vLLM's configuration (0.33.0 and 0.34.0, read in `config/kv_transfer.py`,
`config/scheduler.py` and `KVConnectorFactory.create_connector`):
`VllmConfig.kv_transfer_config` names the connector by module path; the
scheduler config turns the hybrid KV cache manager off (the factory refuses
a connector without HMA support while it is on; the replay has one KV cache
group anyway) and, on 0.34, sets `max_num_inflight_kv_loads`.

Imports no vLLM itself (compat.py reads vLLM's classes by name; the
connector, kv_connector.py, is imported only where a workload has one);
only the replay worker uses it.
"""

from __future__ import annotations

from typing import Any

from . import compat
from .kv_transfers import KVTransfers, install
from .workload import ReplayConfig, RequestSpec, Workload


def start(workload: Workload) -> KVTransfers | None:
    """The ledger of the workload's connector, installed for the scheduler
    about to be built (None, and none installed, without a connector)."""
    config = workload.config.kv_connector
    transfers = None if config is None else KVTransfers(config, workload.config.block_size)
    install(transfers)
    return transfers


def scheduler_arguments(config: ReplayConfig) -> dict[str, Any]:
    """SchedulerConfig's arguments for the connector (none without one)."""
    connector = config.kv_connector
    if connector is None:
        return {}
    arguments: dict[str, Any] = {"disable_hybrid_kv_cache_manager": True}
    # 0.34's knob, passed only to a vLLM that has it (the trace's config
    # says which limit was in force, read from vLLM).
    if connector.max_inflight_loads is not None and compat.scheduler_config_has("max_num_inflight_kv_loads"):
        arguments["max_num_inflight_kv_loads"] = connector.max_inflight_loads
    return arguments


def vllm_arguments(config: ReplayConfig) -> dict[str, Any]:
    """VllmConfig's arguments for the connector (none without one)."""
    connector = config.kv_connector
    if connector is None:
        return {}
    from .kv_connector import kv_transfer_config         # vLLM's connector API: 0.33 on

    return {"kv_transfer_config": kv_transfer_config(connector)}


class KVWorker:
    """The worker side, for the replay's engine (`engine.kv_worker`)."""

    def __init__(self, transfers: KVTransfers) -> None:
        self.transfers = transfers
        self.reports: list[dict[str, Any]] = []        # per update with a report, for the result

    def attach(self, scheduler_output: Any, model_runner_output: Any) -> bool:
        from .kv_connector import attach_report

        report = attach_report(self.transfers, scheduler_output, model_runner_output)
        if report:
            self.reports.append({"update": self.transfers.updates,
                                 "finished_recving": sorted(report.finished_recving),
                                 "finished_sending": sorted(report.finished_sending),
                                 "invalid_block_ids": sorted(report.invalid_block_ids),
                                 "failed_recving": sorted(report.failed_recving)})
        return bool(report)

    def pending(self) -> int:
        return self.transfers.pending()


def attach_worker(engine: Any, transfers: KVTransfers | None) -> KVWorker | None:
    """The worker side on the replay's engine (None without a connector)."""
    if transfers is None:
        return None
    engine.kv_worker = KVWorker(transfers)
    return engine.kv_worker


def before_add(transfers: KVTransfers | None, spec: RequestSpec, request: Any, update: bool = False) -> None:
    """Bind the request's connector policy to its vLLM id (`update`: a
    streaming session's next input, merged into the live Request), and give
    it an arrival time in the order of arrival (the engine's is the wall clock:
    vLLM 0.34's `_next_waiting_queue` orders `waiting` and
    `async_kv_waiting` by it). Without a connector: nothing (arrival 0.0)."""
    if transfers is not None:
        transfers.bind(spec.req_id, spec.kv, fresh=not update)
        transfers.arrivals += 1
        request.arrival_time = float(transfers.arrivals)
