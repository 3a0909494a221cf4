"""`flightcheck verify`: model-check the spec and hunt every mutant, under one
version profile (`--profile`, default the default profile) or all of them
(`--all-profiles`, which states its time)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Collection, Sequence

from rich.console import Console

from flightcheck.spec.profiles import DEFAULT_PROFILE, PROFILES

from flightcheck.verification import executors
from flightcheck.verification.suite import VERIFY_DEPTH, VERIFY_MODEL

from .common import PP_PER_CORE, bad, int_in
from .progress import PhaseProgress

MAX_DEPTH = 64                   # BMC cost grows steeply with depth; the default is 4


def add_parser(sub) -> None:
    verify = sub.add_parser("verify", help="model-check the spec and hunt every mutant")
    verify.add_argument("--config", default=VERIFY_MODEL.name,
                        help=f"model for the Z3 proofs and BMC (default {VERIFY_MODEL.name}; see --list-configs)")
    verify.add_argument("--depth", type=int_in(1, MAX_DEPTH), default=VERIFY_DEPTH,
                        help=f"BMC depth (default {VERIFY_DEPTH})")
    verify.add_argument("--jobs", type=int_in(1, PP_PER_CORE * (os.cpu_count() or 1)),
                        default=min(2, os.cpu_count() or 1),
                        help="processes for the k-induction proof and for BMC (default: 2, or 1 on one core)")
    verify.add_argument("--profile", default=DEFAULT_PROFILE, metavar="NAME",
                        help=f"the vLLM version profile to verify (default {DEFAULT_PROFILE}; "
                             f"{', '.join(PROFILES)})")
    verify.add_argument("--all-profiles", action="store_true",
                        help="verify every profile in turn and state the time it took")
    _add_feature_flags(verify)
    verify.add_argument("--mutant", help="hunt only this mutant and print its counterexample")
    verify.add_argument("--no-z3", action="store_true", help="skip the Z3 engines")
    verify.add_argument("--inferred", action="store_true",
                        help="also prove every invariant with an inferred invariant, none hand-written "
                             "(about 2 more minutes on the default model, 2 processes)")
    verify.add_argument("--list-configs", action="store_true", help="print the model names and exit")
    verify.add_argument("--json", action="store_true", help="print machine-readable results")
    executors.add_options(verify)
    verify.set_defaults(func=run)


def _add_feature_flags(verify) -> None:
    """The flags that search (and prove) one feature's models instead of the default run."""
    verify.add_argument("--allow-name-reuse", action="store_true",
                        help="search the profile's model in which a new request may arrive under a finished "
                             "one's name while its batches are in flight (vllm-0.33, vllm-0.33-hardened), and print "
                             "the shortest counterexample of every property that breaks (vllm-0.33-hardened: "
                             "and hunt its guards' mutants); exits 1 when one breaks")
    verify.add_argument("--kv-connector", action="store_true",
                        help="search the profile's KV connector models exhaustively (async loads and their "
                             "failures, sends, the step fence, 0.34's load limit; vllm-0.33, vllm-0.33-async, "
                             "vllm-0.34, vllm-0.34-async; under a minute), hunt the "
                             "connector's mutants, and prove KV1, KV2, KV4 by k-induction and BMC on the Z3 "
                             "connector models (about 3 min of CPU; --no-z3 skips them)")
    verify.add_argument("--streaming-sessions", action="store_true",
                        help="search the profile's streaming session models exhaustively (SS1-SS4 and every "
                             "other property; vllm-0.33, vllm-0.33-async, vllm-0.34, vllm-0.34-async; seconds) "
                             "and, under vllm-0.34-async, hunt the sessions' mutants; prove SS1-SS4 by k-induction "
                             "and BMC on the Z3 session model under the profiles it covers, and under vllm-0.33 and "
                             "vllm-0.34 SS5 (the priority policy beside sessions) on a Z3 model of two sessions of "
                             "distinct priorities (--no-z3 skips them)")
    verify.add_argument("--reset-pause", action="store_true",
                        help="search the profile's reset-and-pause model exhaustively (resets of the prefix "
                             "cache and pauses between steps; vllm-0.33, vllm-0.33-async, vllm-0.34, "
                             "vllm-0.34-async), under vllm-0.34-async hunt reset and pause's mutants, and prove "
                             "RP1-RP4 by k-induction and BMC of a Z3 model, RP5 (the connector's cache reset) on "
                             "one beside a KV connector (about 5 min at load; --no-z3 skips them)")
    verify.add_argument("--structured-output", action="store_true",
                        help="search the profile's structured-output models exhaustively (grammars compiling "
                             "or failing, the FSM with batches in flight; vllm-0.33, vllm-0.33-async, vllm-0.34, "
                             "vllm-0.34-async), under vllm-0.34-async hunt the grammar's mutants, and prove G1-G3 "
                             "by k-induction and BMC on the Z3 grammar model (minutes of CPU; --no-z3 skips them)")
    verify.add_argument("--priority", action="store_true",
                        help="search the profile's priority-policy models exhaustively (PR1-PR3 and every other "
                             "property; vllm-0.33, vllm-0.33-async, vllm-0.34, vllm-0.34-async) and, under vllm-0.34, "
                             "hunt the policy's mutants and prove PR1-PR3 by k-induction and BMC on the Z3 "
                             "priority model, and PR4 on its models beside the KV connector, one and two batches in flight (minutes of CPU; "
                             "--no-z3 skips them)")
    verify.add_argument("--prefill-cadence", action="store_true",
                        help="search the profile's prefill-cadence models (alone and beside priority) exhaustively "
                             "(CAD1-CAD3 and every other property; vllm-0.33, vllm-0.33-async, vllm-0.34, "
                             "vllm-0.34-async) and, under vllm-0.34, "
                             "hunt the cadence's mutants; check CAD1-CAD3 by k-induction on a small Z3 model and by "
                             "BMC on cadence-k2 (long: docs/proofs.md; --no-z3 skips them)")
    verify.add_argument("--lora", action="store_true", help="search the profile's LoRA and prompt-logprobs models; "
                        "under vllm-0.34 hunt their mutants; LORA1, LORA2, PL1 by k-induction and BMC (--no-z3 skips)")


def run(args: argparse.Namespace) -> int:
    from flightcheck.verification.models import MODELS

    if args.list_configs:
        for name, model in MODELS.items():
            print(f"{name}: {model.describe()}")
        return 0
    problem = _refusal(args) or executors.configure_from(args)
    if problem:
        return bad(problem)
    stream = sys.stderr if args.json else sys.stdout
    # Piped or redirected, rich would assume 80 columns and cut names short;
    # a log or a CI page has room for the whole table.
    console = Console(stderr=args.json, width=None if stream.isatty() else 160)
    if args.mutant:
        return _hunt_one(args, console)
    return _run_profiles(args, console)


def _refusal(args: argparse.Namespace) -> str | None:
    """Why these flags cannot go together (None if they can)."""
    from flightcheck.verification.models import MODELS, NAME_REUSE_MODELS
    from flightcheck.verification.mutants import MUTANTS
    from flightcheck.verification.reset_pause_models import RESET_PAUSE_MODELS

    if args.config not in MODELS:
        return f"unknown --config {args.config!r}; known: {', '.join(MODELS)}"
    if args.inferred and args.no_z3:
        return "--inferred is a Z3 proof; it cannot go with --no-z3"
    if args.inferred and args.mutant:
        return "--inferred proves the spec; it cannot go with --mutant"
    if args.mutant is not None and args.mutant not in MUTANTS:
        return f"unknown --mutant {args.mutant!r}; known: {', '.join(MUTANTS)}"
    if args.profile not in PROFILES:
        return f"unknown --profile {args.profile!r}; known: {', '.join(PROFILES)}"
    if args.all_profiles and (args.mutant or args.profile != DEFAULT_PROFILE):
        return "--all-profiles runs every profile; it cannot go with --mutant or --profile"
    from flightcheck.verification.kv_models import KV_PROFILE_MODELS

    refused = (_one_search_error(args, "--allow-name-reuse", NAME_REUSE_MODELS, "a profile that looks outputs up "
                                 "by name", "name-reuse model", ("all_profiles", "mutant", "inferred"))
               or _one_search_error(args, "--kv-connector", KV_PROFILE_MODELS, "a profile with a KV connector's "
                                    "async loads", "connector models", _SEARCHES[:4]))
    if refused:
        return refused
    if args.reset_pause and (args.kv_connector or args.all_profiles or args.mutant or args.inferred
                             or args.allow_name_reuse or args.profile not in RESET_PAUSE_MODELS):
        return (f"--reset-pause searches one profile's reset-and-pause model ({', '.join(RESET_PAUSE_MODELS)}); "
                "it cannot go with --kv-connector, --all-profiles, --mutant, --inferred or --allow-name-reuse")
    return _sessions_usage_error(args)


# The flags that each pick a search of their own (one profile's models).
_SEARCHES = ("all_profiles", "mutant", "inferred", "allow_name_reuse", "kv_connector")


def _one_search_error(args: argparse.Namespace, flag: str, profiles: Collection[str], needs: str,
                      searches: str, conflicts: Sequence[str]) -> str | None:
    """Why `flag`, a search of one profile's `searches`, cannot run here: its
    profile lacks the feature, or another flag in `conflicts` picks a search
    of its own (None if it can, or if `flag` is not given)."""
    if not getattr(args, flag.removeprefix("--").replace("-", "_")):
        return None
    if args.profile not in profiles:
        return f"{flag} needs {needs}: {', '.join(profiles)}"
    if any(getattr(args, name) for name in conflicts):
        names = [f"--{name.replace('_', '-')}" for name in conflicts]
        return f"{flag} searches one profile's {searches}; it cannot go with {', '.join(names[:-1])} or {names[-1]}"
    return None


def _sessions_usage_error(args: argparse.Namespace) -> str | None:
    from flightcheck.verification.cadence_models import CADENCE_MODELS
    from flightcheck.verification.grammar_models import GRAMMAR_PROFILES
    from flightcheck.verification.lora_models import LORA_MODELS
    from flightcheck.verification.priority_models import PRIORITY_PROFILE_MODELS
    from flightcheck.verification.session_models import SESSION_PROFILE_MODELS

    refused = _one_search_error(args, "--streaming-sessions", SESSION_PROFILE_MODELS,
                                "a profile with streaming sessions", "session models", _SEARCHES)
    if refused:
        return refused
    if args.streaming_sessions and args.reset_pause:
        return "--streaming-sessions and --reset-pause search different models; name one"
    return (_one_search_error(args, "--priority", PRIORITY_PROFILE_MODELS, "a profile with the priority policy",
                              "priority models", (*_SEARCHES, "streaming_sessions", "reset_pause",
                                                  "structured_output"))
            or _one_search_error(args, "--structured-output", GRAMMAR_PROFILES, "a profile with structured output",
                                 "grammar models", (*_SEARCHES, "streaming_sessions", "reset_pause"))
            or _one_search_error(args, "--prefill-cadence", CADENCE_MODELS, "a profile with the prefill cadence",
                                 "cadence model", (*_SEARCHES, "streaming_sessions", "reset_pause",
                                                   "structured_output", "priority"))
            or _one_search_error(args, "--lora", LORA_MODELS, "a profile with the LoRA cap", "LoRA models",
                                 (*_SEARCHES, "streaming_sessions", "reset_pause", "structured_output", "priority",
                                  "prefill_cadence")))


def _hunt_one(args: argparse.Namespace, console: Console) -> int:
    """`--mutant NAME`: its shortest counterexample, as a step table or JSON."""
    from flightcheck.verification.suite import hunt_mutant
    from flightcheck.verification.traces.counterexample import render, to_json

    with PhaseProgress(f"flightcheck verify ({args.profile})") as progress:
        progress.phase(f"hunting mutant {args.mutant}")
        result = hunt_mutant(args.mutant, profile=args.profile)
    if args.json:
        out = {"name": result.name, "killed": result.killed, "trace_length": result.trace_length,
               "seconds": round(result.seconds, 3), "property": result.property,
               "model": result.model, "profile": args.profile,
               "counterexample": to_json(result.counterexample) if result.counterexample else None}
        print(json.dumps(out, indent=1))
    elif result.counterexample:
        render(result.counterexample, console)
    else:
        console.print(f"mutant {args.mutant} SURVIVED on model {result.model}")
    return 0 if result.killed else 1


def _run_profiles(args: argparse.Namespace, console: Console) -> int:
    """The suite under each profile asked for: a table each (or JSON), progress on stderr."""
    from flightcheck.verification.models import MODELS
    from flightcheck.verification.cadence_suite import run_cadence_suite
    from flightcheck.verification.lora_suite import run_lora_suite
    from flightcheck.verification.priority_suite import run_priority_suite
    from flightcheck.verification.suite import SuiteOptions, run_suite

    profiles = list(PROFILES) if args.all_profiles else [args.profile]
    started = time.perf_counter()
    suites = []
    for profile in profiles:
        options = SuiteOptions(MODELS[args.config], args.depth, use_z3=not args.no_z3, jobs=args.jobs,
                               inferred=args.inferred, profile=profile, allow_name_reuse=args.allow_name_reuse,
                               kv_connector=args.kv_connector, reset_pause=args.reset_pause,
                               streaming_sessions=args.streaming_sessions, structured_output=args.structured_output,
                               priority=args.priority)
        try:
            with PhaseProgress(f"flightcheck verify ({profile})") as progress:
                runner = run_priority_suite if args.priority else run_cadence_suite if args.prefill_cadence \
                    else run_lora_suite if args.lora else run_suite
                suites.append(runner(options, progress.phase))
        except (executors.ExecutorUnavailable, executors.TaskLost) as err:
            return bad(str(err))
        if not args.json:
            _print_suite(console, suites[-1])
    seconds = time.perf_counter() - started
    ok = all(suite.ok for suite in suites)
    if args.json:
        if args.all_profiles:
            print(json.dumps({"ok": ok, "seconds": round(seconds, 3),
                              "profiles": [suite.to_json() for suite in suites]}, indent=1))
        else:
            print(json.dumps(suites[0].to_json(), indent=1))
    elif args.all_profiles:
        console.print(f"{'OK' if ok else 'FAILED'}: {len(suites)} profiles "
                      f"({', '.join(profiles)}) in {seconds:.1f} s")
    return 0 if ok else 1


def _print_suite(console: Console, suite) -> None:
    """Property x method, then one row per mutant."""
    from rich.table import Table
    from rich.text import Text

    methods: list[str] = []
    cells: dict[tuple[str, str], object] = {}
    kinds: dict[str, str] = {}
    seconds: dict[str, float] = {}
    for p in suite.properties:
        if p.method not in methods:
            methods.append(p.method)
        seconds[p.method] = max(seconds.get(p.method, 0.0), p.seconds)
        kinds[p.name] = p.kind
        cells[(p.name, p.method)] = p
    colour = {"proved": "green", "reached": "green", "bounded": "yellow",
              "violated": "bold red", "unknown": "red"}
    table = Table(title=f"Properties by method, profile {suite.profile}", show_lines=False)
    table.add_column("property")
    table.add_column("kind")
    for i, m in enumerate(methods):
        table.add_column(f"[{i + 1}]", justify="center")
    for name, kind in kinds.items():
        row = [name, kind]
        for m in methods:
            p = cells.get((name, m))
            if p is None:
                row.append(Text(""))
                continue
            row.append(Text(mark_of(p), style=colour.get(p.status, "")))
        table.add_row(*row)
    console.print(table)
    for i, m in enumerate(methods):
        console.print(Text(f"  [{i + 1}] {m}: {seconds[m]:.2f} s"))
    has_blank = len(cells) < len(kinds) * len(methods)
    _print_legend(console, {mark_of(p) for p in suite.properties} | ({""} if has_blank else set()))
    if suite.explicit_only:
        console.print(Text(f"  no Z3 under {suite.profile}: {suite.explicit_only}"))
    if suite.allow_name_reuse:
        if suite.mutants:
            _print_mutants(console, suite, "Mutants (names reused: killed only by a property the correct spec "
                                            "keeps on that model)")
        _print_counterexamples(console, suite)
        return
    _print_mutants(console, suite, "Mutants")
    for name, why in suite.moot.items():
        console.print(Text(f"  not hunted under {suite.profile}: {name}: {why}"))
    if suite.counterexamples:           # `--kv-connector`: KV7 under vLLM's released rules (finding 7)
        from flightcheck.verification.traces.counterexample import render
        for cx in suite.counterexamples:
            render(cx, console)

    console.print(f"{'OK' if suite.ok else 'FAILED'} (profile {suite.profile}) in {suite.seconds:.1f} s")


def mark_of(row) -> str:
    """A property row's cell: its status, and the depth where it has one (`proved@1`)."""
    return row.status + (f"@{row.depth}" if row.depth is not None else "")


# What each mark of the property table says; `n` stands for the number after
# "@", whose meaning depends on the method. A mark's key is its status, with
# "@" when it has a depth; "" is the blank cell.
LEGEND: dict[str, str] = {
    "": "(blank) the method does not check this property: it does not apply there, or that model "
        "or encoding leaves it out",
    "proved": "holds in every reachable state: of that small model (exhaustive search), or of any "
              "number of requests (parameterised k-induction)",
    "proved@": "proved by k-induction with k = n: it holds at every depth of that configuration",
    "bounded@": "no violation within n steps (BMC; an exhaustive search stopped at depth n): not a proof",
    "reached@": "a \"sometimes\" target, first reached after n steps (as it should be)",
    "violated": "the property breaks, or a \"sometimes\" target is never reached (the run fails)",
    "violated@": "a counterexample: n steps long (BMC, k-induction's base case), or found by an "
                 "exhaustive search stopped at depth n (the run fails)",
    "unknown": "not settled by this method (the parameterised proof did not go through)",
    "unknown@": "k-induction (k = n) did not prove it (not inductive, or the solver gave up), or BMC "
                "missed the target in n steps; another column may settle it",
}
KIND_LEGEND = ("kind: invariant (a transition property too), liveness (in its safety form, or on the "
               "whole state graph), sometimes (a target that must be reachable)")
MUTANT_LEGEND = ("killed: some property breaks on the mutant (a missed \"sometimes\" target does not "
                 "count); by: that property; steps: its shortest counterexample's length")


def legend_key(mark: str) -> str:
    """The LEGEND entry for a cell: `unknown@4` -> `unknown@`."""
    status, at, _depth = mark.partition("@")
    return status + at


def _print_legend(console: Console, marks: set[str]) -> None:
    """Under the table: what each mark in it means, in the table's order of statuses."""
    from rich.text import Text

    keys = {legend_key(mark) for mark in marks}
    console.print(Text("  legend (n: the number after @):"))
    for key, meaning in LEGEND.items():
        if key in keys:
            shown = "(blank)" if key == "" else (key + "n" if key.endswith("@") else key)
            text = meaning.removeprefix("(blank) ") if key == "" else meaning
            console.print(Text(f"    {shown}: {text}"))
    console.print(Text(f"  {KIND_LEGEND}"))


def _print_mutants(console: Console, suite, title: str) -> None:
    from rich.table import Table
    from rich.text import Text

    muts = Table(title=title)
    for col in ("mutant", "killed", "by", "model", "steps", "seconds"):
        muts.add_column(col)
    for m in suite.mutants:
        muts.add_row(m.name, Text("yes" if m.killed else "NO", style="green" if m.killed else "bold red"),
                     m.property or "", m.model, str(m.trace_length or ""), f"{m.seconds:.2f}")
    console.print(muts)
    console.print(Text(f"  {MUTANT_LEGEND}"))


def _print_counterexamples(console: Console, suite) -> None:
    """Names reused: every violated property's shortest counterexample, as a step table."""
    from rich.text import Text

    from flightcheck.verification.traces.counterexample import render
    hunted = f"{len(suite.mutants)} mutants hunted" if suite.mutants else "no mutant hunted"
    console.print(Text(f"names reused: {hunted}; {len(suite.counterexamples)} properties violated, "
                       "each with its shortest counterexample:"))
    for cx in suite.counterexamples:
        render(cx, console)
    console.print(f"{'OK' if suite.ok else 'FAILED'} (profile {suite.profile}, names reused) "
                  f"in {suite.seconds:.1f} s")
