"""Fit the simulator's efficiency factors (eta_c, eta_m) to the seed's V1-main
run, once, and print them for flightcheck/bench/cost_model.py's CALIBRATED.

    python benchmarks/calibrate.py [--processes 2] [--json docs/calibration.json]

Targets: mean TTFT 359.48 ms and mean TPOT 110.96 ms (vLLM #13637, "V1, Ray,
main"), as the median over workload seeds 0-19 of the one-batch-per-request
policy, with the seed's configuration. Only the two factors move; every other
cost constant is the fixed default of CostParams.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from flightcheck.bench.calibration import fit_efficiencies
from flightcheck.bench.cost_model import CostParams
from flightcheck.bench.simulation import SimConfig
from flightcheck.bench.workload_args import WorkloadArgs

SEEDS = tuple(range(20))     # declared before the fit; the same seeds evaluate both policies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--json", help="also write the fit here")
    args = parser.parse_args()
    base = SimConfig(policy="one-batch-per-request", params=CostParams())
    t0 = time.perf_counter()
    fit = fit_efficiencies(base, WorkloadArgs(), SEEDS, processes=args.processes,
                           log=lambda m: print(m, file=sys.stderr, flush=True))
    result = {"compute_efficiency": round(fit.compute_efficiency, 4),
              "memory_efficiency": round(fit.memory_efficiency, 4),
              "targets": fit.targets, "achieved": fit.achieved, "seeds": list(SEEDS),
              "policy": base.policy, "evaluations": fit.evaluations,
              "seconds": round(time.perf_counter() - t0, 1)}
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
