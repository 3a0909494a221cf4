"""Unbounded proofs with Z3: k-induction with the strengthening invariants,
and Spacer with none; one line per engine and model with the time taken.

    python benchmarks/z3_proofs.py induction default
    python benchmarks/z3_proofs.py induction wide-8x8
    python benchmarks/z3_proofs.py spacer single-seq [--budget 1800]
    python benchmarks/z3_proofs.py spacer-param shared-k3 [--budget 1800]

spacer-param: Spacer on the parameterised model (pool and policy
over-approximated) instantiated with the model's requests, configuration
and prompts, no invariant given (verification/z3_param_spacer.py).
"""

from __future__ import annotations

import argparse
import time

from flightcheck.spec import Config, Prompt
from flightcheck.verification import models
from flightcheck.verification.z3_induction import describe_cti, prove_by_induction
from flightcheck.verification.z3_param_spacer import spacer_param
from flightcheck.verification.z3_spacer import spacer

# 8 requests, K = 8, every feature on (for the hand-written-invariant proof at scale).
WIDE = models.Model(
    "wide-8x8",
    Config(num_stages=8, max_num_batched_tokens=6, max_num_seqs=4, block_size=2, num_blocks=10,
           max_model_len=8, prefix_caching=True, num_spec_tokens=1, long_prefill_token_threshold=3),
    tuple(Prompt(3, 2, (5,)) if r % 2 else Prompt(2, 2, (5,)) for r in range(8)))

# The same with the smallest pool and budget that keep every feature: 3 blocks, budget 2.
NARROW = models.Model(
    "narrow-8x8",
    Config(num_stages=8, max_num_batched_tokens=2, max_num_seqs=2, block_size=2, num_blocks=3,
           max_model_len=5, prefix_caching=True, num_spec_tokens=1, long_prefill_token_threshold=1),
    tuple(Prompt(2, 2, (5,)) if r % 2 else Prompt(1, 2) for r in range(8)))

MODELS = dict(models.MODELS, **{WIDE.name: WIDE, NARROW.name: NARROW})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("engine", choices=["induction", "spacer", "spacer-param"])
    ap.add_argument("model", choices=sorted(MODELS))
    ap.add_argument("--budget", type=float, default=None)
    ap.add_argument("--jobs", type=int, default=1, help="processes for k-induction's first round")
    args = ap.parse_args()
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
    else:
        res = spacer(model, time_budget=args.budget)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    print(f"{args.engine} on {model.name} ({model.describe()}): {wall:.1f} s wall, {cpu:.1f} s cpu")
    for p in res.properties:
        print(f"  {p.name:40s} {p.status:8s} {p.message}")
        if p.cti:
            print(describe_cti(p.cti))
    for note in res.notes:
        print("  " + note)


if __name__ == "__main__":
    main()
