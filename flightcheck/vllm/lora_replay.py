"""LoRA adapters and prompt logprobs on vLLM's side of a replay
(lora_workload.py's keys), run inside a vLLM venv by replay_worker.py.

The smallest LoRA config vLLM's Scheduler takes on a CPU: `LoRAConfig(
max_loras=N)` with every other field at its default (rank 16, `max_cpu_loras`
= N; checked by `VllmConfig.__post_init__` against the tiny Llama of the
replay); the scheduler reads only `lora_config.max_loras`. A request's
adapter is a `LoRARequest` whose path is never read (nothing loads it); its
name keys its blocks' hashes (`generate_block_hash_extra_keys`), so it is
given at construction, before the block hasher runs. vLLM's classes are
handed in by replay_worker.py (which runs in a vLLM venv): this module, as
the package, imports without vLLM.
"""

from __future__ import annotations

from typing import Any

from .workload import ReplayConfig, RequestSpec


def vllm_arguments(config: ReplayConfig, LoRAConfig: type) -> dict[str, Any]:  # noqa: N803 (vLLM's class)
    """`VllmConfig` keywords: a LoRA config carrying `max_loras` (none at 0)."""
    return {"lora_config": LoRAConfig(max_loras=config.max_loras)} if config.max_loras else {}


def lora_request(spec: RequestSpec, LoRARequest: type) -> Any:  # noqa: N803 (vLLM's class)
    """The request's adapter, a `LoRARequest` (None: none); one name per id."""
    if not spec.lora:
        return None
    return LoRARequest(lora_name=f"flightcheck-lora-{spec.lora}", lora_int_id=spec.lora,
                       lora_path="/nonexistent/flightcheck-lora")


def sampling_arguments(spec: RequestSpec) -> dict[str, Any]:
    """`SamplingParams` keywords: prompt logprobs asked for (0: the sampled
    token's only), given to the constructor, whose `__post_init__` derives
    `skip_reading_prefix_cache` from it."""
    return {"prompt_logprobs": 0} if spec.prompt_logprobs else {}
