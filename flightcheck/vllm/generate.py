"""Workloads for the differential against vLLM, from one generator with two
sources of choices: a seeded `random.Random` (the campaign command, where
workload i of a seed is a function of the two alone) and Hypothesis
(tests/test_vllm_differential.py, which shrinks a failure to a small
workload). The generator asks a `Picker` for every choice.

What it covers: K 2-4 (one or any other K with `stages`); block sizes 2-8; tight pools (one request's worth
and a few blocks) and roomy ones; a shared prefix; long-prefill thresholds;
aborts at any step, so often while a batch of the request is in flight;
EOS; with `reuse_ids` (for vLLM 0.33, off by default so that the workloads
of a seed stay what they were), one request in two sent under the id of an
aborted one, at the abort's step or a little later, often while the aborted
request's batch is still in flight. A `family` adds the knobs that tell
vLLM versions apart (`FAMILIES`), picked after everything else, so a
workload is the seed's plain one with those knobs set. Every workload also suits the reference: the pool holds one request of
max_model_len tokens besides vLLM's null block, and every prompt leaves room
for its outputs. Standard library only.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Protocol, Sequence, TypeVar

from .features import with_features
from .kv_generate import kv_connector_family

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
                      spec_tokens: int = 0, family: str | None = None,
                      mid_step_inputs: bool = False, features_of: str | None = None,
                      stages: int | None = None) -> dict[str, Any]:
    """One workload (the JSON `workload.py` reads). `spec_tokens` k > 0:
    speculative decoding with k drafts, the acceptance picked last (so the
    rest of a seed's workload is what it is without drafts); `family` (one
    of `FAMILIES`) after it. `mid_step_inputs`: each arrival and abort, one
    time in two, arrives while its step waits for a batch's output (`via
    "wait"`: vLLM 0.34's `_wait_for_output`), picked after everything else.
    `features_of` (a release): `--all-features`, the features that release
    has, each in its share (features.py), picked after the rest. `stages`:
    that many pipeline stages in place of the drawn 2-4, set after every
    pick (so the rest of the workload is the one drawn without it)."""
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
    config = _engine_config(pick, requests, num_stages, block_size)
    workload: dict[str, Any] = {"name": name, "seed": seed, "config": config, "requests": requests,
                                "max_steps": 3000}
    if prefix_len:
        workload["prefixes"] = {"p": prefix_len}
    if spec_tokens:
        config["num_spec_tokens"] = spec_tokens
        workload["draft_acceptance"] = pick.choice([0.5, 0.0, 0.8, 1.0])
    if family is not None:
        (FAMILIES.get(family) or CONNECTOR_FAMILIES[family])(pick, workload)
    if mid_step_inputs:
        _place_inputs_during_waits(pick, requests)
    if features_of is not None:
        with_features(pick, workload, features_of)
    if reuse_ids:
        _reuses_after_their_aborts(requests, connector="kv_connector" in config)
    if stages is not None:
        config["num_stages"] = stages
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


def _unchunked(pick: Picker, workload: dict[str, Any]) -> None:
    """Chunked prefill off: a prompt is admitted whole or waits (vLLM 0.33,
    0.34; 0.8.x's V1 scheduler ignores the switch). Outputs are cut short
    (1-4 tokens) and max_model_len to the longest request plus 0-2, and the
    budget is at most 2 above it (vLLM requires at least max_model_len), so
    prompts are long against the budget: a first admission or running
    decodes leave too little of it for the next prompt. Half the requests
    arrive at once; a long-prefill threshold two times in three (0.33 still
    cuts a prompt with it, 0.34 does not)."""
    config, requests = workload["config"], workload["requests"]
    for request in requests:
        request["arrival_step"] = pick.choice([0, request["arrival_step"]])
        request["max_tokens"] = min(request["max_tokens"], pick.integer(1, 4))
    longest = max(r["prompt_len"] + r["max_tokens"] for r in requests)
    config["max_model_len"] = min(config["max_model_len"], longest + pick.integer(0, 2))
    config["enable_chunked_prefill"] = False
    config["max_num_batched_tokens"] = max(config["max_model_len"] + pick.integer(0, 2), config["max_num_seqs"])
    config["long_prefill_token_threshold"] = min(pick.choice([0, 6, 3]), config["max_model_len"])


def _cache_aware(pick: Picker, workload: dict[str, Any]) -> None:
    """vLLM 0.34's cache-aware admission order: prefix caching on, a shared
    prefix of whole blocks, few seats (so requests wait together), the
    window and the usage threshold picked; the prefix's first holder arrives
    first, the rest a few steps later, together, a cold one ahead of those
    that may hit the prefix (so the reorder has something to move)."""
    config, requests = workload["config"], workload["requests"]
    block_size = config["block_size"]
    config.update(prefix_caching=True, max_num_seqs=pick.choice([2, 1, 3]),
                  cache_aware_admission_window=pick.choice([4, 2, 8]),
                  cache_aware_admission_threshold=pick.choice([0.0, 0.25, 0.5]))
    prefix = block_size * pick.integer(1, 3)
    workload["prefixes"] = {"p": prefix}
    later = pick.integer(1, 3)
    if len(requests) == 2:
        requests.append({"id": "r2", "prompt_len": pick.integer(1, 24), "max_tokens": pick.integer(1, 12)})
    for index, request in enumerate(requests):
        request.pop("prefix", None)
        # the first holds the prefix, the second is cold, the others warm or cold
        if index == 0 or (index > 1 and pick.choice([True, True, False])):
            request["prefix"] = "p"
            request["prompt_len"] = max(request["prompt_len"], prefix + 1)
        request["arrival_step"] = 0 if index == 0 else later + pick.choice([0, 0, 1])
    longest = max(r["prompt_len"] + r["max_tokens"] for r in requests)
    if longest > config["max_model_len"]:
        config["max_model_len"] = longest
        config["num_blocks"] = max(config["num_blocks"], cdiv(longest, block_size) + 1)
    config["long_prefill_token_threshold"] = min(config["long_prefill_token_threshold"],
                                                 config["max_model_len"])


# The families of workloads that tell vLLM versions apart, by name.
FAMILIES: dict[str, Callable[[Picker, dict[str, Any]], None]] = {
    "unchunked": _unchunked, "cache-aware": _cache_aware}
# ... and those that need vLLM's KV connector API (0.33, 0.34) and a
# reference with a connector: kept out of FAMILIES, which every version's
# campaign and `vllm fit` draw from (`campaign --kv-connector` runs them).
CONNECTOR_FAMILIES: dict[str, Callable[[Picker, dict[str, Any]], None]] = {
    "kv-connector": kv_connector_family}


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


def _engine_config(pick: Picker, requests: list[dict[str, Any]], num_stages: int,
                   block_size: int) -> dict[str, Any]:
    """The workload's engine: max_model_len a little above its longest
    request, a pool tight (one request and up to 3 blocks) or roomy (every
    request at once), the rest picked."""
    longest = max(r["prompt_len"] + r["max_tokens"] for r in requests)
    max_model_len = longest + pick.integer(0, 6)
    one_request = cdiv(max_model_len, block_size)
    if pick.choice(["tight", "roomy"]) == "tight":
        usable = one_request + pick.integer(0, 3)
    else:
        usable = sum(cdiv(r["prompt_len"] + r["max_tokens"], block_size) for r in requests) + 4
        usable = max(usable, one_request)
    return {"num_stages": num_stages, "max_num_batched_tokens": pick.choice([8, 4, 16, 32]),
              "max_num_seqs": pick.integer(1, 4), "block_size": block_size,
              "num_blocks": usable + 1,                  # + vLLM's null block
              "max_model_len": max_model_len,
              # vLLM 0.33's SchedulerConfig refuses a threshold above
              # max_model_len; there it never binds (no chunk is longer), so
              # capping it changes no decision of any version.
              "long_prefill_token_threshold": min(pick.choice([0, 3, 6]), max_model_len),
              "prefix_caching": pick.choice([True, False])}


def _reuses_after_their_aborts(requests: list[dict[str, Any]], connector: bool) -> None:
    """A request reusing an id arrives no earlier than the request it takes
    the id from, nor than that request's abort: a family or feature that
    moved arrivals (every one at step 0, say) may have put it first, or put
    the old request's arrival after its abort (then aborted as it arrives). Moved,
    it arrives at the abort as that abort does (in the same wait, when the
    abort comes in one), as `_place_inputs_during_waits` orders them. Beside
    a KV connector no id is reused: an aborted request whose load or send is
    in flight stays in the scheduler's `requests` until the connector
    reports it, and vLLM's `Scheduler.add_request` refuses its id ("duplicate
    request id"), as its front end would (the id is still live). A family
    that moved the older request's arrival past its abort (`_cache_aware`,
    `_unchunked`) left it no abort at all, and its id live when the reuse
    came (seed 51 index 56, vLLM's assertion): it is aborted once it has
    arrived, then. A reuse at the step of an abort that comes in the step's
    wait comes in it too, wherever the arrival was moved from."""
    by_id = {r["id"]: r for r in requests}
    for request in requests:
        old = by_id.get(request.get("reuse_id", ""))
        if old is None:
            continue
        if connector:
            del request["reuse_id"]
            continue
        if old.get("abort_step", old["arrival_step"]) < old["arrival_step"]:
            # a feature moved the old request's arrival past its abort (the
            # streaming sessions'), which then aborts nothing and leaves the id
            # live: it is aborted once it has arrived
            old["abort_step"] = old["arrival_step"] + (1 if old.get("arrival_via") == "wait" else 0)
            old.pop("abort_via", None)
        request["arrival_step"] = max(request["arrival_step"], old["arrival_step"], old.get("abort_step", 0))
        if old.get("abort_via") == "wait" and request["arrival_step"] == old.get("abort_step"):
            # an abort in the step's wait, and a feature moved the reuse to that
            # step (seed 329 index 208): it arrives in the same wait, after it
            request["arrival_via"] = "wait"


def campaign_workloads(seed: int, count: int, reuse_ids: bool = False,
                       spec_tokens: int = 0, family: str | None = None,
                       mid_step_inputs: bool = False, features_of: str | None = None,
                       stages: int | None = None) -> list[dict[str, Any]]:
    """Workloads seed-0 .. seed-(count-1) of a campaign; each is a function
    of (seed, index) alone, so a failure is replayed from its name (with
    drafts: `diff-spec{k}-...`; of a family: `diff-{family}-...`; with inputs
    during waits: `diff-wait-...`; with a release's features:
    `diff-all-{release}-...`; with `stages` N: `diff-stages{N}-...`)."""
    label = ((f"stages{stages}-" if stages is not None else "") + (f"spec{spec_tokens}-" if spec_tokens else "")
             + (f"{family}-" if family else "") + ("wait-" if mid_step_inputs else "")
             + (f"all-{features_of}-" if features_of else ""))
    return [generate_workload(RandomPicker(hash_seed(seed, index)), f"diff-{label}{seed}-{index}",
                              hash_seed(seed, index), reuse_ids, spec_tokens, family, mid_step_inputs,
                              features_of, stages)
            for index in range(count)]


def hash_seed(seed: int, index: int) -> int:
    """A stable seed for workload `index` of campaign `seed`."""
    return seed * 1_000_003 + index
