#!/usr/bin/env python3
"""Seeded random workloads for `flightcheck vllm replay`, as JSON Lines.

    scripts/vllm-workloads.py mixed 0 150 > mixed.jsonl
    flightcheck vllm replay mixed.jsonl --trace traces/ --check --json > results.json

Five families (the figures in flightcheck/vllm/README.md were measured on
them); workload i of a family is a function of i alone:
* `mixed`: K 2-4, block size 2 or 4, 2-5 requests, tight (60%) or roomy
  pools, a shared prefix (50%), thresholds, aborts (25% of requests), EOS;
* `small-blocks`: K 3-4, block size 2, small pools, 2-4 requests;
* `preallocating`: K 3-4, block size 8 or 16, prompts and outputs up to 40,
  pools from the largest request to all of them: room for 0.8.4's 64-token
  preallocation to run out and preempt.
* `id-reuse` / `id-fresh` (vLLM 0.33): the 135-point grid of the request-id
  reuse bug, old `r0` aborted at step 1 with its batch in flight and a new
  request added at once under `r0` (`id-reuse`) or under a fresh id
  (`id-fresh`), one other request; point i of both is the same workload.
The differential against our reference (issue 19 point 3) has its own
generator, flightcheck/vllm/generate.py, and command,
`python -m flightcheck.vllm.campaign --workloads N`.
"""

from __future__ import annotations

import itertools
import json
import random
import sys
from typing import Any


def mixed(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    num_stages, block_size = rng.choice([2, 3, 4]), rng.choice([2, 4])
    count = rng.randint(2, 5)
    tight = rng.random() < 0.6
    prefixes = {"p": rng.choice([4, 8])} if rng.random() < 0.5 else {}
    requests = []
    for i in range(count):
        request: dict[str, Any] = {"id": f"r{i}", "prompt_len": rng.randint(3, 20), "max_tokens": rng.randint(1, 10),
                                   "arrival_step": rng.choice([0, 0, rng.randint(0, 12)])}
        if prefixes and rng.random() < 0.6:
            request["prefix"] = "p"
        if rng.random() < 0.25:
            request["abort_step"] = request["arrival_step"] + rng.randint(0, 12)
        if rng.random() < 0.3:
            request["eos_probability"] = 0.2
        requests.append(request)
    need = sum((r["prompt_len"] + r["max_tokens"]) // block_size + 1 for r in requests)
    blocks = max(4, need // rng.choice([2, 3])) if tight else need + 4
    blocks = max(blocks, max((r["prompt_len"] + r["max_tokens"]) // block_size + 3 for r in requests))
    config = {"num_stages": num_stages, "max_num_batched_tokens": rng.choice([8, 16, 32]),
              "max_num_seqs": rng.choice([2, 3, 4]), "block_size": block_size, "num_blocks": blocks,
              "max_model_len": 64, "long_prefill_token_threshold": rng.choice([0, 0, 4, 6]),
              "prefix_caching": rng.random() < 0.6}
    return {"name": f"mixed-{seed}", "seed": seed, "config": config, "prefixes": prefixes,
            "requests": requests, "max_steps": 3000}


def small_blocks(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    num_stages, block_size = rng.choice([3, 4]), 2
    requests: list[dict[str, Any]] = [
        {"id": f"r{i}", "prompt_len": rng.randint(3, 10), "max_tokens": rng.randint(3, 12),
         "arrival_step": rng.choice([0, 0, rng.randint(0, 6)])} for i in range(rng.randint(2, 4))]
    for request in requests:
        if rng.random() < 0.2:
            request["abort_step"] = request["arrival_step"] + rng.randint(1, 10)
    biggest = max((r["prompt_len"] + r["max_tokens"]) // block_size + 1 for r in requests)
    config = {"num_stages": num_stages, "max_num_batched_tokens": rng.choice([8, 16]),
              "max_num_seqs": rng.choice([2, 3, 4]), "block_size": block_size,
              "num_blocks": biggest + rng.randint(1, 6), "max_model_len": 64,
              "long_prefill_token_threshold": rng.choice([0, 4]), "prefix_caching": rng.random() < 0.5}
    return {"name": f"small-blocks-{seed}", "seed": seed, "config": config, "requests": requests, "max_steps": 2000}


def preallocating(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    num_stages, block_size = rng.choice([3, 4]), rng.choice([8, 16])
    requests: list[dict[str, Any]] = [
        {"id": f"r{i}", "prompt_len": rng.randint(5, 40), "max_tokens": rng.randint(5, 40),
         "arrival_step": rng.choice([0, 0, rng.randint(0, 10)])} for i in range(rng.randint(2, 5))]
    for request in requests:
        if rng.random() < 0.2:
            request["abort_step"] = request["arrival_step"] + rng.randint(1, 20)
        if rng.random() < 0.2:
            request["eos_probability"] = 0.1
    need = [-(-(r["prompt_len"] + r["max_tokens"]) // block_size) for r in requests]
    config = {"num_stages": num_stages, "max_num_batched_tokens": rng.choice([16, 32, 64]),
              "max_num_seqs": rng.choice([2, 3, 4]), "block_size": block_size,
              "num_blocks": max(need) + 1 + rng.randint(1, sum(need)), "max_model_len": 128,
              "long_prefill_token_threshold": rng.choice([0, 8]), "prefix_caching": rng.random() < 0.5}
    return {"name": f"preallocating-{seed}", "seed": seed, "config": config, "requests": requests,
            "max_steps": 3000}


# The id-reuse grid (vLLM 0.33, flightcheck/vllm/README.md): pool, the old
# request's prompt, the prompt of the request that reuses its id, the other
# request's prompt; 135 points, workload i is point i (i >= 135 wraps).
REUSE_GRID = list(itertools.product([6, 8, 10, 12, 16], [8, 12, 16], [4, 8, 24], [4, 16, 32]))


def _reuse(seed: int, reuse: bool) -> dict[str, Any]:
    blocks, old, new, other = REUSE_GRID[seed % len(REUSE_GRID)]
    again: dict[str, Any] = {"id": "r0-again", "prompt_len": new, "max_tokens": 20, "arrival_step": 1}
    if reuse:
        again["reuse_id"] = "r0"      # sent to vLLM as r0, right after old r0's abort
    config = {"num_stages": 3, "max_num_batched_tokens": 16, "max_num_seqs": 4, "block_size": 4,
              "num_blocks": blocks, "max_model_len": 256, "prefix_caching": False}
    name = f"{'id-reuse' if reuse else 'id-fresh'}-{seed}-nb{blocks}-old{old}-new{new}-r1{other}"
    return {"name": name, "seed": 1, "config": config,
            "requests": [{"id": "r0", "prompt_len": old, "max_tokens": 20, "abort_step": 1},
                         {"id": "r1", "prompt_len": other, "max_tokens": 20}, again]}


FAMILIES = {"mixed": mixed, "small-blocks": small_blocks, "preallocating": preallocating,
            "id-reuse": lambda seed: _reuse(seed, True), "id-fresh": lambda seed: _reuse(seed, False)}


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in FAMILIES:
        sys.stderr.write(f"usage: vllm-workloads.py {{{','.join(FAMILIES)}}} FIRST_SEED END_SEED\n")
        return 2
    family, first, end = FAMILIES[argv[0]], int(argv[1]), int(argv[2])
    for seed in range(first, end):
        print(json.dumps(family(seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
