"""LoRA adapters and prompt logprobs in replay workloads (docs/request-states.md,
"LoRA max_loras" and "Prompt logprobs and the prefix cache"):

* `config.max_loras` (0, the default: no LoRA config): vLLM's
  `LoRAConfig.max_loras`; the replay worker builds the scheduler with a LoRA
  config carrying it (lora_replay.py), the reference with the same cap.
* a request's `lora` (an integer from 1 to `MAX_LORA_ID`; 0 or absent:
  none; only with `config.max_loras`): its adapter, vLLM's `LoRARequest`
  with that `lora_int_id` (its blocks are hashed with the adapter's name).
* a request's `prompt_logprobs` (true/false, default false): it asks for
  prompt logprobs (`SamplingParams(prompt_logprobs=0)`), so it reads nothing
  from the prefix cache; a streaming session's later input may ask too
  (its `session.inputs[i].prompt_logprobs`, session_workload.py).

The features (`--all-features`, 0.33.0 and 0.34.0): `lora` gives a cap of 1
or 2 and most requests one of up to three LoRAs; `prompt-logprobs` makes one
or two requests of a prefix-caching workload ask for prompt logprobs, a
request that shares a prefix first. Both beside a KV connector (the cap is
tested after a landed load's promotion; a prompt-logprobs request drops the
connector's offer: spec/lora.py); `prompt-logprobs` beside streaming
sessions too, each later input of a session asking one time in two (vLLM
0.34 sets the session's prefix-cache limit from each input, 0.33 keeps the
first input's: spec/lora.py `take_input_logprobs`).

Standard library only.
"""

from __future__ import annotations

import random
from typing import Any

from .features import Feature, Picker
from .workload_limits import LimitError, flag, whole

MAX_LORA_ID = 1 << 16          # LoRA ids the workload may name (vLLM's are int32: small ones suffice)
MAX_LORAS = 64                 # vLLM's LoRA config keeps a slot per adapter; more adds nothing here


class LoraWorkloadError(LimitError):
    """A LoRA or prompt-logprobs key that is not one (workload.py turns it into a WorkloadError)."""


def lora_from_json(value: Any, where: str) -> int:
    return whole(f"{where}.lora", value, 0, MAX_LORA_ID, "LoRA ids")


def prompt_logprobs_from_json(value: Any, where: str) -> bool:
    return flag(f"{where}.prompt_logprobs", value)


def asks_prompt_logprobs(spec: Any) -> bool:
    """A `RequestSpec` asks for prompt logprobs: its first input, or a later
    input of its streaming session (session_workload.py)."""
    return spec.prompt_logprobs or any(inp.prompt_logprobs for inp in spec.session)


def check_loras(max_loras: int, loras: list[int]) -> None:
    """A request's `lora` needs a LoRA config (vLLM refuses a LoRA request
    without one, in the input processor)."""
    if not max_loras and any(loras):
        raise LoraWorkloadError("a request has 'lora' but config.max_loras is 0 (no LoRA config)")


def _with_loras(pick: Picker, workload: dict[str, Any]) -> None:
    """A cap of 1 or 2 and, for each request, one of up to three LoRAs (or none, one time in four)."""
    workload["config"]["max_loras"] = pick.choice([1, 1, 2])
    loras = pick.integer(2, 3)
    for request in workload["requests"]:
        lora = pick.integer(1, loras) if pick.integer(0, 3) else 0
        if lora:
            request["lora"] = lora


def _with_prompt_logprobs(pick: Picker, workload: dict[str, Any]) -> None:
    """One or two requests ask for prompt logprobs (prefix caching on): a
    later sharer of the prefix where there is one, given the first sharer's
    LoRA (a LoRA keys its blocks), so that a cached prefix is there to skip."""
    requests = workload["requests"]
    if not workload["config"].get("prefix_caching", True):
        return
    sharers = sorted((r for r in requests if r.get("prefix") is not None), key=lambda r: r.get("arrival_step", 0))
    candidates = list(sharers[1:] or requests)
    for _ in range(min(len(candidates), pick.integer(1, 2))):
        request = pick.choice(candidates)
        candidates.remove(request)
        request["prompt_logprobs"] = True
        if sharers and sharers[0].get("lora"):
            request["lora"] = sharers[0]["lora"]
        elif sharers:
            request.pop("lora", None)
    _with_session_inputs_asking(pick, requests)


def _with_session_inputs_asking(pick: Picker, requests: list[dict[str, Any]]) -> None:
    """Each later input of a streaming session asks for prompt logprobs one
    time in two, so that a session's flag changes across turns (vLLM 0.34
    takes the input's, 0.33 keeps the first input's: spec/lora.py
    `take_input_logprobs`). No draw in a workload without sessions: its
    choices stay as they were before sessions met prompt logprobs."""
    for request in requests:
        for item in (request.get("session") or {}).get("inputs", ()):
            if pick.integer(0, 1):
                item["prompt_logprobs"] = True


FEATURES = (
    Feature("lora", ("0.33.0", "0.34.0"), 0.5, _with_loras),
    Feature("prompt-logprobs", ("0.33.0", "0.34.0"), 0.5, _with_prompt_logprobs),
)


def without_lora_features(workload: dict[str, Any]) -> dict[str, Any]:
    """`workload` as the generator made it before the `lora` and
    `prompt-logprobs` features were registered: both are drawn last
    (features.FEATURE_MODULES), so leaving out their keys gives the earlier
    features' workload exactly (for tests that replay a seed's workload
    where a bug of another feature was found)."""
    config = {k: v for k, v in workload["config"].items() if k != "max_loras"}
    requests = [_without_session_logprobs({k: v for k, v in r.items() if k not in ("lora", "prompt_logprobs")})
                for r in workload["requests"]]
    features = [f for f in workload.get("features", ()) if f not in ("lora", "prompt-logprobs")]
    return {**workload, "config": config, "requests": requests,
            **({"features": features} if "features" in workload else {})}


def _without_session_logprobs(request: dict[str, Any]) -> dict[str, Any]:
    session = request.get("session")
    if not session or not any("prompt_logprobs" in item for item in session.get("inputs", ())):
        return request
    inputs = [{k: v for k, v in item.items() if k != "prompt_logprobs"} for item in session["inputs"]]
    return {**request, "session": {**session, "inputs": inputs}}


class _SeededPicker:
    """A `Picker` over `random.Random` (for `lora_workloads`)."""

    def __init__(self, seed: str) -> None:
        self.random = random.Random(seed)

    def integer(self, low: int, high: int) -> int:
        return self.random.randint(low, high)

    def choice(self, options: Any) -> Any:
        return self.random.choice(list(options))


def lora_workloads(seed: int, count: int) -> list[dict[str, Any]]:
    """The campaign's plain workloads of `seed` (inputs placed during waits
    too), each with LoRAs and, one in two, prompt logprobs with prefix
    caching on: these two alone, for their tests and benchmarks/lora_cap.py."""
    from .generate import campaign_workloads       # generate.py imports features.py
    workloads = campaign_workloads(seed, count, mid_step_inputs=True)
    for index, workload in enumerate(workloads):
        pick = _SeededPicker(f"{seed}/{index}/lora")
        _with_loras(pick, workload)
        if index % 2:
            _with_prompt_logprobs(pick, workload)
            workload["config"]["prefix_caching"] = True
        workload["name"] = workload["name"].replace("diff-", "diff-lora-", 1)
    return workloads
