"""`flightcheck fuzz`: the Hypothesis refinement machine from a fixed seed.

    flightcheck fuzz --steps N --seed S [--mutant NAME] [--profile NAME] [--json]
    flightcheck fuzz --kv-connector --steps N --seed S [--mutant NAME] [--profile NAME] [--json]
    flightcheck fuzz --list-mutants

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

Exit 0 when no step failed (with --mutant: exactly when the mutant was
caught), 1 otherwise, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json

from .common import bad, positive_int, seed_int


def add_parser(sub) -> None:
    fuzz = sub.add_parser("fuzz", help="drive the reference scheduler against the spec (Hypothesis)")
    fuzz.add_argument("--steps", type=positive_int, default=2000, help="rule steps in all (default 2000)")
    fuzz.add_argument("--seed", type=seed_int, default=0, help="the run's seed (default 0)")
    fuzz.add_argument("--mutant", help="switch on a reference mutant (see --list-mutants)")
    fuzz.add_argument("--profile", help="run every step under this version profile "
                      "(default: every profile in turn, vllm-0.8.5 first, a ninth of the "
                      "steps for each other)")
    fuzz.add_argument("--kv-connector", action="store_true",
                      help="with a fabricated KV connector, under the profiles that have one")
    fuzz.add_argument("--list-mutants", action="store_true", help="print the reference mutants and exit")
    fuzz.add_argument("--json", action="store_true", help="print machine-readable results")
    fuzz.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from flightcheck.verification.refinement.fuzz import (list_mutants, list_profile_mutants,
                                                          list_profiles, run_fuzz)

    if args.list_mutants:
        print("\n".join(list_mutants()))
        return 0
    if args.kv_connector:
        return run_kv(args)
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
    result = run_fuzz(args.steps, args.seed, args.mutant, args.profile)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        what = f"mutant {args.mutant}" if args.mutant else "the reference"
        verdict = "a step FAILED" if result["failed"] else "no step failed"
        print(f"{what}: {verdict} (budget {result['steps']} steps, seed {result['seed']}, "
              f"{result['seconds']:.1f} s; profiles {', '.join(result['profiles'])})")
        if result["failure"]:
            print(result["failure"])
    if args.mutant:
        return 0 if result["failed"] else 1
    return 1 if result["failed"] else 0


def run_kv(args: argparse.Namespace) -> int:
    """`fuzz --kv-connector`: the connector's refinement machine, each
    profile with a connector in turn (or --profile alone)."""
    import time

    from flightcheck.verification.mutants.reference import KV_MUTANTS
    from flightcheck.verification.refinement.kv_machine import KV_FUZZED_PROFILES, kv_fuzz

    if args.mutant is not None and args.mutant not in KV_MUTANTS:
        return bad(f"unknown KV connector --mutant {args.mutant!r}; known: {', '.join(KV_MUTANTS)}")
    if args.profile is not None and args.profile not in KV_FUZZED_PROFILES:
        return bad(f"--kv-connector runs under {', '.join(KV_FUZZED_PROFILES)}, not {args.profile!r}")
    profiles = [args.profile] if args.profile else list(KV_FUZZED_PROFILES)
    started, failure, ran = time.perf_counter(), None, []
    for index, profile in enumerate(profiles):
        share = args.steps // len(profiles) + (index < args.steps % len(profiles))
        if share == 0:
            continue
        ran.append(profile)
        failure = kv_fuzz(share, args.seed, profile, mutant=args.mutant)
        if failure:
            break
    result = {"kv_connector": True, "mutant": args.mutant, "steps": args.steps, "seed": args.seed,
              "profiles": ran, "failed": failure is not None, "failure": failure,
              "seconds": round(time.perf_counter() - started, 3)}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        what = f"mutant {args.mutant}" if args.mutant else "the reference with a KV connector"
        print(f"{what}: {'a step FAILED' if failure else 'no step failed'} (budget {args.steps} steps, "
              f"seed {args.seed}, {result['seconds']:.1f} s; profiles {', '.join(ran)})")
        if failure:
            print(failure)
    if args.mutant:
        return 0 if failure else 1
    return 1 if failure else 0
