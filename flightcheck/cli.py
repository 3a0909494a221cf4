"""The `flightcheck` command line: composes the layers.

    flightcheck verify [--config NAME] [--depth D] [--mutant NAME] [--json]
    flightcheck fuzz --steps N --seed S [--mutant NAME] [--profile NAME] [--json]
    flightcheck check-trace FILE [--json]
    flightcheck run --pp K --num-prompts N [--trace FILE] [--json]
    flightcheck simulate ... | bench ... | plot TRACE|RESULTS...
    flightcheck --version

Each subcommand lives in `flightcheck/commands/`, with `add_parser(sub)` and
`run(args) -> exit code`. Exit codes: 0 success, 1 a check failed, 2 bad
arguments or input (a missing optional package too: one line naming it and
its install command), 3 an internal error (a bug in flightcheck; the traceback
is saved).
"""

from __future__ import annotations

import argparse
import sys

from .commands import bench, check_trace, fuzz, monitor, plot, run, simulate, verify, vllm
from .commands.common import Parser, bad, missing_dependency

COMMANDS = (verify, fuzz, check_trace, monitor, run, simulate, bench, plot, vllm)


def build_parser() -> Parser:
    parser = Parser(prog="flightcheck", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action=_PrintVersion, help="print the installed version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


class _PrintVersion(argparse.Action):
    """`--version`: the package metadata is read only when asked for, so
    every other command line starts no slower."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"flightcheck {package_version()}")
        parser.exit()


def package_version() -> str:
    """The installed package's version (pyproject.toml's, through its metadata)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("flightcheck")
    except PackageNotFoundError:          # run from a source tree that was never installed
        return "(not installed: no package metadata)"


def _escape_unprintable_output() -> None:
    """Print what the terminal cannot encode (a lone surrogate in a file name
    given on the command line, say) as escapes instead of crashing."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


def main(argv: list[str] | None = None) -> int:
    _escape_unprintable_output()
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ModuleNotFoundError as err:    # torch, safetensors or transformers: one line, exit 2
        line = missing_dependency(err, args.command)
        if line is None:
            raise
        return bad(line)


if __name__ == "__main__":
    sys.exit(main())
