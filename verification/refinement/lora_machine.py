"""The refinement fuzzer with LoRA's `max_loras` cap and the prompt-logprobs
limit on the prefix cache (docs/request-states.md, "LoRA max_loras" and
"Prompt logprobs and the prefix cache"): machine.py's machine with a LoRA
config, the reference's `LoraCap` (reference/lora.py) and its cache
manager's lookup against spec/lora.py, under vLLM 0.33 and 0.34, sync and
async (`LORA_FUZZED_PROFILES`).

The environment's choices beyond machine.py's: the configuration's
`max_loras` (1 or 2) and room in the pool for up to two more requests
(machine.py's pools hold about one, and the cap binds only while requests of
different LoRAs run side by side); each arrival's LoRA (0, none, to 3) and
whether it asks for prompt logprobs. The LoRA is part of every block hash
(the reference's, as vLLM's `generate_block_hash_extra_keys`), so a family's
shared prefix is a hit only between requests of the same LoRA; the ledger
hashes with it (abstraction.py), and the abstraction adds each request's
LoRA and flag as the spec keeps them.

Before the refinement map, the reference's own schedule step is held to the
feature's properties (`_check_reference_step`): LORA1 on the state it
reaches, and LORA2 and PL1 on the batch it formed, read back from the
abstracted state (spec/lora_properties.py states them on the spec's
`Scheduled`; here it is the reference's). The spec keeps them on every step
(they are among its properties, checked on the abstracted state after the
map), so a reference that breaks one is named by the property, not only by
the step where it leaves the spec.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from flightcheck import spec
from flightcheck.reference import Request
from flightcheck.reference.config import cdiv
from flightcheck.spec.launch import ScheduledEntry
from flightcheck.spec.lora import lora1_loras_within_cap
from flightcheck.spec.lora_properties import lora2_held_request_is_passed_over, pl1_prompt_logprobs_read_no_cache
from flightcheck.spec.schedule import Scheduled
from flightcheck.verification.refinement.bounded_run import fuzz_machine, machine_per_profile
from flightcheck.verification.refinement.checks import AbortMany
from flightcheck.verification.refinement.machine import RefinementMachine
from flightcheck.verification.refinement.strategies import NEAR_CAP, configs

LORA_FUZZED_PROFILES: tuple[str, ...] = ("vllm-0.34", "vllm-0.34-async", "vllm-0.33", "vllm-0.33-async")

# The properties of a schedule step, held to the reference's own batch: name -> predicate
# on (before, the reference's step as a `Scheduled`, cfg). LORA1 is a state invariant.
LORA1 = "LORA1_loras_within_cap"
STEP_PROPERTIES: dict[str, Callable[[spec.State, Scheduled, spec.Config], bool]] = {
    "LORA2_held_request_is_passed_over": lora2_held_request_is_passed_over,
    "PL1_prompt_logprobs_read_no_cache": pl1_prompt_logprobs_read_no_cache,
}


class LoraRefinementMachine(RefinementMachine):
    """RefinementMachine with a LoRA config and prompt logprobs (the module doc)."""

    profile = LORA_FUZZED_PROFILES[0]

    @initialize(data=st.data(), sample_every_chunk=st.booleans(), max_loras=st.integers(1, 2),
                room=st.integers(0, 2))
    def setup(self, data: Any, sample_every_chunk: bool, max_loras: int, room: int) -> None:
        cfg = data.draw(configs(self.profile))
        per_request = cdiv(cfg.max_model_len, cfg.block_size)
        cfg = replace(cfg, max_loras=max_loras, prompt_logprobs=True,
                      num_blocks=cfg.num_blocks + room * per_request)
        RefinementMachine.setup(self, cfg=cfg, sample_every_chunk=sample_every_chunk)
        self._next_lora = (0, False)

    @precondition(lambda self: self.engine is not None and self._may_arrive())
    @rule(prompt_len=st.integers(1, 4) | st.integers(1, 15 + NEAR_CAP), family=st.integers(0, 1),
          tail=st.integers(0, 4), max_tokens=st.integers(6, 20), reuse=st.integers(0, 3),
          lora=st.integers(0, 3), prompt_logprobs=st.booleans())
    def arrive(self, prompt_len: int, family: int, tail: int, max_tokens: int, reuse: int,
               lora: int, prompt_logprobs: bool) -> None:
        """machine.py's arrival, with a LoRA (0: none) and prompt logprobs or not."""
        self._next_lora = (lora, prompt_logprobs)
        RefinementMachine.arrive(self, prompt_len=prompt_len, family=family, tail=tail,
                                 max_tokens=max_tokens, reuse=reuse)

    def _before_add(self, request: Request, slot: int) -> None:
        request.lora_int_id, request.prompt_logprobs = self._next_lora

    # -- the feature's properties on the reference's own step ---------------------

    def _check(self, action: spec.Action | AbortMany, expected: spec.State | None = None) -> None:
        if isinstance(action, spec.Schedule):
            self._check_reference_step(self._abstract())
        super()._check(action, expected)

    def _check_reference_step(self, after: spec.State) -> None:
        """LORA1 on the state the reference's `schedule()` reached, LORA2 and
        PL1 on the batch it formed (the module doc)."""
        before, cfg = self.state, self.spec_cfg
        broken = [] if lora1_loras_within_cap(after, cfg) else [LORA1]
        scheduled = reference_scheduled(before, after)
        if scheduled is not None:
            broken += [name for name, holds in STEP_PROPERTIES.items() if not holds(before, scheduled, cfg)]
        if broken:
            self._fail(f"{', '.join(broken)} broken by the reference's `schedule`\n"
                       f"  before:    {spec.describe(before)}\n"
                       f"  reference: {spec.describe(after)}")


def reference_scheduled(before: spec.State, after: spec.State) -> Scheduled | None:
    """The reference's schedule step as the spec's `Scheduled`: the batch it
    queued (the newest in flight; None if it queued none), each entry's
    prefix hit its start where the request was not running (an admission
    or a resumption computes from its hit: preemption took its counter back
    to 0), and the running requests it preempted."""
    if len(after.in_flight) != len(before.in_flight) + 1:
        return None
    entries = tuple(ScheduledEntry(e.req, e.start, e.n,
                                   e.start if before.requests[e.req].status is not spec.Status.RUNNING else 0,
                                   e.drafts, e.samples, ()) for e in after.in_flight[-1])
    preempted = tuple(r for r in before.running if after.requests[r].status is spec.Status.PREEMPTED)
    return Scheduled(after, entries, preempted)


# The machine with every configuration under a profile (refused outside LORA_FUZZED_PROFILES).
lora_machine = machine_per_profile(LoraRefinementMachine, "LoRA", LORA_FUZZED_PROFILES)


def lora_fuzz(steps: int, seed: int, profile: str, steps_per_program: int = 60,
              shrink: bool = True, mutant: str | None = None) -> str | None:
    """A refinement run with a LoRA cap and prompt logprobs under `profile`,
    `steps` rule steps from `seed`, the reference's `mutant` in force if
    given; the failure (the program, shrunk unless `shrink` is off, and its
    message), or None."""
    return fuzz_machine(lora_machine(profile), steps, seed, steps_per_program, shrink, mutant)
