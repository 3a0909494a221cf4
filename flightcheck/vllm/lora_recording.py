"""What the recorder writes for LoRA's cap and prompt logprobs
(docs/trace-format.md; docs/request-states.md, "LoRA max_loras" and "Prompt
logprobs and the prefix cache"), as hooks recording.py calls:

* the config event carries `max_loras` when the scheduler has a LoRA config
  (`Scheduler.lora_config`), and says `prompt_logprobs: true` when the
  deployment says so (`FLIGHTCHECK_PROMPT_LOGPROBS=1`; the replay worker
  sets it for a workload with such a request): the checker then models them;
* an arrival carries its `lora` (`lora_request.lora_int_id`, when it has an
  adapter) and `prompt_logprobs: true` when its sampling params ask for them;
  so does a streaming session's next input (an `input` event).

Imports no vLLM.
"""

from __future__ import annotations

import os
from typing import Any

PROMPT_LOGPROBS_ENV = "FLIGHTCHECK_PROMPT_LOGPROBS"


def config_fields(scheduler: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    lora_config = getattr(scheduler, "lora_config", None)
    if lora_config is not None:
        fields["max_loras"] = int(lora_config.max_loras)
    if os.environ.get(PROMPT_LOGPROBS_ENV) == "1":
        fields["prompt_logprobs"] = True
    return fields


def arrive_fields(request: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    lora = getattr(request, "lora_request", None)
    if lora is not None and lora.lora_int_id > 0:
        fields["lora"] = int(lora.lora_int_id)
    return {**fields, **input_fields(request)}


def input_fields(request: Any) -> dict[str, Any]:
    """`prompt_logprobs: true` for an arrival or a streaming session's next
    input whose sampling params ask for them (the checker applies the
    release's rule for a session's input: 0.34 reads it, 0.33 keeps the
    first input's; spec/lora.py `take_input_logprobs`)."""
    params = getattr(request, "sampling_params", None)
    if params is not None and (params.prompt_logprobs is not None
                               or getattr(params, "prompt_logprob_token_ids", None) is not None):
        return {"prompt_logprobs": True}
    return {}
