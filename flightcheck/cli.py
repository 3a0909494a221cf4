"""The `flightcheck` command line: composes the layers.

    flightcheck verify [--config NAME] [--depth D] [--mutant NAME] [--json]
    flightcheck check-trace FILE [--json]

Exit codes: 0 all checks passed, 1 a property failed or a mutant survived,
2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console


class _Parser(argparse.ArgumentParser):
    """argparse, with errors as one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"flightcheck: error: {message}\n")
        sys.exit(2)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="flightcheck", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    verify = sub.add_parser("verify", help="model-check the spec and hunt every mutant")
    verify.add_argument("--config", default="default",
                        help="model for the Z3 proofs and BMC (see --list-configs)")
    verify.add_argument("--depth", type=_positive, default=8, help="BMC depth (default 8)")
    verify.add_argument("--mutant", help="hunt only this mutant and print its counterexample")
    verify.add_argument("--no-z3", action="store_true", help="skip the Z3 engines")
    verify.add_argument("--list-configs", action="store_true", help="print the model names and exit")
    verify.add_argument("--json", action="store_true", help="print machine-readable results")
    verify.set_defaults(func=_cmd_verify)

    check = sub.add_parser("check-trace", help="replay a trace file against the spec")
    check.add_argument("file", help="a JSON Lines trace (DESIGN.md format)")
    check.add_argument("--json", action="store_true", help="print machine-readable results")
    check.set_defaults(func=_cmd_check_trace)
    return parser


def _cmd_check_trace(args: argparse.Namespace) -> int:
    from flightcheck.verification.trace_check import MalformedTrace, check_trace

    try:
        result = check_trace(args.file)
    except MalformedTrace as err:
        if args.json:
            print(json.dumps({"ok": False, "malformed": str(err)}))
        return _bad(f"{args.file}: {err}")
    if args.json:
        print(json.dumps(result.to_json(), indent=1))
    elif result.ok:
        print(f"{args.file}: legal ({result.events} events)")
    else:
        print(f"{args.file}: event {result.event_index} violates {result.property}: {result.message}")
        print(f"state before: {result.state_before}")
    if not args.json:
        for item in result.unchecked:
            print(f"not checked: {item}")
    return 0 if result.ok else 1


def _cmd_verify(args: argparse.Namespace) -> int:
    from flightcheck.spec import MUTANTS
    from flightcheck.verification.counterexample import render
    from flightcheck.verification.models import MODELS
    from flightcheck.verification.suite import hunt_mutant, run_suite

    if args.list_configs:
        for name, model in MODELS.items():
            print(f"{name}: {model.describe()}")
        return 0
    if args.config not in MODELS:
        return _bad(f"unknown --config {args.config!r}; known: {', '.join(MODELS)}")
    if args.mutant is not None and args.mutant not in MUTANTS:
        return _bad(f"unknown --mutant {args.mutant!r}; known: {', '.join(MUTANTS)}")
    console = Console(stderr=args.json)

    if args.mutant:
        result = hunt_mutant(args.mutant)
        if args.json:
            from flightcheck.verification.counterexample import to_json
            out = {"name": result.name, "killed": result.killed, "trace_length": result.trace_length,
                   "seconds": round(result.seconds, 3), "property": result.property,
                   "model": result.model,
                   "counterexample": to_json(result.counterexample) if result.counterexample else None}
            print(json.dumps(out, indent=1))
        elif result.counterexample:
            render(result.counterexample, console)
        else:
            console.print(f"mutant {args.mutant} SURVIVED on model {result.model}")
        return 0 if result.killed else 1

    with console.status("verifying") as status:
        suite = run_suite(MODELS[args.config], args.depth, use_z3=not args.no_z3,
                          progress=lambda msg: status.update(msg))
    if args.json:
        print(json.dumps(suite.to_json(), indent=1))
    else:
        _print_suite(console, suite)
    return 0 if suite.ok else 1


def _print_suite(console: Console, suite) -> None:
    from rich.table import Table
    from rich.text import Text

    props = Table(title="Properties", show_lines=False)
    for col in ("property", "kind", "method", "status", "depth", "seconds"):
        props.add_column(col, justify="right" if col in ("depth", "seconds") else "left")
    colour = {"proved": "green", "reached": "green", "bounded": "yellow",
              "violated": "red", "unknown": "red"}
    for p in suite.properties:
        props.add_row(p.name, p.kind, Text(p.method), Text(p.status, style=colour.get(p.status, "")),
                      "" if p.depth is None else str(p.depth), f"{p.seconds:.2f}")
    console.print(props)
    muts = Table(title="Mutants")
    for col in ("mutant", "killed", "by", "model", "trace length", "seconds"):
        muts.add_column(col)
    for m in suite.mutants:
        muts.add_row(m.name, Text("yes" if m.killed else "NO", style="green" if m.killed else "red"),
                     m.property or "", m.model, str(m.trace_length or ""), f"{m.seconds:.2f}")
    console.print(muts)
    console.print(f"{'OK' if suite.ok else 'FAILED'} in {suite.seconds:.1f} s")


def _bad(message: str) -> int:
    sys.stderr.write(f"flightcheck: error: {message}\n")
    return 2


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
