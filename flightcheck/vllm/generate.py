"""Workloads for the differential against vLLM, from one generator with two
sources of choices: a seeded `random.Random` (the campaign command, where
workload i of a seed is a function of the two alone) and Hypothesis
(tests/test_vllm_differential.py, which shrinks a failure to a small
workload). The generator asks a `Picker` for every choice.

What it covers: K 2-4; block sizes 2-8; tight pools (one request's worth
and a few blocks) and roomy ones; a shared prefix; long-prefill thresholds;
aborts at any step, so often while a batch of the request is in flight;
EOS; with `reuse_ids` (for vLLM 0.33, off by default so that the workloads
of a seed stay what they were), one request in two sent under the id of an
aborted one, at the abort's step or a little later, often while the aborted
request's batch is still in flight. Every workload also suits the reference: the pool holds one request of
max_model_len tokens besides vLLM's null block, and every prompt leaves room
for its outputs. Standard library only.
"""

from __future__ import annotations

import random
from typing import Any, Protocol, Sequence, TypeVar

T = TypeVar("T")


class Picker(Protocol):
    def integer(self, low: int, high: int) -> int:
        """An integer in [low, high]."""

    def choice(self, options: Sequence[T]) -> T:
        """One of `options` (the first is the simplest, for shrinking)."""


class RandomPicker:
    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def integer(self, low: int, high: int) -> int:
        return self._rng.randint(low, high)

    def choice(self, options: Sequence[T]) -> T:
        return self._rng.choice(list(options))


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def generate_workload(pick: Picker, name: str, seed: int, reuse_ids: bool = False,
                      spec_tokens: int = 0, mid_step_inputs: bool = False) -> dict[str, Any]:
    """One workload (the JSON `workload.py` reads). `spec_tokens` k > 0:
    speculative decoding with k drafts, the acceptance picked last (so the
    rest of a seed's workload is what it is without drafts).
    `mid_step_inputs`: each arrival and abort, one time in two, arrives
    while its step waits for a batch's output (`via "wait"`: vLLM 0.34's
    `_wait_for_output`), picked after everything else."""
    num_stages = pick.integer(2, 4)
    block_size = pick.choice([4, 2, 8])
    prefix_len = pick.choice([0, block_size, 2 * block_size, block_size + 1])
    requests: list[dict[str, Any]] = []
    for index in range(pick.integer(2, 5)):
        arrival = pick.choice([0, pick.integer(0, 12)])
        request: dict[str, Any] = {"id": f"r{index}", "prompt_len": pick.integer(1, 24),
                                   "max_tokens": pick.integer(1, 12), "arrival_step": arrival}
        if prefix_len and pick.choice([False, True]):
            request["prefix"] = "p"
        abort_after = pick.choice([None, None, pick.integer(0, 12)])
        if abort_after is not None:
            request["abort_step"] = arrival + abort_after
        eos_probability = pick.choice([0.0, 0.2])
        if eos_probability:
            request["eos_probability"] = eos_probability
        requests.append(request)
    if reuse_ids:
        _maybe_reuse_an_id(pick, requests)
    longest = max(r["prompt_len"] + r["max_tokens"] for r in requests)
    max_model_len = longest + pick.integer(0, 6)
    one_request = cdiv(max_model_len, block_size)
    if pick.choice(["tight", "roomy"]) == "tight":
        usable = one_request + pick.integer(0, 3)
    else:
        usable = sum(cdiv(r["prompt_len"] + r["max_tokens"], block_size) for r in requests) + 4
        usable = max(usable, one_request)
    config = {"num_stages": num_stages, "max_num_batched_tokens": pick.choice([8, 4, 16, 32]),
              "max_num_seqs": pick.integer(1, 4), "block_size": block_size,
              "num_blocks": usable + 1,                  # + vLLM's null block
              "max_model_len": max_model_len,
              # vLLM 0.33's SchedulerConfig refuses a threshold above
              # max_model_len; there it never binds (no chunk is longer), so
              # capping it changes no decision of any version.
              "long_prefill_token_threshold": min(pick.choice([0, 3, 6]), max_model_len),
              "prefix_caching": pick.choice([True, False])}
    workload: dict[str, Any] = {"name": name, "seed": seed, "config": config, "requests": requests,
                                "max_steps": 3000}
    if prefix_len:
        workload["prefixes"] = {"p": prefix_len}
    if spec_tokens:
        config["num_spec_tokens"] = spec_tokens
        workload["draft_acceptance"] = pick.choice([0.5, 0.0, 0.8, 1.0])
    if mid_step_inputs:
        _place_inputs_during_waits(pick, requests)
    return workload


def _place_inputs_during_waits(pick: Picker, requests: list[dict[str, Any]]) -> None:
    """One time in two each, an arrival (`arrival_via`) or an abort
    (`abort_via`) lands while its step waits for the oldest batch's output;
    otherwise between steps, as before. A request that reuses an aborted
    one's id at the abort's step arrives as that abort does (after it, in
    the same wait or before the next step): never ahead of it, which vLLM's
    `add_request` refuses (a live duplicate id); a request aborted at its
    arrival step is aborted the way it arrives, so after it."""
    by_id = {request["id"]: request for request in requests}
    for request in requests:
        if request["arrival_step"] > 0 and pick.choice([False, True]):
            request["arrival_via"] = "wait"
        if "abort_step" in request and pick.choice([False, True]):
            request["abort_via"] = "wait"
    for request in requests:
        if request.get("arrival_via") == "wait" and request.get("abort_step") == request["arrival_step"]:
            request["abort_via"] = "wait"            # aborted after it arrives, as without waits
        old = by_id.get(request.get("reuse_id", ""))
        if old is not None and old.get("abort_via") == "wait" and request["arrival_step"] == old["abort_step"]:
            request["arrival_via"] = "wait"


def _maybe_reuse_an_id(pick: Picker, requests: list[dict[str, Any]]) -> None:
    """One time in two, a new request under the id of an aborted one, sent
    at the abort's step (after the abort, as workload.py orders them) or up
    to 3 steps later: a front end with request-id randomization off."""
    aborted = [r for r in requests if "abort_step" in r]
    if not aborted or not pick.choice([False, True]):
        return
    old = pick.choice(aborted)
    requests.append({"id": f"r{len(requests)}", "reuse_id": old["id"],
                     "prompt_len": pick.integer(1, 24), "max_tokens": pick.integer(1, 12),
                     "arrival_step": old["abort_step"] + pick.choice([0, pick.integer(0, 3)])})


def campaign_workloads(seed: int, count: int, reuse_ids: bool = False,
                       spec_tokens: int = 0, mid_step_inputs: bool = False) -> list[dict[str, Any]]:
    """Workloads seed-0 .. seed-(count-1) of a campaign; each is a function
    of (seed, index) alone, so a failure is replayed from its name (with
    drafts: `diff-spec{k}-...`; with inputs during waits: `diff-wait-...`)."""
    label = (f"spec{spec_tokens}-" if spec_tokens else "") + ("wait-" if mid_step_inputs else "")
    return [generate_workload(RandomPicker(hash_seed(seed, index)), f"diff-{label}{seed}-{index}",
                              hash_seed(seed, index), reuse_ids, spec_tokens, mid_step_inputs)
            for index in range(count)]


def hash_seed(seed: int, index: int) -> int:
    """A stable seed for workload `index` of campaign `seed`."""
    return seed * 1_000_003 + index
