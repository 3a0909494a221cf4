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
