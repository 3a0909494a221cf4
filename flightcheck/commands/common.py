"""Shared helpers for the subcommands."""

from __future__ import annotations

import argparse
import sys


class Parser(argparse.ArgumentParser):
    """argparse, with errors as one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"flightcheck: error: {message}\n")
        sys.exit(2)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def bad(message: str) -> int:
    """Report a bad argument found after parsing; exit code 2."""
    sys.stderr.write(f"flightcheck: error: {message}\n")
    return 2


INTERNAL_ERROR = 3


def internal_error(err: BaseException, command: str) -> tuple[str, int]:
    """Report an exception flightcheck did not expect: a bug of ours, not a
    verdict and not bad input. The traceback goes to a temporary file so the
    terminal gets one line; returns (that line, exit code 3)."""
    import tempfile
    import traceback

    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    try:
        with tempfile.NamedTemporaryFile("w", prefix=f"flightcheck-{command}-", suffix=".txt",
                                         delete=False, encoding="utf-8", errors="backslashreplace") as out:
            out.write(text)
        where = f"traceback saved to {out.name}"
    except OSError as save_error:
        where = f"and the traceback could not be saved ({save_error.strerror})"
    summary = ascii(str(err))[1:-1][:200]
    message = (f"internal error in flightcheck {command} (a bug in flightcheck, not a verdict on the "
               f"input): {type(err).__name__}: {summary}; {where}")
    sys.stderr.write(f"flightcheck: {message}\n")
    return message, INTERNAL_ERROR
