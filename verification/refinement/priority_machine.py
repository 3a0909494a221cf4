"""The refinement fuzzer under the priority policy (docs/request-states.md,
"Priority scheduling"): machine.py's machine with every configuration under
`SchedulerConfig.scheduling_policy = "priority"` and each arrival given a
priority (earlier arrivals leaning to lower ones: `_before_add`) and an
arrival time in the order of arrival (its slot),
so that the reference's waiting order, victims, hand-backs and loop index
are checked against the spec's step by step (`PRIORITY_FUZZED_PROFILES`:
vLLM 0.33 and 0.34, sync and async).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from flightcheck.reference import Request
from flightcheck.reference.outputs import SchedulerOutput
from flightcheck.verification.refinement.bounded_run import fuzz_machine, machine_per_profile
from flightcheck.verification.refinement.machine import RefinementMachine
from flightcheck.verification.refinement.strategies import NEAR_CAP, configs

PRIORITY_FUZZED_PROFILES: tuple[str, ...] = ("vllm-0.34", "vllm-0.34-async", "vllm-0.33", "vllm-0.33-async")


class PriorityRefinementMachine(RefinementMachine):
    """RefinementMachine under the priority policy (the module doc)."""

    profile = PRIORITY_FUZZED_PROFILES[0]

    @initialize(data=st.data(), sample_every_chunk=st.booleans())
    def setup(self, data: Any, sample_every_chunk: bool) -> None:
        cfg = replace(data.draw(configs(self.profile)), scheduling_policy="priority")
        RefinementMachine.setup(self, cfg=cfg, sample_every_chunk=sample_every_chunk)
        self._next_priority = 0

    @precondition(lambda self: self.engine is not None and self._may_arrive())
    @rule(prompt_len=st.integers(1, 4) | st.integers(1, 15 + NEAR_CAP), family=st.integers(0, 1),
          tail=st.integers(0, 4), max_tokens=st.integers(6, 20), reuse=st.integers(0, 3),
          priority=st.integers(0, 2))
    def arrive(self, prompt_len: int, family: int, tail: int, max_tokens: int, reuse: int,
               priority: int) -> None:
        """machine.py's arrival, with a priority."""
        self._next_priority = priority
        RefinementMachine.arrive(self, prompt_len=prompt_len, family=family, tail=tail,
                                 max_tokens=max_tokens, reuse=reuse)

    def _before_add(self, request: Request, slot: int) -> None:
        """Earlier arrivals lean to lower priorities (larger numbers): the
        draw `d` gives `max(0, 3 - slot - d)`, so that victims often sit
        before the request the running loop allocates for (already scheduled
        in the call, or skipped: #23347, #49097); `d` = 0 (what shrinking
        reaches) makes the priorities fall with every arrival."""
        request.priority = max(0, 3 - slot - self._next_priority)
        request.arrival_time = float(slot + 1)

    def _check_request_data(self, before: Any, output: SchedulerOutput) -> None:
        """The batch vLLM's workers would get: drafts only for requests it
        schedules (#28558), and its token count the sum of theirs."""
        RefinementMachine._check_request_data(self, before, output)
        strays = set(output.scheduled_spec_decode_tokens) - set(output.num_scheduled_tokens)
        if strays:
            self._fail(f"batch {output.batch_id} carries drafts of {sorted(strays)}, which it does not schedule")
        if sum(output.num_scheduled_tokens.values()) != output.total_num_scheduled_tokens:
            self._fail(f"batch {output.batch_id} counts {output.total_num_scheduled_tokens} tokens, "
                       f"its requests {sum(output.num_scheduled_tokens.values())}")


# The machine with every configuration under a profile (refused outside PRIORITY_FUZZED_PROFILES).
priority_machine = machine_per_profile(PriorityRefinementMachine, "priority", PRIORITY_FUZZED_PROFILES)


def priority_fuzz(steps: int, seed: int, profile: str, steps_per_program: int = 60,
                  shrink: bool = True, mutant: str | None = None) -> str | None:
    """A refinement run under the priority policy and `profile`, `steps`
    rule steps from `seed`, the reference's `mutant` in force if given; the
    failure (the program, shrunk unless `shrink` is off, and its message),
    or None."""
    return fuzz_machine(priority_machine(profile), steps, seed, steps_per_program, shrink, mutant)
