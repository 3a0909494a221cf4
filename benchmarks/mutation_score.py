"""Mutation score of the reference against the refinement fuzzer.

Every machine-made mutant of reference/scheduler.py and
reference/kv_cache_manager.py (or of the files given with --file;
reference/completion.py may be added) (verification/refinement/mutation.py: one
token of one function changed) is run against `flightcheck fuzz` at a fixed
step budget and seed list, stopping at the first seed that kills it.
Mutants triaged as equivalent, and functions outside the fuzzer's
responsibility, are read from docs/mutation-equivalents.toml with their
reasons and not run. Prints each mutant's fate, every survivor's diff, and
the score: killed over killed + survived (timeouts, a mutant that loops
forever, count as killed).

    python benchmarks/mutation_score.py [--steps 2000] [--seeds 0,1]
        [--profiles default,vllm-0.33] [--file reference/scheduler.py]
        [--function NAME] [--json] [--min-score 0.9]

For each seed a mutant meets the default fuzz run (vllm-0.8.5, then
vllm-0.8.4) and, if it survives that, `fuzz --profile vllm-0.33` (code only
vLLM 0.33 runs is driven there alone). Before any mutant, the unmutated
reference is fuzzed the same way: if a run fails on it, there is no score
(exit 2), since every mutant would count as killed.

Exit status: 0, 2 when the fuzzer fails on the unmutated reference, or 1 when --min-score is given and not reached, or when the
triage file names a mutant or function that no longer exists (stale triage).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from flightcheck.verification.refinement.fuzz import PROFILES
from flightcheck.verification.refinement.mutation import (
    MODULES,
    TARGETS,
    MutantResult,
    baseline_failures,
    mutants_of,
    read_triage,
    run_mutant,
    score,
)

DEFAULT_SEEDS = "0,1"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=PROFILES["ci"])
    parser.add_argument("--seeds", default=DEFAULT_SEEDS, help="comma-separated seeds")
    parser.add_argument("--file", action="append", choices=list(MODULES),
                        help="these files (default: scheduler.py and kv_cache_manager.py)")
    parser.add_argument("--profiles", default="default,vllm-0.33",
                        help="comma-separated fuzz runs per seed: 'default' (every drawn profile) "
                             "or a profile name pinned (default: default,vllm-0.33)")
    parser.add_argument("--function", action="append",
                        help="only mutants of functions whose qualified name contains this")
    parser.add_argument("--time-limit", type=float, default=30.0,
                        help="seconds per fuzz run before a mutant counts as a timeout")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--min-score", type=float, default=None)
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s]
    profiles = tuple(None if p == "default" else p for p in args.profiles.split(",") if p)
    triage = read_triage()
    everything = [m for path in MODULES for m in mutants_of(path)]
    stale = sorted(set(triage.equivalent) - {m.key for m in everything})
    stale += sorted(set(triage.out_of_scope) - {m.function for m in everything})
    mutants = [m for m in everything if m.path in (args.file or TARGETS)]
    if args.function:
        mutants = [m for m in mutants if any(f in m.function for f in args.function)]

    t0 = time.perf_counter()
    broken = baseline_failures(args.steps, seeds, profiles)
    if broken:
        for line in broken:
            print(f"the fuzzer fails on the unmutated reference: {line}", file=sys.stderr)
        return 2
    results: list[MutantResult] = []
    for mutant in mutants:
        if mutant.key in triage.equivalent:
            result = MutantResult(mutant, "equivalent", reason=triage.equivalent[mutant.key])
        elif mutant.function in triage.out_of_scope:
            result = MutantResult(mutant, "out_of_scope", reason=triage.out_of_scope[mutant.function])
        else:
            result = run_mutant(mutant, args.steps, seeds, args.time_limit, profiles)
        results.append(result)
        if not args.json:
            _print_result(result)
    summary = score(results)
    seconds = time.perf_counter() - t0
    if args.json:
        print(json.dumps({"steps": args.steps, "seeds": seeds,
                          "profiles": [p or "default" for p in profiles], "summary": summary,
                          "stale_triage": stale, "seconds": round(seconds, 1),
                          "mutants": [r.to_json() for r in results]}, indent=1))
    else:
        survivors = [r for r in results if r.status == "survived"]
        for r in survivors:
            print(f"\nsurvived: {r.mutant.key} (line {r.mutant.line})\n{r.mutant.diff}")
        for key in stale:
            print(f"stale triage entry (no such mutant or function): {key}")
        print(f"\n# {args.steps} steps, seeds {seeds}, runs {[p or 'default' for p in profiles]}:"
              f" {summary}; {seconds:.0f} s")
    if stale:
        return 1
    if args.min_score is not None and (summary["score"] or 0) < args.min_score:
        return 1
    return 0


def _print_result(result: MutantResult) -> None:
    where = f"seed {result.seed}, {result.steps} steps" if result.status == "killed" else ""
    print(f"{result.status:<12} {result.mutant.key:<70} {where}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
