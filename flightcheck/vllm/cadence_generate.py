"""vLLM 0.33/0.34's local prefill cadence as an `--all-features` feature
(features.py): `config.prefill_schedule_interval` 2 to 4 (spec/cadence.py;
vLLM's `SchedulerConfig.prefill_schedule_interval`, applied by a scheduler
without data parallelism), beside every other feature, the KV connector
included (docs/request-states.md, "Features together").

Standard library only.
"""

from __future__ import annotations

import random
from typing import Any

from .features import Feature, Picker


def _with_cadence(pick: Picker, workload: dict[str, Any]) -> None:
    workload["config"]["prefill_schedule_interval"] = pick.choice([2, 3, 2, 4])


FEATURE = Feature("prefill-cadence", ("0.33.0", "0.34.0"), 0.3, _with_cadence)


def cadence_workloads(seed: int, count: int) -> list[dict[str, Any]]:
    """The campaign's plain workloads of `seed` (inputs placed during waits
    too), each with an interval of 2 to 4: the cadence alone, for its tests
    and benchmarks/prefill_cadence.py."""
    from .generate import campaign_workloads       # generate.py imports features.py
    workloads = campaign_workloads(seed, count, mid_step_inputs=True)
    for index, workload in enumerate(workloads):
        workload["config"]["prefill_schedule_interval"] = random.Random(f"{seed}/{index}").choice([2, 3, 4])
        workload["name"] = workload["name"].replace("diff-", "diff-cadence-", 1)
    return workloads
