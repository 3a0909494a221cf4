"""Many workload seeds: each metric's median and spread across seeds.

The median goes under vLLM's result keys, so a multi-seed result reads like
one run; `spread` gives min, quartiles and max of every key, and `per_seed`
the scalar results of each run.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from .metrics import percentile


def aggregate(summaries: Sequence[dict[str, float]]) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """(median of every key, {key: {min, p25, p75, max}})."""
    keys = list(summaries[0])
    median = {k: statistics.median([s[k] for s in summaries]) for k in keys}
    spread = {}
    for k in keys:
        values = [s[k] for s in summaries]
        spread[k] = {"min": min(values), "p25": percentile(values, 25),
                     "p75": percentile(values, 75), "max": max(values)}
    return median, spread


def gain_points(before: float, after: float) -> float:
    """How many percent `after` is below `before` (positive = better latency)."""
    return 100.0 * (before - after) / before if before else 0.0


def paired_gains(a: Sequence[dict[str, float]], b: Sequence[dict[str, float]],
                 key: str) -> list[float]:
    """Per-seed gain of run b over run a on `key` (same seeds, same order)."""
    return [gain_points(x[key], y[key]) for x, y in zip(a, b)]


def multiseed_json(median: dict[str, float], spread: dict[str, dict[str, float]],
                   seeds: Sequence[int], per_seed: Sequence[dict[str, float]],
                   **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = dict(extra)
    out.update(median)
    out.update({"seeds": list(seeds), "statistic": "median over seeds", "spread": spread,
                "per_seed": list(per_seed)})
    return out

