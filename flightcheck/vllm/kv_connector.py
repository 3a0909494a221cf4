"""A fabricated KV connector for vLLM's real scheduler (0.33.0, 0.34.0).

vLLM loads it as it loads any external connector:
`KVTransferConfig(kv_connector="FlightcheckKVConnector",
kv_connector_module_path="flightcheck.vllm.kv_connector", kv_role=...,
kv_load_failure_policy=...)`; the scheduler builds its scheduler-side
instance in `Scheduler.__init__` (`KVConnectorFactory.create_connector`).
What it offers and when its transfers end is the workload's
(kv_workload.py); the ledger both sides share is `KVTransfers`
(kv_transfers.py), which the replay worker installs (`kv_transfers.install`) before
it builds the scheduler. The worker side is not this class: the replay's
engine fabricates the worker's `KVConnectorOutput` (`attach_report`) from
the same ledger, in the ModelRunnerOutput it hands to `update_from_output`.

Scheduler-side methods (KVConnectorBase_V1, read in
`vllm/distributed/kv_transfer/kv_connector/v1/base.py` of 0.33.0 and
0.34.0): `get_num_new_matched_tokens`, `update_state_after_alloc`,
`build_connector_meta`, `request_finished`, `may_load_async` (0.34's
load limit queue) and `reset_cache` (`reset_prefix_cache(reset_connector=
True)`; kv_transfers.py states what it forgets); the rest keep the base class's defaults
(`requires_kv_delivery`: the producer role). The worker-side abstract
methods are never called on a scheduler-side instance: they do nothing.

Imports vLLM: only the replay worker (inside a vLLM venv) imports it.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata

from .kv_transfers import KVTransfers, Load, Report, active
from .kv_workload import KVConnectorConfig

CONNECTOR_NAME = "FlightcheckKVConnector"
MODULE_PATH = "flightcheck.vllm.kv_connector"


class FlightcheckKVMetadata(KVConnectorMetadata):
    """The loads one `schedule()` call started (what the worker would load)."""

    def __init__(self, loads: list[Load]) -> None:
        self.loads = loads


class FlightcheckKVConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        transfers = active()
        if transfers is None:
            raise RuntimeError("FlightcheckKVConnector: no workload installed (flightcheck.vllm.kv_transfers.install)")
        self.transfers = transfers

    # -- scheduler side ----------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        return self.transfers.offer(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        (block_ids,) = blocks.get_block_ids()
        self.transfers.allocated(request, list(block_ids), num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return FlightcheckKVMetadata(self.transfers.take_started())

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self.transfers.finished(request, request.status.name, block_ids), None

    def may_load_async(self, request: Any) -> bool:
        return self.transfers.may_load_async(request)

    def reset_cache(self) -> bool:
        return self.transfers.reset_cache()

    def flightcheck_offer(self, request: Any) -> tuple[int, bool]:
        """What the workload offers this request (the recorder's `arrive`)."""
        return self.transfers.offered_at_arrival(request)

    # -- worker side: never called on the scheduler's instance ------------------------

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return None


class IdOrder(set):  # type: ignore[type-arg]
    """A report's request ids, iterated in id order: vLLM frees the held
    tables of a report's landed loads and sends in the order it iterates the
    set (`_update_from_kv_xfer_finished`), which for a plain set of strings
    changes with the process's hash seed; the reference takes them in id
    order too (reference/kv_transfer.py `_finish_kv_reports`)."""

    def __iter__(self) -> Any:
        return iter(sorted(set.__iter__(self)))


def attach_report(transfers: KVTransfers, scheduler_output: Any, model_runner_output: Any) -> Report:
    """The worker side: put the ledger's report for this update into the
    ModelRunnerOutput about to be handed to `update_from_output`."""
    from vllm.v1.outputs import KVConnectorOutput

    meta = getattr(scheduler_output, "kv_connector_metadata", None)
    report = transfers.report(meta.loads if isinstance(meta, FlightcheckKVMetadata) else [])
    if report:
        output = KVConnectorOutput(
            finished_sending=IdOrder(report.finished_sending) or None,
            finished_recving=IdOrder(report.finished_recving) or None,
            invalid_block_ids=report.invalid_block_ids, failed_recving=IdOrder(report.failed_recving))
        # not vLLM's: which requests' own loads failed, for the recorder (kv_recording.py)
        output.flightcheck_failed_loads = dict(report.failed_loads)
        model_runner_output.kv_connector_output = output
    return report


def kv_transfer_config(config: KVConnectorConfig) -> Any:
    """vLLM's KVTransferConfig loading this connector for the workload's roles and policy."""
    from vllm.config import KVTransferConfig

    return KVTransferConfig(kv_connector=CONNECTOR_NAME, kv_connector_module_path=MODULE_PATH,
                            kv_role=config.kv_role, kv_load_failure_policy=config.load_failure_policy)
