"""`flightcheck fuzz`: the Hypothesis refinement machine from a fixed seed.

    flightcheck fuzz --steps N --seed S [--mutant NAME] [--profile NAME] [--json]
    flightcheck fuzz --kv-connector --steps N --seed S [--mutant NAME] [--profile NAME] [--json]
    flightcheck fuzz --feature NAME --steps N --seed S [--mutant NAME] [--profile NAME] [--json]
    flightcheck fuzz --list-mutants
    flightcheck fuzz --seeds 0-99 [--executor local|ray] [--ray-address ADDR] [--jobs N] ... [--json]

A run drives the reference and the spec under every version profile the
reference models, in turn: vllm-0.8.5 first, then vllm-0.8.4, vllm-0.33 and
vllm-0.33-async with a ninth of the steps each (and any profile added
later); --profile runs every step under one. --json names the profiles run
("profiles": those whose part started, in order). A mutant of vLLM 0.33's
rules (verification/mutants/reference.py PROFILE_MUTANTS: resumption_not_deferred,
drop_leaves_counters, in_flight_kept_without_output, output_bound_by_id_alone)
runs under vllm-0.33 alone, and one of its async rules under vllm-0.33-async
alone; --list-mutants lists the every-profile ones.

--kv-connector drives the reference with a fabricated KV connector
(verification/refinement/kv_machine.py) under vllm-0.33, vllm-0.33-async,
vllm-0.34 and vllm-0.34-async, a quarter of the steps each (--profile: all
under one); its --mutant is one of the connector's (KV_MUTANTS in
verification/mutants/reference.py).

--feature NAME drives a feature's refinement machine
(verification/refinement/feature_fuzzers.py): priority, grammar,
streaming-sessions, reset-pause, lora (LoRA's max_loras cap and prompt
logprobs), priority-sessions (the priority policy beside streaming
sessions) or cadence-kv (the prefill cadence beside the KV connector; no
mutant of its own), each under vllm-0.33 and vllm-0.34, sync and async, a quarter of
the steps each (--profile: all under one); its --mutant is one of the
feature's, run under the mutant's own profile unless --profile names one;
--json adds "feature".

--seeds A-B (or a list: 0,5,9-12) runs one fuzz per seed, each a task of
the executor (verification/executors: `--executor local`, a pool of --jobs
processes, or `--executor ray`, a Ray cluster, docs/cluster.md); each seed's
run is the one `--seed` gives. Progress goes to stderr as the seeds finish;
--json prints `{"executor", "tasks", "retried", "runs": [one per seed, by
seed], ...}`.

Exit 0 when no step failed (with --mutant: exactly when the mutant was
caught; with --seeds, by every seed), 1 otherwise, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from flightcheck.verification import executors

from .common import bad, int_in, positive_int, seed_int

# --seeds A-B runs this many fuzz runs at most (each a task).
MAX_SEEDS = 100_000
# --feature's names (verification/refinement/feature_fuzzers.py FEATURE_FUZZERS)
FEATURES = ("priority", "grammar", "streaming-sessions", "reset-pause", "lora", "priority-sessions", "cadence-kv")


def add_parser(sub) -> None:
    fuzz = sub.add_parser("fuzz", help="drive the reference scheduler against the spec (Hypothesis)")
    fuzz.add_argument("--steps", type=positive_int, default=2000, help="rule steps in all (default 2000)")
    fuzz.add_argument("--seed", type=seed_int, default=0, help="the run's seed (default 0)")
    fuzz.add_argument("--seeds", type=seed_list, metavar="A-B",
                      help="one run per seed (a range A-B, or a list: 0,5,9-12), each a task of --executor")
    fuzz.add_argument("--jobs", type=int_in(1, 4 * (os.cpu_count() or 1)), default=os.cpu_count() or 1,
                      help="processes for --seeds with the local executor (default: one per core)")
    executors.add_options(fuzz)
    fuzz.add_argument("--mutant", help="switch on a reference mutant (see --list-mutants)")
    fuzz.add_argument("--profile", help="run every step under this version profile "
                      "(default: every profile in turn, vllm-0.8.5 first, a ninth of the "
                      "steps for each other)")
    fuzz.add_argument("--kv-connector", action="store_true",
                      help="with a fabricated KV connector, under the profiles that have one")
    fuzz.add_argument("--feature", choices=FEATURES,
                      help="a feature's refinement machine, under vllm-0.33 and vllm-0.34, sync and async")
    fuzz.add_argument("--list-mutants", action="store_true", help="print the reference mutants and exit")
    fuzz.add_argument("--json", action="store_true", help="print machine-readable results")
    fuzz.set_defaults(func=run)


def seed_list(text: str) -> list[int]:
    """`--seeds`: `A-B` (both included), or a comma-separated list of seeds
    and ranges; each seed once, in increasing order."""
    seeds: set[int] = set()
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        first = seed_int(low)
        last = seed_int(high) if dash else first
        if last < first:
            raise argparse.ArgumentTypeError(f"{part.strip()!r}: the range ends before it starts")
        if last - first + len(seeds) >= MAX_SEEDS:
            raise argparse.ArgumentTypeError(f"at most {MAX_SEEDS} seeds")
        seeds.update(range(first, last + 1))
    return sorted(seeds)


def run(args: argparse.Namespace) -> int:
    from flightcheck.verification.refinement.fuzz import list_mutants, list_profile_mutants, list_profiles

    if args.list_mutants:
        print("\n".join(list_mutants()))
        return 0
    if args.seeds is None and (args.executor != "local" or args.ray_address):
        return bad("--executor and --ray-address run the seeds of --seeds")
    if args.kv_connector and args.feature:
        return bad("--kv-connector and --feature pick different machines: give one")
    if args.kv_connector:
        return run_kv(args)
    if args.feature:
        return run_feature(args)
    from flightcheck.verification.mutants.reference import KV_MUTANTS
    if args.mutant in KV_MUTANTS:
        return bad(f"--mutant {args.mutant} is a mutant of the KV connector: add --kv-connector")
    own_profile = next((profile for profile, names in list_profile_mutants().items()
                        if args.mutant in names), None)
    if args.mutant is not None and args.mutant not in list_mutants() and own_profile is None:
        return bad(f"unknown --mutant {args.mutant!r}; known: {', '.join(list_mutants())} "
                   f"(and, under their profile: {', '.join(m for names in list_profile_mutants().values() for m in names)})")
    if args.profile is not None and args.profile not in list_profiles():
        return bad(f"unknown --profile {args.profile!r}; known: {', '.join(list_profiles())}")
    if own_profile is not None and args.profile not in (None, own_profile):
        return bad(f"--mutant {args.mutant} is a mutant of {own_profile}'s rules; "
                   f"run it with --profile {own_profile}")
    return _run_and_report(args)


def run_kv(args: argparse.Namespace) -> int:
    """`fuzz --kv-connector`: the connector's refinement machine, each
    profile with a connector in turn (or --profile alone)."""
    from flightcheck.verification.mutants.reference import KV_MUTANTS
    from flightcheck.verification.refinement.kv_machine import KV_FUZZED_PROFILES

    if args.mutant is not None and args.mutant not in KV_MUTANTS:
        return bad(f"unknown KV connector --mutant {args.mutant!r}; known: {', '.join(KV_MUTANTS)}")
    if args.profile is not None and args.profile not in KV_FUZZED_PROFILES:
        return bad(f"--kv-connector runs under {', '.join(KV_FUZZED_PROFILES)}, not {args.profile!r}")
    return _run_and_report(args)


def run_feature(args: argparse.Namespace) -> int:
    """`fuzz --feature NAME`: the feature's refinement machine, each of its
    profiles in turn (or --profile alone; with --mutant, the mutant's)."""
    from flightcheck.verification.refinement.feature_fuzzers import FEATURE_FUZZERS

    fuzzer = FEATURE_FUZZERS[args.feature]
    if args.mutant is not None and args.mutant not in fuzzer.mutants:
        return bad(f"unknown --feature {args.feature} --mutant {args.mutant!r}; known: {', '.join(fuzzer.mutants)}")
    if args.profile is not None and args.profile not in fuzzer.profiles:
        return bad(f"--feature {args.feature} runs under {', '.join(fuzzer.profiles)}, not {args.profile!r}")
    return _run_and_report(args)


def fuzz_one(kv_connector: bool, steps: int, seed: int, mutant: str | None, profile: str | None,
             feature: str | None = None) -> dict[str, Any]:
    """One fuzz run's result (`--json`'s object): the task of each seed of --seeds."""
    if feature is not None:
        from flightcheck.verification.refinement.feature_fuzzers import feature_fuzz
        return feature_fuzz(feature, steps, seed, mutant, profile)
    if kv_connector:
        return _kv_result(steps, seed, mutant, profile)
    from flightcheck.verification.refinement.fuzz import run_fuzz
    return run_fuzz(steps, seed, mutant, profile)


def _kv_result(steps: int, seed: int, mutant: str | None, profile: str | None) -> dict[str, Any]:
    from flightcheck.verification.refinement.kv_machine import KV_FUZZED_PROFILES, kv_fuzz

    profiles = [profile] if profile else list(KV_FUZZED_PROFILES)
    started, failure, ran = time.perf_counter(), None, []
    for index, each in enumerate(profiles):
        share = steps // len(profiles) + (index < steps % len(profiles))
        if share == 0:
            continue
        ran.append(each)
        failure = kv_fuzz(share, seed, each, mutant=mutant)
        if failure:
            break
    return {"kv_connector": True, "mutant": mutant, "steps": steps, "seed": seed,
            "profiles": ran, "failed": failure is not None, "failure": failure,
            "seconds": round(time.perf_counter() - started, 3)}


def _run_and_report(args: argparse.Namespace) -> int:
    """One seed in this process (--seed), or every seed of --seeds as tasks."""
    if args.seeds is not None:
        return _run_seeds(args)
    result = fuzz_one(args.kv_connector, args.steps, args.seed, args.mutant, args.profile, args.feature)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(_summary(args, result))
        if result["failure"]:
            print(result["failure"])
    return _exit_code(args.mutant, [result])


def _summary(args: argparse.Namespace, result: dict[str, Any]) -> str:
    default = ("the reference with a KV connector" if args.kv_connector
               else f"the reference with {args.feature}" if args.feature else "the reference")
    what = f"mutant {args.mutant}" if args.mutant else default
    verdict = "a step FAILED" if result["failed"] else "no step failed"
    return (f"{what}: {verdict} (budget {result['steps']} steps, seed {result['seed']}, "
            f"{result['seconds']:.1f} s; profiles {', '.join(result['profiles'])})")


def _exit_code(mutant: str | None, results: list[dict[str, Any]]) -> int:
    """0 when no step failed; with a mutant, when every run caught it."""
    if mutant:
        return 0 if all(result["failed"] for result in results) else 1
    return 1 if any(result["failed"] for result in results) else 0


def _run_seeds(args: argparse.Namespace) -> int:
    """--seeds: one task per seed on the executor, progress on stderr as
    they finish, the runs reported by seed."""
    refused = executors.configure_from(args)
    if refused:
        return bad(refused)
    tasks = [executors.Task((seed,), fuzz_one, (args.kv_connector, args.steps, seed, args.mutant, args.profile,
                                                args.feature),
                            f"seed {seed}") for seed in args.seeds]
    before, started = executors.counts(), time.perf_counter()
    try:
        runs = executors.run_tasks(tasks, min(args.jobs, len(tasks)), executors.progress_printer("flightcheck fuzz"))
    except (executors.ExecutorUnavailable, executors.TaskLost) as err:
        return bad(str(err))
    report = {**executors.ran_since(before), "kv_connector": args.kv_connector,
              **({"feature": args.feature} if args.feature else {}), "mutant": args.mutant, "steps": args.steps, "seeds": args.seeds,
              "failed": [run["seed"] for run in runs if run["failed"]],
              "seconds": round(time.perf_counter() - started, 3), "runs": runs}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for result in runs:
            print(_summary(args, result))
            if result["failure"]:
                print(result["failure"])
        print(f"{len(runs)} seeds on the {report['executor']} executor in {report['seconds']:.1f} s: "
              f"{len(report['failed'])} with a failed step"
              + (f"; {report['retried']} tasks run again after their worker was lost" if report["retried"] else ""))
    return _exit_code(args.mutant, runs)
