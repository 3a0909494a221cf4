"""LoRA's `max_loras` cap in the waiting loop (a mixin of `Scheduler`; vLLM
0.33.0 / 0.34.0 `Scheduler.schedule`): with a LoRA config, a waiting request
whose LoRA is not among the running requests' while those already hold
`max_loras` is passed over (`skip_request`: it keeps its place) and the loop
goes on. The running requests count whether or not this step scheduled them
(a request with all its tokens in flight still holds its adapter's slot),
and each admission joins them. The prompt-logprobs limit on the prefix cache
is the KV cache manager's (kv_cache_manager.py, `get_computed_blocks`).
"""

from __future__ import annotations

from .request import Request


class LoraCap:
    def _held_by_lora_cap(self, request: Request) -> bool:
        """vLLM's test: `len(scheduled_loras) == max_loras` and the request's
        LoRA not among them (`scheduled_loras`: the running requests' LoRAs,
        ids > 0; admissions append to `running`, as vLLM's `add` does)."""
        max_loras = self.config.max_loras
        if not max_loras or not request.lora_int_id:
            return False
        loras = {r.lora_int_id for r in self.running if r.lora_int_id > 0}
        return len(loras) == max_loras and request.lora_int_id not in loras
