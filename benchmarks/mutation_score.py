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
        [--profiles default,vllm-0.33,vllm-0.33-async] [--file reference/scheduler.py]
        [--function NAME] [--reuse RECORD --reuse-commit COMMIT]
        [--json] [--min-score 0.9] [--jobs N] [--executor local|ray] [--ray-address ADDR]

Each mutant is a task of the executor (verification/executors: --jobs local
processes, default 1, or a Ray cluster: docs/cluster.md); fates are printed
in mutant order once all are known, the same whichever executor ran them.

For each seed a mutant meets the default fuzz run (every profile in turn:
vllm-0.8.5, then a ninth of the steps each for vllm-0.8.4, vllm-0.33 and
vllm-0.33-async) and, if it survives that, `fuzz --profile vllm-0.33`, then
`fuzz --profile vllm-0.33-async`: the code only vLLM 0.33 runs gets all the
steps there, where the default run gives it a ninth each (the start of the
same run: same seed). Before any mutant, the unmutated reference is fuzzed the same way:
if a run fails on it, there is no score (exit 2), since every mutant would
count as killed.

--reuse RECORD --reuse-commit COMMIT takes a kill (or timeout) from a saved
text output of this command instead of running the mutant, when its
function's code (ast.unparse: comments and layout aside) is the same now as
at COMMIT, the commit whose reference/ the record measured. A survivor is
taken from it too, but only when the record made exactly this command's runs
(steps, seeds, profiles: its summary line); otherwise survivors are run
fresh, since an added run could kill them. Such lines end in "(recorded)"
and the summary counts them apart from the fresh ones. The shortcut assumes
the fuzzer (verification/) is the one the record ran: it compares only the
reference's code. New mutants and every mutant of a changed function are
always run fresh.

Exit status: 0, 2 when the fuzzer fails on the unmutated reference, or 1 when --min-score is given and not reached, or when the
triage file names a mutant or function that no longer exists (stale triage).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

from flightcheck.commands.common import positive_int, seed_int
from flightcheck.verification import executors
from flightcheck.reference.profiles import get_profile
from flightcheck.verification.refinement.fuzz import PROFILES
from flightcheck.verification.refinement.mutation import (
    MODULES,
    TARGETS,
    Mutant,
    MutantResult,
    Triage,
    baseline_failures,
    mutants_of,
    read_record,
    read_triage,
    run_mutant,
    score,
    settings_line,
    unchanged_functions,
)

DEFAULT_SEEDS = "0,1"
DEFAULT_PROFILES = "default,vllm-0.33,vllm-0.33-async"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=positive_int, default=PROFILES["ci"])
    parser.add_argument("--seeds", default=DEFAULT_SEEDS, help="comma-separated seeds")
    parser.add_argument("--file", action="append", choices=list(MODULES),
                        help="these files (default: scheduler.py and kv_cache_manager.py)")
    parser.add_argument("--profiles", default=DEFAULT_PROFILES,
                        help="comma-separated fuzz runs per seed: 'default' (every profile "
                             "in turn) or a profile name pinned "
                             f"(default: {DEFAULT_PROFILES})")
    parser.add_argument("--function", action="append",
                        help="only mutants of functions whose qualified name contains this")
    parser.add_argument("--time-limit", type=float, default=30.0,
                        help="seconds per fuzz run before a mutant counts as a timeout")
    parser.add_argument("--reuse", type=Path, default=None,
                        help="a saved text output of this command: take its kills for "
                             "mutants of functions unchanged since --reuse-commit")
    parser.add_argument("--reuse-commit", default=None,
                        help="the git commit whose reference/ the --reuse record measured")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--min-score", type=float, default=None)
    parser.add_argument("--jobs", type=positive_int, default=1, help="local processes (default 1)")
    executors.add_options(parser)
    return parser


def _runs(parser: argparse.ArgumentParser,
          args: argparse.Namespace) -> tuple[list[int], tuple[str | None, ...]]:
    """The seeds and the fuzz runs per seed (None: the default run), checked."""
    if (args.reuse is None) != (args.reuse_commit is None):
        parser.error("--reuse and --reuse-commit go together")
    try:
        seeds = [seed_int(s) for s in args.seeds.split(",") if s]
    except argparse.ArgumentTypeError as error:
        parser.error(f"--seeds: {error}")
    profiles = tuple(None if p == "default" else p for p in args.profiles.split(",") if p)
    if not seeds or not profiles:
        parser.error("--seeds and --profiles each need at least one entry")
    for profile in profiles:
        if profile is not None:
            try:
                get_profile(profile)
            except ValueError as error:
                parser.error(f"--profiles: {error}")
    if args.reuse is not None and not args.reuse.is_file():
        parser.error(f"--reuse: no such file: {args.reuse}")
    return seeds, profiles


def _recorded(parser: argparse.ArgumentParser, args: argparse.Namespace, seeds: list[int],
              profiles: tuple[str | None, ...]) -> tuple[dict, set[tuple[str, str]]]:
    """The fates --reuse takes from its record, and the functions unchanged
    since --reuse-commit (both empty without --reuse)."""
    if args.reuse is None:
        return {}, set()
    record = read_record(args.reuse)
    recorded: dict[str, tuple[str, int | None, int | None]] = dict(record.kills)
    if record.settings == settings_line(args.steps, seeds, profiles):
        recorded.update((key, ("survived", None, None)) for key in record.survivors)
    try:
        return recorded, unchanged_functions(args.reuse_commit)
    except subprocess.CalledProcessError as error:
        parser.error(f"--reuse-commit {args.reuse_commit!r}: git cannot show the reference "
                     f"there: {error.stderr.strip().splitlines()[-1] if error.stderr else error}")


class Scoring(NamedTuple):
    """What a score run judges with: its arguments, seeds and fuzz runs per
    seed (None: the default run), the triage, and what --reuse takes. (A
    NamedTuple, not a dataclass: tests load this script without registering
    it as a module, which dataclasses need.)"""
    args: argparse.Namespace
    seeds: list[int]
    profiles: tuple[str | None, ...]
    triage: Triage
    recorded: dict[str, tuple[str, int | None, int | None]]
    unchanged: set[tuple[str, str]]


def _judge(mutant: Mutant, scoring: Scoring) -> tuple[MutantResult, bool]:
    """One mutant's fate (triaged, taken from the record, or run), and
    whether it was taken from the record."""
    args, triage = scoring.args, scoring.triage
    if mutant.key in triage.equivalent:
        return MutantResult(mutant, "equivalent", reason=triage.equivalent[mutant.key]), False
    if mutant.function in triage.out_of_scope:
        return MutantResult(mutant, "out_of_scope",
                            reason=triage.out_of_scope[mutant.function]), False
    if mutant.key in scoring.recorded and (mutant.path, mutant.function) in scoring.unchanged:
        status, seed, steps = scoring.recorded[mutant.key]
        return MutantResult(mutant, status, seed, steps,
                            f"recorded in {args.reuse} (code at {args.reuse_commit})"), True
    return run_mutant(mutant, args.steps, scoring.seeds, args.time_limit, scoring.profiles), False


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    refused = executors.configure_from(args)
    if refused:
        parser.error(refused)
    seeds, profiles = _runs(parser, args)
    recorded, unchanged = _recorded(parser, args, seeds, profiles)
    scoring = Scoring(args, seeds, profiles, read_triage(), recorded, unchanged)
    everything = [m for path in MODULES for m in mutants_of(path)]
    stale = sorted(set(scoring.triage.equivalent) - {m.key for m in everything})
    stale += sorted(set(scoring.triage.out_of_scope) - {m.function for m in everything})
    mutants = [m for m in everything if m.path in (args.file or TARGETS)]
    if args.function:
        mutants = [m for m in mutants if any(f in m.function for f in args.function)]

    t0, before = time.perf_counter(), executors.counts()
    broken = baseline_failures(args.steps, seeds, profiles)
    if broken:
        for line in broken:
            print(f"the fuzzer fails on the unmutated reference: {line}", file=sys.stderr)
        return 2
    judged = executors.run_tasks([executors.Task((index,), _judge, (mutant, scoring), mutant.key)
                                  for index, mutant in enumerate(mutants)], args.jobs,
                                 executors.progress_printer("mutation_score"))
    results = [result for result, _ in judged]
    reused = {result.mutant.key for result, taken in judged if taken}
    if not args.json:
        for result, taken in judged:
            _print_result(result, taken)
    summary = score(results)
    _report(scoring, results, reused, stale, summary, time.perf_counter() - t0, executors.ran_since(before))
    if stale:
        return 1
    if args.min_score is not None and (summary["score"] or 0) < args.min_score:
        return 1
    return 0


def _report(scoring: Scoring, results: list[MutantResult], reused: set[str], stale: list[str],
            summary: dict, seconds: float, ran: dict) -> None:
    args, seeds, profiles = scoring.args, scoring.seeds, scoring.profiles
    fresh = sum(1 for r in results if r.status in ("killed", "timeout", "survived")
                and r.mutant.key not in reused)
    if args.json:
        print(json.dumps({**ran, "steps": args.steps, "seeds": seeds,
                          "profiles": [p or "default" for p in profiles], "summary": summary,
                          "stale_triage": stale, "seconds": round(seconds, 1),
                          "reused": {"record": str(args.reuse), "commit": args.reuse_commit,
                                     "mutants": len(reused), "run_fresh": fresh}
                          if args.reuse is not None else None,
                          "mutants": [r.to_json() for r in results]}, indent=1))
        return
    survivors = [r for r in results if r.status == "survived"]
    for r in survivors:
        print(f"\nsurvived: {r.mutant.key} (line {r.mutant.line})\n{r.mutant.diff}")
    for key in stale:
        print(f"stale triage entry (no such mutant or function): {key}")
    print(f"\n# {settings_line(args.steps, seeds, profiles)}: {summary}; {seconds:.0f} s")
    if args.reuse is not None:
        print(f"# of the {fresh + len(reused)} mutants judged, {len(reused)} taken from"
              f" {args.reuse} (functions unchanged since {args.reuse_commit}), {fresh} run fresh")


def _print_result(result: MutantResult, recorded: bool = False) -> None:
    where = f"seed {result.seed}, {result.steps} steps" if result.status == "killed" else ""
    if recorded:
        where = f"{where} (recorded)".lstrip()
    print(f"{result.status:<12} {result.mutant.key:<70} {where}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
