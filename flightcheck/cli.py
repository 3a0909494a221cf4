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
is saved), 130 interrupted by Ctrl-C (one line; every worker process is
killed first).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys


# Run as the `flightcheck` command: not imported by a test or a program, nor
# re-imported by a worker `multiprocessing` spawned (which restores the
# parent's sys.argv, but not its interpreter's own command line).
AS_COMMAND = ((__name__ == "__main__" or os.path.basename(sys.argv[0] if sys.argv else "") == "flightcheck")
              and "--multiprocessing-fork" not in sys.orig_argv)


def _quiet_ctrl_c_while_starting() -> None:
    """As the command, a Ctrl-C while the modules below load is one line and
    exit 130, like one later."""
    if not AS_COMMAND:
        return

    def interrupted(signum: int, frame: object) -> None:
        os.write(2, b"flightcheck: interrupted (Ctrl-C) while starting\n")
        os._exit(128 + signal.SIGINT)

    signal.signal(signal.SIGINT, interrupted)


_quiet_ctrl_c_while_starting()

from .commands import bench, check_trace, fuzz, interrupts, monitor, plot, run, simulate, verify, vllm  # noqa: E402 (after the Ctrl-C guard)
from .commands.common import Parser, bad, missing_dependency  # noqa: E402

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
    named = [_command_named(sys.argv[1:] if argv is None else argv)]    # the subcommand, once parsed
    try:
        with interrupts.watched_stdout():
            interrupts.install(named[0], exit_after_s=interrupts.EXIT_AFTER_CTRL_C_S if AS_COMMAND else None)
            code = _run_command(argv, named)
            if interrupts.received():         # the interruption was swallowed on the way
                return _interrupted(named[0])
            problem = interrupts.flush_stdout()
        return bad(problem) if problem else code
    except KeyboardInterrupt:                 # Ctrl-C, at any moment: one line, exit 130, no worker left
        return _interrupted(named[0])


def _run_command(argv: list[str] | None, named: list[str]) -> int:
    """Parse and run the subcommand; its exit code. `named[0]` becomes the
    subcommand once it is parsed."""
    try:
        args = build_parser().parse_args(argv)
        named[0] = args.command
        return args.func(args)
    except ModuleNotFoundError as err:        # torch, safetensors or transformers: one line, exit 2
        line = missing_dependency(err, named[0])
        if line is None:
            raise
        return bad(line)
    except Exception as err:                  # noqa: BLE001 (re-raised unless explained below)
        return _explained(err, named[0])


def _explained(err: Exception, command: str) -> int:
    """An exception that ended the command but is no bug of ours: a Ctrl-C
    that a C library turned into its own error (ctypes, for Z3), or a
    standard output that cannot be written. Anything else is re-raised."""
    if interrupts.received():
        return _interrupted(command)
    if isinstance(err, OSError) and interrupts.stdout_is_broken():
        problem = interrupts.flush_stdout() or interrupts.stdout_problem(err)
        return bad(problem)
    raise err


def _command_named(argv: list[str]) -> str:
    """The subcommand the arguments name, for the Ctrl-C line before they are parsed."""
    first = next((a for a in argv if not a.startswith("-")), "")
    return first if first.replace("-", "").isalnum() and len(first) <= 20 else "(starting)"


def _interrupted(command: str) -> int:
    """Ctrl-C: the one line, exit 130."""
    interrupts.answered()
    interrupts.kill_children()
    interrupts.say_interrupted(command)
    return interrupts.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
