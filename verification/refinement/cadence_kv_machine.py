"""The refinement fuzzer of the prefill cadence beside the KV connector
(docs/request-states.md, "Prefill cadence", "Beside the KV connector"):
kv_machine.py's machine with every configuration drawing
`SchedulerConfig.prefill_schedule_interval` 2 to 4, so that the
reference's hold, capacity bound, `is_prefill_chunk` and `deferred_waiting`
are checked against the spec's step by step (abstraction.py `_cadence`),
where the connector's loop starts, holds, promotes and parks loads, and
loads fail (`CADENCE_KV_FUZZED_PROFILES`: vLLM 0.33 and 0.34, sync and
async). The reference reserves blocks for the loads and prefills in flight
as its profile says (`kv_load_reservation=None`), as the spec models them
(spec/kv_loads.py `fits_beside_reservations`): with kv_machine.py's
`kv_load_reservation=False` the two part at the first async load that
vLLM 0.34's reservation refuses (the spec stops, the reference parks).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import initialize

from flightcheck.reference import SchedulerConfig
from flightcheck.verification.refinement.bounded_run import fuzz_machine, machine_per_profile
from flightcheck.verification.refinement.kv_machine import KV_FUZZED_PROFILES, KvRefinementMachine, kv_configs
from flightcheck.verification.refinement.machine import RefinementMachine

CADENCE_KV_FUZZED_PROFILES: tuple[str, ...] = KV_FUZZED_PROFILES


@st.composite
def cadence_kv_configs(draw: Any, profile: str) -> SchedulerConfig:
    """kv_machine.py's configurations under `profile`, with an interval of 2 to 4."""
    return replace(draw(kv_configs(profile)), prefill_schedule_interval=draw(st.sampled_from([2, 3, 2, 4])),
                   kv_load_reservation=None)


class CadenceKvRefinementMachine(KvRefinementMachine):
    """KvRefinementMachine with the prefill cadence (the module doc)."""

    profile = CADENCE_KV_FUZZED_PROFILES[0]

    @initialize(data=st.data(), sample_every_chunk=st.booleans())
    def setup(self, data: Any, sample_every_chunk: bool) -> None:
        RefinementMachine.setup(self, cfg=data.draw(cadence_kv_configs(self.profile)),
                                sample_every_chunk=sample_every_chunk)
        self.scheduler.connector.scripted = True
        self._report_codes: list[int] = []
        self._after_completion: list[Any] = []


# The machine with every configuration under a profile (refused outside CADENCE_KV_FUZZED_PROFILES).
cadence_kv_machine = machine_per_profile(CadenceKvRefinementMachine, "prefill cadence + KV connector",
                                         CADENCE_KV_FUZZED_PROFILES)


def cadence_kv_fuzz(steps: int, seed: int, profile: str, steps_per_program: int = 60,
                    shrink: bool = True, mutant: str | None = None) -> str | None:
    """A refinement run with the cadence and a connector under `profile`,
    `steps` rule steps from `seed`, the reference's `mutant` in force if
    given; the failure (the program, shrunk unless `shrink` is off, and its
    message), or None."""
    return fuzz_machine(cadence_kv_machine(profile), steps, seed, steps_per_program, shrink, mutant)
