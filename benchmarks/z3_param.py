"""The parameterised proof (any number of requests) for K in-flight batches:
one line per K with the seconds taken; with --link, the soundness link's
figures on the exhaustive small models too.

    python benchmarks/z3_param.py                 # K = 2 3 4 8
    python benchmarks/z3_param.py --K 2 16 --link
"""

from __future__ import annotations

import argparse
import time

from flightcheck.verification import models
from flightcheck.verification.z3.param.link import check_link
from flightcheck.verification.z3.param.proof import prove

LINK_MODELS = (models.PRESSURE_K2, models.SHARED_K3, models.ONE_BATCH, models.SINGLE_SEQ, models.CROWDED)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--K", type=int, nargs="+", default=[2, 3, 4, 8])
    ap.add_argument("--link", action="store_true", help="also check the link on the small models")
    args = ap.parse_args()
    for K in args.K:
        t0, cpu0 = time.perf_counter(), time.process_time()
        proof = prove(K)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        slowest = max(proof.queries, key=lambda q: q.seconds)
        verdict = "proved" if proof.ok else f"NOT proved: {[q.name for q in proof.failures]}"
        print(f"K={K:<3d} {verdict}  {len(proof.queries)} queries  {wall:.2f} s wall  {cpu:.2f} s cpu"
              f"  (slowest: {slowest.name} {slowest.seconds:.2f} s)")
    if not args.link:
        return
    for model in LINK_MODELS:
        t0 = time.perf_counter()
        report = check_link(model)
        verdict = "holds" if report.ok else f"FAILS: {report.problems[:2]}"
        print(f"link {model.name:12s} {verdict}  {report.states} states  {report.edges} edges"
              f"  {report.micro_steps} micro-steps  {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
