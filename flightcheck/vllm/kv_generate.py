"""The `kv-connector` family of generated workloads (generate.py's
`FAMILIES`): the seed's plain workload with a fabricated KV connector
(kv_workload.py) that exercises what vLLM 0.33 and 0.34 keep in flight for
it:

* the connector: a consumer three times in four (with K > 1 vLLM then
  fences freed blocks), a producer one time in two (blocks held until
  sent), either load failure policy, 0.34's in-flight load limit one time
  in two (1 or 2; a vLLM without the knob runs without it);
* per request (each with a hit three times in four): an async or a sync
  load of whole blocks, up to the whole prompt, reported after 1 to 4
  updates; a failure one time in three, from a block or as a whole; a send
  reported after 1 to 4 updates;
* a shared prefix one time in two, loaded by its first holder and hit
  locally by the others while that load may still fail (a shared invalid
  block);
* aborts soon after arrival (during a load, or of a finished request held
  for a send), and a tight pool one time in two (preemption while loaded
  requests wait).

Standard library only.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, TypeVar

from .features import Feature
from .versions import kv_connector_versions

T = TypeVar("T")


class Picker(Protocol):                        # generate.Picker (this module is imported by generate.py)
    def integer(self, low: int, high: int) -> int: ...

    def choice(self, options: Sequence[T]) -> T: ...


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _connector_feature(pick: Picker, workload: dict[str, Any]) -> None:
    """`--all-features`: always a connector (the control is the workloads the draw leaves without)."""
    _with_connector(pick, workload)


# Beside drafts too (docs/request-states.md, "Features together": a landed or sync load's
# padded admission, the async load's spec-decode reservation, the drafts a rollback keeps).
FEATURE = Feature("kv-connector", kv_connector_versions(), 0.5, _connector_feature)


def kv_connector_family(pick: Picker, workload: dict[str, Any]) -> None:
    config, requests = workload["config"], workload["requests"]
    block_size = config["block_size"]
    if pick.choice([True] * 7 + [False]):
        _with_connector(pick, workload)
    # else one in eight stays without a connector: the control (vLLM's
    # connector-less paths, and a differential that runs)


def _with_connector(pick: Picker, workload: dict[str, Any]) -> None:
    config, requests = workload["config"], workload["requests"]
    block_size = config["block_size"]
    consumer = pick.choice([True, True, True, False])
    config["kv_connector"] = {
        "consumer": consumer, "producer": pick.choice([False, True]) or not consumer,
        "load_failure_policy": pick.choice(["recompute", "fail"]),
        "max_inflight_loads": pick.choice([None, 1, 2])}
    shared = pick.choice([False, True])
    if shared:
        _share_a_prefix(pick, workload)
    for request in requests:
        request["kv"] = _request_kv(pick, request, block_size)
    if shared:
        # the prefix's first holder loads it synchronously, and the load
        # fails from a block of the prefix two times in three: the others
        # hit those blocks locally while its batch is in flight
        prefix_blocks = workload["prefixes"]["p"] // block_size
        requests[0]["kv"].update(hit=workload["prefixes"]["p"], fail_whole=False, fail_from_block=pick.choice(
            [pick.integer(0, prefix_blocks - 1), pick.integer(0, prefix_blocks - 1), None]))
        requests[0]["kv"]["async"] = False
    for request in requests:
        arrival = request.get("arrival_step", 0)
        if request.get("abort_step", arrival) < arrival or (
                "abort_step" not in request and pick.choice([False, False, True])):
            request["abort_step"] = arrival + pick.integer(0, 4)
    if pick.choice(["tight", "roomy"]) == "tight":
        one_request = _cdiv(config["max_model_len"], block_size)
        config["num_blocks"] = min(config["num_blocks"], one_request + 1 + pick.integer(0, 3))


def _share_a_prefix(pick: Picker, workload: dict[str, Any]) -> None:
    """A prefix of whole blocks that the first request holds and others,
    arriving a step or two later, share (prefix caching on)."""
    config, requests = workload["config"], workload["requests"]
    block_size = config["block_size"]
    prefix = block_size * pick.integer(1, 3)
    workload["prefixes"] = {"p": prefix}
    config["prefix_caching"] = True
    first_arrival = requests[0].get("arrival_step", 0)
    for index, request in enumerate(requests):
        request.pop("prefix", None)
        if index == 0 or pick.choice([True, False]):
            request["prefix"] = "p"
            request["prompt_len"] = max(request["prompt_len"], prefix + pick.integer(1, block_size))
            if index:
                request["arrival_step"] = first_arrival + pick.integer(0, 2)
    longest = max(r["prompt_len"] + r["max_tokens"] for r in requests)
    if longest > config["max_model_len"]:
        config["max_model_len"] = longest
        config["num_blocks"] = max(config["num_blocks"], _cdiv(longest, block_size) + 1)
    config["long_prefill_token_threshold"] = min(config["long_prefill_token_threshold"], config["max_model_len"])


def _request_kv(pick: Picker, request: dict[str, Any], block_size: int) -> dict[str, Any]:
    blocks = _cdiv(request["prompt_len"], block_size)
    failure = pick.choice(["none", "none", "block", "whole", "none", "block"])
    return {"hit": pick.choice([0, block_size * pick.integer(1, blocks), block_size * blocks,
                                block_size * pick.integer(1, blocks)]),
            "async": pick.choice([True, False]),
            "load_steps": pick.integer(1, 4),
            "fail_from_block": pick.integer(0, blocks) if failure == "block" else None,
            "fail_whole": failure == "whole",
            "send_steps": pick.integer(1, 4)}
