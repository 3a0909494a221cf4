"""Fit the cost model's two efficiency factors to one measured run.

The seed's V1-main run (one-batch-per-request) gives two targets, mean TTFT
and mean TPOT; the simulator gives both as the median over declared workload
seeds. We solve sim(eta_c, eta_m) = target by Newton's method on
log(sim / target) over log(eta), with a finite-difference Jacobian, keeping
each eta in (0, 1]. Nothing else is fitted; continue-prefill is then
*predicted* with the fitted factors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from multiprocessing import get_context

from .multiseed import aggregate
from .seed_results import V1_MAIN
from .simulation import SimConfig, simulate
from .workload_args import WorkloadArgs, build_workload

TARGET_KEYS = ("mean_ttft_ms", "mean_tpot_ms")


@dataclass(frozen=True)
class Fit:
    compute_efficiency: float
    memory_efficiency: float
    achieved: dict[str, float]       # median over seeds at the fitted factors
    targets: dict[str, float]
    evaluations: int


def _one(job: tuple[SimConfig, WorkloadArgs, int]) -> dict[str, float]:
    config, args, seed = job
    return simulate(build_workload(args, seed), config).metrics.summary()


def median_summary(config: SimConfig, args: WorkloadArgs, seeds: Sequence[int],
                   processes: int = 1) -> dict[str, float]:
    jobs = [(config, args, s) for s in seeds]
    if processes > 1:
        with get_context("fork").Pool(processes) as pool:
            summaries = pool.map(_one, jobs)
    else:
        summaries = [_one(j) for j in jobs]
    return aggregate(summaries)[0]


@dataclass(frozen=True)
class Newton:
    """The solver's knobs: the factors it starts from, the largest |log(sim /
    target)| it accepts, and how many Newton steps it may take."""
    start: tuple[float, float] = (0.5, 0.6)
    tolerance: float = 0.002
    max_iterations: int = 12


def fit_efficiencies(base: SimConfig, args: WorkloadArgs, seeds: Sequence[int],
                     targets: dict[str, float] | None = None, *, solver: Newton = Newton(), processes: int = 1,
                     log: Callable[[str], None] = lambda _: None) -> Fit:
    start, tolerance, max_iterations = solver.start, solver.tolerance, solver.max_iterations
    targets = targets or {k: V1_MAIN[k] for k in TARGET_KEYS}
    evaluations = 0

    def residual(x: tuple[float, float]) -> tuple[list[float], dict[str, float]]:
        nonlocal evaluations
        evaluations += 1
        eta_c, eta_m = math.exp(x[0]), math.exp(x[1])
        config = replace(base, params=base.params.with_efficiency(eta_c, eta_m))
        got = median_summary(config, args, seeds, processes)
        r = [math.log(got[k] / targets[k]) for k in TARGET_KEYS]
        log(f"eta_c={eta_c:.4f} eta_m={eta_m:.4f} -> "
            + ", ".join(f"{k}={got[k]:.2f}" for k in TARGET_KEYS))
        return r, got

    x = (math.log(start[0]), math.log(start[1]))
    r, got = residual(x)
    step = 0.03
    for _ in range(max_iterations):
        if max(abs(v) for v in r) < tolerance:
            break
        # Jacobian d r / d log eta by forward differences.
        columns = []
        for j in range(2):
            xj = (x[0] + step, x[1]) if j == 0 else (x[0], x[1] + step)
            rj, _ = residual(xj)
            columns.append([(rj[i] - r[i]) / step for i in range(2)])
        (a, c), (b, d) = columns            # columns[j][i] = d r_i / d x_j
        det = a * d - b * c
        if abs(det) < 1e-12:
            raise RuntimeError("calibration: the two targets do not depend on the factors "
                               "independently (singular Jacobian)")
        dx0 = -(d * r[0] - b * r[1]) / det
        dx1 = -(-c * r[0] + a * r[1]) / det
        # Damp large steps (the metrics move in small jumps as batches change).
        scale = min(1.0, 0.5 / max(abs(dx0), abs(dx1), 1e-12))
        x = (min(0.0, x[0] + scale * dx0), min(0.0, x[1] + scale * dx1))
        r, got = residual(x)
    return Fit(math.exp(x[0]), math.exp(x[1]), got, dict(targets), evaluations)
