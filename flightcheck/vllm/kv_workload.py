"""A replay workload's KV connector: what the fabricated connector offers
each request and when its transfers end (docs/kv-connector.md).

    "config": {..., "kv_connector": {"consumer": true, "producer": false,
                                     "load_failure_policy": "recompute",
                                     "max_inflight_loads": null}},
    "requests": [{"id": "a", "prompt_len": 40, "max_tokens": 4,
                  "kv": {"hit": 32, "async": true, "load_steps": 2,
                         "fail_from_block": null, "fail_whole": false,
                         "send_steps": 1}}]

`kv_connector` may also stand at the top level of the workload (it is read
into the configuration). Every field has a default; a workload without
`kv_connector` replays as before, and one with it runs only on a vLLM that
has the connector API (0.33.0 and 0.34.0).

The connector (`kv_connector.FlightcheckKVConnector`, loaded by vLLM from
`KVTransferConfig(kv_connector_module_path=...)`):

* `consumer`: it offers external hits (`get_num_new_matched_tokens`);
  `producer`: it sends a finished request's KV (`request_finished` returns
  delay-free for a request that finished by stop or length) and vLLM's
  `kv_role` is `kv_producer` (both: `kv_both`; vLLM needs at least one).
  With a consumer and more than one batch in flight vLLM fences freed
  blocks (`defer_block_free`).
* `load_failure_policy`: vLLM's `kv_load_failure_policy`.
* `max_inflight_loads`: vLLM 0.34's `max_num_inflight_kv_loads` (null: no
  limit; passed only to a vLLM that has the knob, as 0.34's admission
  knobs are: 0.33 runs without a limit, and its trace's config says so).

Per request, `kv` (default: nothing offered, sends after one step):

* `hit`: tokens offered beyond the local prefix hit vLLM presents (its
  block-aligned local hit). The offer is cut so that the hit never passes
  the request's tokens: for a sync load to `num_tokens - 1 - local` (vLLM
  must still schedule a token), then down to a block boundary; for an
  async load to `num_tokens - local` (vLLM recomputes the last token after
  the load). `offered_tokens` is the rule (the reference's connector,
  reference/connector.py, has the same).
* `async`: an async load (the request parks in `WAITING_FOR_REMOTE_KVS`),
  else a sync one (counted as computed at once, loaded by the batch).
* The connector promises a load **once per incarnation** (contract C1):
  once vLLM has admitted or parked the request (`update_state_after_alloc`,
  whatever the number of external tokens), it offers that Request object 0
  (so after a load was done or failed, or a preemption, 0).
* `load_steps` (n >= 1) and `send_steps` (n >= 1): **the timing rule**. A
  transfer started in an engine step (an async load: the `schedule()` that
  parked it; a send: the `update_from_output` that finished the request, or,
  for a request finished outside one, the last `update_from_output` before)
  is reported in the ModelRunnerOutput handed to the n-th
  `update_from_output` call after it, counting every call, empty batches
  included. A sync load carries nothing: it is reported (only when it
  fails) with the output of the batch that carried it.
* `fail_from_block` (a block index in the request's table, or null): the
  load fails from that block on: the load's blocks from
  `max(fail_from_block, first block loaded)` to its end are reported in
  `invalid_block_ids`; an index past the load's last block fails nothing.
* `fail_whole`: the load fails as a whole: an async load reports
  `failed_recving` (vLLM then restarts the request from 0); a sync load,
  whose request is running and which vLLM's `_handle_failed_recving`
  ignores, reports every block it loaded in `invalid_block_ids`.
* An aborted load still reports `finished_recving` (and its failure) at
  its time; a send reports `finished_sending` once.

Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .workload_limits import MAX_COUNT, LimitError, show, unknown_keys, whole

POLICIES = ("recompute", "fail")


class KVWorkloadError(LimitError):
    """A bad `kv_connector` or `kv` (a LimitError: the workload reader turns it into WorkloadError)."""


@dataclass(frozen=True)
class KVConnectorConfig:
    consumer: bool = True
    producer: bool = False
    load_failure_policy: str = "recompute"
    max_inflight_loads: int | None = None

    @property
    def kv_role(self) -> str:
        """vLLM's `KVTransferConfig.kv_role` for these roles."""
        if self.consumer and self.producer:
            return "kv_both"
        return "kv_consumer" if self.consumer else "kv_producer"

    def to_json(self) -> dict[str, Any]:
        return {"consumer": self.consumer, "producer": self.producer,
                "load_failure_policy": self.load_failure_policy, "max_inflight_loads": self.max_inflight_loads}


@dataclass(frozen=True)
class KVRequestSpec:
    hit: int = 0
    load_async: bool = False
    load_steps: int = 1
    fail_from_block: int | None = None
    fail_whole: bool = False
    send_steps: int = 1

    @property
    def fails(self) -> bool:
        return self.fail_whole or self.fail_from_block is not None


NO_KV = KVRequestSpec()
DEFAULT_CONNECTOR = KVConnectorConfig()


def _bool(where: str, raw: dict[str, Any], key: str, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise KVWorkloadError(f"{where}.{key}: must be true or false, got {show(value)}")
    return value


def _count(where: str, value: Any, minimum: int) -> int:
    """A count from `minimum` to MAX_COUNT (workload_limits.py)."""
    try:
        return whole(where, value, minimum, MAX_COUNT)
    except LimitError as err:
        raise KVWorkloadError(str(err)) from None


def kv_connector_from_json(raw: Any, where: str = "config.kv_connector") -> KVConnectorConfig | None:
    """The connector's configuration (None: the workload has no connector)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise KVWorkloadError(f"{where} must be an object")
    unknown = set(raw) - {"consumer", "producer", "load_failure_policy", "max_inflight_loads"}
    if unknown:
        raise KVWorkloadError(unknown_keys(where, unknown))
    consumer = _bool(where, raw, "consumer", True)
    producer = _bool(where, raw, "producer", False)
    if not (consumer or producer):
        raise KVWorkloadError(f"{where}: a connector is a consumer, a producer or both")
    policy = raw.get("load_failure_policy", "recompute")
    if policy not in POLICIES:
        raise KVWorkloadError(f"{where}.load_failure_policy: must be 'recompute' or 'fail', got {show(policy)}")
    limit = raw.get("max_inflight_loads")
    if limit is not None:
        limit = _count(f"{where}.max_inflight_loads", limit, 1)
    return KVConnectorConfig(consumer, producer, policy, limit)


def has_kv_connector(raw: dict[str, Any]) -> bool:
    """Whether a raw workload (JSON) has a connector, at the top level or in its config."""
    config = raw.get("config")
    return raw.get("kv_connector") is not None or (isinstance(config, dict)
                                                    and config.get("kv_connector") is not None)


def with_default_connector(raw: dict[str, Any], connector: dict[str, Any] | None = None) -> dict[str, Any]:
    """The workload with a connector (`connector`, else the default: a
    consumer, recompute, no limit) where it has none (`flightcheck vllm
    replay --kv-connector`); requests without `kv` are offered nothing."""
    if has_kv_connector(raw):
        return raw
    config = raw.get("config", {})
    if not isinstance(config, dict):
        return raw                        # not a workload: its validation says so
    chosen = DEFAULT_CONNECTOR.to_json() if connector is None else connector
    return {**raw, "config": {**config, "kv_connector": chosen}}


def kv_request_from_json(raw: Any, where: str) -> KVRequestSpec:
    if raw is None:
        return NO_KV
    if not isinstance(raw, dict):
        raise KVWorkloadError(f"{where} must be an object")
    unknown = set(raw) - {"hit", "async", "load_steps", "fail_from_block", "fail_whole", "send_steps"}
    if unknown:
        raise KVWorkloadError(unknown_keys(where, unknown))
    fail_from = raw.get("fail_from_block")
    return KVRequestSpec(
        hit=_count(f"{where}.hit", raw.get("hit", 0), 0), load_async=_bool(where, raw, "async", False),
        load_steps=_count(f"{where}.load_steps", raw.get("load_steps", 1), 1),
        fail_from_block=None if fail_from is None else _count(f"{where}.fail_from_block", fail_from, 0),
        fail_whole=_bool(where, raw, "fail_whole", False),
        send_steps=_count(f"{where}.send_steps", raw.get("send_steps", 1), 1))


def kv_request_to_json(spec: KVRequestSpec) -> dict[str, Any]:
    return {"hit": spec.hit, "async": spec.load_async, "load_steps": spec.load_steps,
            "fail_from_block": spec.fail_from_block, "fail_whole": spec.fail_whole, "send_steps": spec.send_steps}


def offered_tokens(spec: KVRequestSpec, num_local_tokens: int, num_tokens: int, block_size: int) -> int:
    """What the connector offers beyond `num_local_tokens` (vLLM's block
    aligned local hit) for a request of `num_tokens` tokens: the hit, cut so
    that an async load passes no token and a sync one leaves one token to
    compute and ends on a block boundary (module doc)."""
    if spec.load_async:
        return max(0, min(spec.hit, num_tokens - num_local_tokens))
    offer = min(spec.hit, num_tokens - 1 - num_local_tokens)
    return max(0, offer - offer % block_size)


def loaded_blocks(num_local_tokens: int, num_external_tokens: int, block_size: int) -> range:
    """The indices, in the request's block table, of the blocks a load of
    `num_external_tokens` past `num_local_tokens` writes."""
    first = num_local_tokens // block_size
    end = -(-(num_local_tokens + num_external_tokens) // block_size)
    return range(first, end)


def failed_blocks(spec: KVRequestSpec, blocks: range) -> range:
    """The block indices a load over `blocks` reports invalid (empty: none):
    from `fail_from_block` (at least the load's first) to the load's end;
    every one for a whole failure of a sync load (module doc)."""
    if spec.fail_whole:
        return blocks
    if spec.fail_from_block is None or spec.fail_from_block >= blocks.stop:
        return range(0)
    return range(max(spec.fail_from_block, blocks.start), blocks.stop)
