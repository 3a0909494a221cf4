"""Unbounded proofs with Z3: k-induction with the strengthening invariants,
with an inferred invariant instead, and Spacer with none; one line per
engine and model with the time taken.

    python benchmarks/z3_proofs.py induction default
    python benchmarks/z3_proofs.py inferred shared-k3 --jobs 2
    python benchmarks/z3_proofs.py induction narrow-8x8 --jobs 2
    python benchmarks/z3_proofs.py induction wide-8x8 --jobs 2
    python benchmarks/z3_proofs.py spacer single-seq [--budget 1800]
    python benchmarks/z3_proofs.py spacer-param shared-k3 [--budget 1800]

spacer-param: Spacer on the parameterised model (pool and policy
over-approximated) instantiated with the model's requests, configuration
and prompts, no invariant given (verification/z3/param/spacer.py).
inferred: 1-induction strengthened by the candidates of a grammar that
random walks do not refute and Houdini keeps (verification/z3/induction/inferred.py);
it prints each drop as it happens, then the properties and the kept
candidates (the inferred invariant).
"""

from __future__ import annotations

import argparse
import time

from flightcheck.verification import models
from flightcheck.verification.z3.induction.kinduction import describe_cti, prove_by_induction
from flightcheck.verification.z3.induction.inferred import is_candidate, prove_inferred
from flightcheck.verification.z3.param.spacer import spacer_param
from flightcheck.verification.z3.induction.spacer import spacer

MODELS = dict(models.MODELS, **models.PROOF_MODELS)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("engine", choices=["induction", "inferred", "spacer", "spacer-param"])
    ap.add_argument("model", choices=sorted(MODELS))
    ap.add_argument("--budget", type=float, default=None)
    ap.add_argument("--jobs", type=int, default=1, help="processes for the Houdini rounds of induction and inferred")
    args = ap.parse_args()
    if args.budget is not None and args.budget <= 0:
        ap.error(f"--budget: seconds, more than 0 (got {args.budget:g})")
    if args.jobs < 1:
        ap.error(f"--jobs: at least 1 (got {args.jobs})")
    model = MODELS[args.model]
    t0, cpu0 = time.perf_counter(), time.process_time()
    if args.engine == "spacer-param":
        r = spacer_param(model, time_budget=args.budget)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        print(f"spacer-param on {model.name} ({model.describe()}): {r.status}, {r.num_rules} rules, "
              f"{wall:.1f} s wall, {cpu:.1f} s cpu; {r.message}")
        return
    if args.engine == "induction":
        res = prove_by_induction(model, 1, time_budget=args.budget, jobs=args.jobs)
    elif args.engine == "inferred":
        res = prove_inferred(model, time_budget=args.budget, jobs=args.jobs, progress=lambda line: print("  " + line, flush=True))
    else:
        res = spacer(model, time_budget=args.budget)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    print(f"{args.engine} on {model.name} ({model.describe()}): {wall:.1f} s wall, {cpu:.1f} s cpu")
    for p in res.properties:
        if is_candidate(p.name):
            continue
        print(f"  {p.name:40s} {p.status:8s} {p.seconds:7.1f} s  {p.message}")
        if p.cti:
            print(describe_cti(p.cti))
    for note in res.notes:
        print("  " + note)
    houdini = [p for p in res.properties if is_candidate(p.name) and p.status == "unknown"]
    if houdini:
        print("  true on every sampled state, dropped by Houdini:")
        for p in houdini:
            print(f"    {p.name}  ({p.message})")
    kept = [p.name for p in res.properties if is_candidate(p.name) and p.status == "proved"]
    if kept:
        print("  the inferred invariant (every candidate kept):")
        for name in kept:
            print("    " + name)


if __name__ == "__main__":
    main()
