"""LoRA's max_loras cap and the prompt-logprobs limit against vLLM's real scheduler.

    python benchmarks/lora_cap.py [--versions 0.34.0,0.33.0] [--seed 5] [--workloads 60]

For each release and mode (sync, async): the campaign's plain workloads of
the seed with a cap of 1 or 2 and most requests given one of up to three
LoRAs, and in one workload in two one or two requests asking for prompt
logprobs (flightcheck/vllm/lora_workload.py `lora_workloads`), through
vLLM's scheduler and the reference; prints the differential (identical,
unexplained), check-trace's verdicts against vLLM's ground truth, and the
reference's waiting-loop passes: how many the cap passed over, how many of
those while a request behind was admitted in the same call, and how many
prompt-logprobs admissions found a cached prefix they did not read
(docs/request-states.md, "LoRA max_loras"). Needs the vLLM venvs
(scripts/build-vllm-venv.sh).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

from flightcheck.reference import kv_cache_manager, lora
from flightcheck.vllm.campaign import run_version
from flightcheck.vllm.lora_workload import lora_workloads


def _counting(seen: Counter) -> None:
    """Count, in every reference scheduler, the cap's passes and the unread hits."""
    held = lora.LoraCap._held_by_lora_cap
    lookup = kv_cache_manager.KVCacheManager.get_computed_blocks

    def counted_held(self, request) -> bool:
        answer = held(self, request)
        seen["passed_over"] += answer
        return answer

    def counted_lookup(self, request):
        if request.prompt_logprobs and self.enable_caching:
            request.prompt_logprobs = False
            seen["unread_hit_tokens"] += lookup(self, request)[1]
            request.prompt_logprobs = True
        return lookup(self, request)

    lora.LoraCap._held_by_lora_cap = counted_held
    kv_cache_manager.KVCacheManager.get_computed_blocks = counted_lookup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--versions", default="0.34.0,0.33.0")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--workloads", type=int, default=60)
    args = parser.parse_args()
    seen: Counter = Counter()
    _counting(seen)
    for version in args.versions.split(","):
        for mode in ("sync", "async"):
            seen.clear()
            report = run_version(version, lora_workloads(args.seed, args.workloads), args.seed, False,
                                 lambda line: None, mode == "async")
            print(json.dumps({"version": version, "mode": mode, "workloads": report.workloads,
                              "identical": report.identical, "unexplained": report.unexplained,
                              "verdicts": dict(report.verdicts), "reference": dict(seen)}), flush=True)


if __name__ == "__main__":
    main()
