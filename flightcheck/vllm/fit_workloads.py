"""The workloads `flightcheck vllm fit` replays: one list of families, each
a seeded generator and the profiles it tells apart.

Workload i of a fit campaign comes from family `i % len(FAMILIES)`, seeded
by (seed, i) alone (`generate.hash_seed`), so a fit run is a function of its
seed and size, and a misfit is replayed from its name. A family that needs
new modelling (0.34's mid-step inputs, chunked prefill off, 0.34's opt-in
cache-aware admission reorder) joins the list when its branch lands; the
generator's own knob families (`generate.FAMILIES`, where it has them) join
it by themselves (`generator_families`). The rest of fit reads only this
list.

Every workload suits the reference (generate.py's rule: the pool holds one
request of max_model_len tokens besides vLLM's null block). Standard library
only.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from . import generate
from .generate import RandomPicker, cdiv, generate_workload, hash_seed

Workload = dict[str, Any]


@dataclass(frozen=True)
class Family:
    name: str
    # Which profiles (or profile constants) its workloads tell apart, and how.
    separates: str
    make: Callable[[RandomPicker, str, int], Workload]


def _mixed(pick: RandomPicker, name: str, seed: int) -> Workload:
    """The differential campaign's own generator (generate.py)."""
    return generate_workload(pick, name, seed)


def _config(pick: RandomPicker, requests: list[Workload], block_size: int, budget: int,
            threshold: int, max_num_seqs: int) -> Workload:
    """A roomy pool for `requests` (every request fits at once, plus slack)."""
    longest = max(r["prompt_len"] + r["max_tokens"] for r in requests)
    max_model_len = longest + pick.integer(0, 4)
    usable = max(sum(cdiv(r["prompt_len"] + r["max_tokens"], block_size) for r in requests) + 2,
                 cdiv(max_model_len, block_size))
    return {"num_stages": pick.integer(2, 4), "max_num_batched_tokens": budget, "max_num_seqs": max_num_seqs,
            "block_size": block_size, "num_blocks": usable + 1, "max_model_len": max_model_len,
            "long_prefill_token_threshold": min(threshold, max_model_len),
            "prefix_caching": pick.choice([False, True])}


def _mid_step_inputs(pick: RandomPicker, name: str, seed: int) -> Workload:
    """The differential's generator with each arrival and abort, one time in
    two, placed while its step waits for a batch's output (`via "wait"`):
    0.34's `EngineCoreProc._wait_for_output` takes them there, 0.33 and
    earlier after the step."""
    return generate_workload(pick, name, seed, mid_step_inputs=True)


def _lone_long_prefill(pick: RandomPicker, name: str, seed: int) -> Workload:
    """One long prompt alone with a long-prefill threshold below the budget;
    a second request sometimes arrives a few steps later, once the first is
    running. vLLM 0.33 applies the threshold only with company
    (`threshold_needs_company`), 0.8.x always."""
    budget = pick.choice([16, 32])
    requests = [{"id": "r0", "prompt_len": pick.integer(budget // 2 + 1, 40), "max_tokens": pick.integer(1, 6)}]
    if pick.choice([False, True]):
        requests.append({"id": "r1", "prompt_len": pick.integer(4, 20), "max_tokens": pick.integer(1, 6),
                         "arrival_step": pick.integer(1, 6)})
    config = _config(pick, requests, pick.choice([4, 8]), budget, pick.choice([3, 4, 6]), 4)
    return {"name": name, "seed": seed, "config": config, "requests": requests, "max_steps": 3000}


def _pipelined_prefill(pick: RandomPicker, name: str, seed: int) -> Workload:
    """Long prompts in small chunks under K >= 2 stages: 0.8.5 and later keep
    several chunks of one request in flight, 0.8.4 one batch per request
    (`continue_prefill` / `policy`)."""
    requests = [{"id": f"r{i}", "prompt_len": pick.integer(12, 32), "max_tokens": pick.integer(1, 6),
                 "arrival_step": pick.choice([0, pick.integer(0, 4)])} for i in range(pick.integer(1, 3))]
    config = _config(pick, requests, pick.choice([2, 4]), pick.choice([4, 8]), 0, 4)
    return {"name": name, "seed": seed, "config": config, "requests": requests, "max_steps": 3000}


def _admission_burst(pick: RandomPicker, name: str, seed: int) -> Workload:
    """Several requests arriving at one step with a budget that admits one or
    two per batch, then a second wave once some have finished: the order of
    admission shows in every batch, and the second wave's blocks show the
    order freed blocks are reused in (0.33's `unhashed_blocks_to_head` and
    release order against 0.8.x's)."""
    first, second = pick.integer(0, 3), pick.integer(8, 16)
    requests = [{"id": f"r{i}", "prompt_len": pick.integer(3, 14), "max_tokens": pick.integer(1, 6),
                 "arrival_step": first} for i in range(pick.integer(3, 5))]
    requests += [{"id": f"r{len(requests) + i}", "prompt_len": pick.integer(3, 14),
                  "max_tokens": pick.integer(1, 6), "arrival_step": second} for i in range(pick.integer(1, 3))]
    config = _config(pick, requests, pick.choice([2, 4]), pick.choice([8, 16]), 0, pick.integer(2, 4))
    return {"name": name, "seed": seed, "config": config, "requests": requests, "max_steps": 3000}


FAMILIES: list[Family] = [
    Family("mid-step-inputs", "0.34 (inputs taken while a step waits for a batch's output) against 0.33 and "
           "earlier", _mid_step_inputs),
    Family("mixed", "0.8.x against 0.33 and later (block order, full-sequence admission, stop order, "
           "threshold company); 0.8.4 against 0.8.5 where chunks pipeline", _mixed),
    Family("lone-long-prefill", "threshold_needs_company: 0.8.x against 0.33 and later", _lone_long_prefill),
    Family("pipelined-prefill", "continue_prefill / policy: 0.8.4 against 0.8.5 and later",
           _pipelined_prefill),
    Family("admission-burst", "the waiting queue's admission order (no profile constant: FCFS in every "
           "release); block reuse order: 0.8.x against 0.33 and later", _admission_burst),
]


def _generated(pick: RandomPicker, name: str, seed: int, family: str) -> Workload:
    return generate_workload(pick, name, seed, family=family)


def generator_families() -> list[Family]:
    """The knob families the differential's generator defines
    (`generate.FAMILIES`, name -> the knobs it sets: chunked prefill off,
    0.34's cache-aware admission order), each a fit family of its own; none
    where the generator defines none."""
    return [Family(name, f"the generator's {name!r} knobs (generate.py)", partial(_generated, family=name))
            for name in getattr(generate, "FAMILIES", {})]


def all_families() -> list[Family]:
    """Fit's own families, then the generator's."""
    return FAMILIES + generator_families()


def fit_workloads(seed: int, count: int, families: list[Family] | None = None) -> list[Workload]:
    """Workloads 0 .. count-1 of a fit campaign: workload i from family
    i % len(families), named `fit-FAMILY-SEED-I`."""
    chosen = all_families() if families is None else families
    out = []
    for index in range(count):
        family = chosen[index % len(chosen)]
        seeded = hash_seed(seed, index)
        out.append(family.make(RandomPicker(seeded), f"fit-{family.name}-{seed}-{index}", seeded))
    return out
