"""The priority policy in replay workloads (docs/request-states.md,
"Priority scheduling"): the keys, what the replay worker and the reference
take from them, and the campaign's feature.

* `config.policy`: "fcfs" (the default) or "priority" (vLLM's
  `SchedulerConfig.policy`, vLLM 0.33 and later);
* a request's `priority`: an integer, lower runs first (vLLM's
  `Request.priority`; 0 by default).

vLLM orders its priority heap by (priority, arrival_time, request_id) and
picks its victim by (priority, arrival_time); the replay's requests all
arrive at time 0.0, so under the policy each is given an arrival time in
the order of arrival (`arrival_time`), in vLLM and in the reference alike,
as the spec's arrival order is.

The feature (`--all-features`): the priority policy with each request's
priority drawn from 0..2, one time in two with seats for three and a pool of
one request's worth (preemptions among running requests of several
priorities), on the releases that have the policy. With a KV
connector the connector's queues are priority heaps too
(docs/request-states.md, "Features together"); there the pool is the
connector's own (its tight pool, one time in two, already preempts
requests whose loads have landed), so a load's blocks still fit.
Beside streaming sessions, a session's later input is stamped when it is
sent (`ArrivalClock.stamp`), as vLLM's front end stamps each
`add_request`: the session takes that arrival time with the input
(`_update_request_as_session`) and keeps its first input's priority
(docs/request-states.md, "Features together").
Standard library only.
"""

from __future__ import annotations

from typing import Any

from .features import Feature, Picker
from .versions import SUPPORTED_VERSIONS
from .workload_limits import MAX_COUNT, LimitError

POLICIES = ("fcfs", "priority")


class PriorityWorkloadError(LimitError):
    """A priority key that is not one (a LimitError: workload.py turns it into a WorkloadError)."""


def policy_from_json(value: Any) -> str:
    if value not in POLICIES:
        raise PriorityWorkloadError(f"config.policy: must be 'fcfs' or 'priority', got {value!r}")
    return value


def priority_from_json(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not -MAX_COUNT <= value <= MAX_COUNT:
        raise PriorityWorkloadError(f"{where}.priority: must be an integer from {-MAX_COUNT} to {MAX_COUNT}, "
                                    f"got {value!r}")
    return value


def scheduler_arguments(policy: str) -> dict[str, Any]:
    """vLLM's `SchedulerConfig` keywords for the policy (none under FCFS, vLLM's default)."""
    return {"policy": policy} if policy != "fcfs" else {}


class ArrivalClock:
    """Arrival times in the order of arrival (1.0, 2.0, ...) under the
    priority policy; vLLM's 0.0 (left as it is) under FCFS."""

    def __init__(self, policy: str) -> None:
        self.on = policy == "priority"
        self.arrivals = 0

    def stamp(self, request: Any, priority: int) -> None:
        """Give a vLLM or reference request its priority and arrival time."""
        if self.on:
            self.arrivals += 1
            request.priority = priority
            request.arrival_time = float(self.arrivals)


def priority_versions() -> tuple[str, ...]:
    """The releases whose V1 scheduler has `SchedulingPolicy.PRIORITY` (0.33 and later; not 0.8.x)."""
    return tuple(v for v in SUPPORTED_VERSIONS if not v.startswith("0.8."))


def _priority_feature(pick: Picker, workload: dict[str, Any]) -> None:
    """The policy, and a priority from 0..2 for each request (with a KV connector, its pool)."""
    config = workload.setdefault("config", {})
    config["policy"] = "priority"
    for request in workload.get("requests", []):
        request["priority"] = pick.integer(0, 2)
    if "kv_connector" in config or "kv_connector" in workload:
        return
    if pick.choice([False, True]) and "max_model_len" in config and "block_size" in config:
        # Seats for several and a pool of one request's worth (+ 0 or 1 block,
        # + vLLM's null block): the victim is often a request already
        # scheduled, or visited and skipped, in the same call.
        one_request = -(-config["max_model_len"] // config["block_size"])
        config["num_blocks"] = min(config.get("num_blocks", one_request + 2), one_request + 1 + pick.integer(0, 1))
        config["max_num_seqs"] = max(config.get("max_num_seqs", 1), 3)


FEATURE = Feature("priority", priority_versions(), 0.5, _priority_feature)
