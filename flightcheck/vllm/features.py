"""The features a campaign can turn on in vLLM's real scheduler, and
`flightcheck vllm campaign --all-features`.

A feature is a part of vLLM's scheduler the plain generated workloads never
reach (a KV connector, priorities, grammars, streaming sessions, reset and
pause): its module says which vLLM releases have it and how to add it to a
generated workload (the keys the replay worker and the reference read).
`--all-features` generates each workload as the plain campaign does, then
turns on each feature its release has in a seeded share of the workloads,
independently, so one workload may mix several. Every choice is a function
of (seed, index, release) alone, so a failure replays from its name.

Each feature lives in its own module, which defines `FEATURE` (or a few,
`FEATURES`); this module only lists them (`FEATURE_MODULES`), so the order
in which features are applied, and with it every seed's workloads, is fixed
by that list.
Standard library only.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence, TypeVar

T = TypeVar("T")


class Picker(Protocol):                        # generate.Picker
    def integer(self, low: int, high: int) -> int: ...

    def choice(self, options: Sequence[T]) -> T: ...


@dataclass(frozen=True)
class Feature:
    name: str                                  # as reports and workload names write it
    versions: tuple[str, ...]                  # the vLLM releases that have it
    share: float                               # of --all-features workloads that get it, in (0, 1]
    # adds its keys to a generated workload, in place; False: it declined (the
    # workload untouched, the feature not listed: the features it excludes may come)
    apply: Callable[[Picker, dict[str, Any]], bool | None]
    # features it is never combined with (either way round): what the spec and
    # the reference do not model together, e.g. a KV connector with drafts
    excludes: tuple[str, ...] = ()


# The modules that define a `FEATURE`, in the order features are applied
# (a new feature goes at the end: the seeds' earlier choices stay as they were).
FEATURE_MODULES: tuple[str, ...] = (
    "flightcheck.vllm.family_features",        # reshape the plain workload: first
    "flightcheck.vllm.kv_generate",
    "flightcheck.vllm.priority_workload",
    "flightcheck.vllm.reset_pause_generate",
    "flightcheck.vllm.grammar_generate",
    "flightcheck.vllm.session_generate",
    "flightcheck.vllm.cadence_generate",
    "flightcheck.vllm.lora_workload",
)

SHARE_RESOLUTION = 1000                        # a share is drawn as an integer in 1..1000


def registered() -> list[Feature]:
    """Every feature, in `FEATURE_MODULES` order."""
    found: list[Feature] = []
    for name in FEATURE_MODULES:
        module = importlib.import_module(name)
        found.extend(getattr(module, "FEATURES", None) or (module.FEATURE,))
    return found


def features_of(version: str) -> list[Feature]:
    """The features release `version` has."""
    return [f for f in registered() if version in f.versions]


def with_features(pick: Picker, workload: dict[str, Any], version: str) -> dict[str, Any]:
    """Turn on, in `workload`, each feature `version` has, each with its
    share, and list their names as its `features`; return the workload."""
    chosen: list[str] = []
    features = registered()
    for feature in features:
        drawn = pick.integer(1, SHARE_RESOLUTION)     # drawn for every feature: the draws stay aligned
        if _excluded(feature, chosen, features):
            continue
        if version in feature.versions and drawn <= round(feature.share * SHARE_RESOLUTION):
            if feature.apply(pick, workload) is not False:
                chosen.append(feature.name)
    config = workload["config"]
    if config.get("enable_chunked_prefill") is False:
        # vLLM's SchedulerConfig: without chunked prefill the budget holds a
        # whole max_model_len, which a later feature may have raised
        config["max_num_batched_tokens"] = max(config["max_num_batched_tokens"], config["max_model_len"])
    workload["features"] = chosen
    return workload


def _excluded(feature: Feature, chosen: list[str], features: list[Feature]) -> bool:
    """Whether a feature already turned on excludes `feature`, or it them."""
    return any(name in feature.excludes or feature.name in f.excludes
               for name in chosen for f in features if f.name == name)


def all_features_versions() -> tuple[str, ...]:
    """The releases `--all-features` runs by default: those with any feature."""
    found = {v for f in registered() for v in f.versions}
    return tuple(sorted(found, key=lambda v: tuple(int(x) for x in v.split("."))))
