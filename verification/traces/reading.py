"""Reading a trace: bytes to UTF-8 text, text to JSON Lines, every event
validated against the schema (schema.py) before the spec sees any of it.

A file that is not a trace in the format is MalformedTrace (exit code 2),
with a one-line message that names the line (1-based, every line of the file
counted, blank ones included), the event kind, the field and what was
expected. The line numbers are kept with the events (`NumberedEvents`), so a
violation found later is reported by the same numbering.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from .schema import EVENTS, SchemaError, validate_event

EVENT_KINDS = set(EVENTS)


class MalformedTrace(ValueError):
    """The file is not a trace in the format (exit code 2)."""


# The leading bytes of compressed files a user may hand over for a trace (the
# recorder writes plain JSON Lines only), and the command that decompresses each.
_COMPRESSED = ((b"\x1f\x8b", "gzip", "zcat"), (b"BZh", "bzip2", "bzcat"), (b"\xfd7zXZ\x00", "xz", "xzcat"),
               (b"\x28\xb5\x2f\xfd", "zstd", "zstdcat"))


def refuse_compressed(first_bytes: bytes) -> None:
    """MalformedTrace naming the compression if the input starts as a
    compressed file does (read as text it is only a bad byte at line 1)."""
    for magic, name, reader in _COMPRESSED:
        if first_bytes.startswith(magic):
            raise MalformedTrace(f"line 1: {name}-compressed data, not a JSON Lines trace: decompress it "
                                 f"first ({reader} FILE | flightcheck check-trace -)")


class NumberedEvents(list):
    """A trace's events, with the line of the file each came from
    (`line_numbers[i]` for event i). A plain list of events stands for a
    file with one event per line and no blank line: event i on line i + 1."""

    def __init__(self, events: Iterable[dict[str, Any]], line_numbers: list[int]) -> None:
        super().__init__(events)
        self.line_numbers = line_numbers


def line_of(events: list[Any], index: int) -> int:
    """The 1-based line of the file that event `index` came from."""
    numbers = getattr(events, "line_numbers", None)
    return numbers[index] if numbers is not None and index < len(numbers) else index + 1


def parse_line(line: str, number: int) -> Any:
    """One line's JSON value; MalformedTrace naming the line if it is not JSON."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as err:
        # a pretty-printed file opens its first value alone on a line
        hint = "; a trace is JSON Lines, one event per line" if line.strip() in ("{", "[") else ""
        raise MalformedTrace(f"line {number}: not JSON ({err.msg} at column {err.colno}){hint}") from None
    except RecursionError:
        raise MalformedTrace(f"line {number}: not JSON this checker reads (nested too deeply)") from None
    except ValueError as err:                 # e.g. an integer of more digits than Python converts
        raise MalformedTrace(f"line {number}: not JSON this checker reads ({err})") from None


def validate_events(events: list[Any]) -> None:
    """Check every event against the schema (schema.py) before the spec sees
    any; MalformedTrace names the line, the field and what was expected."""
    if not events:
        raise MalformedTrace("the trace is empty (the first event must be 'config')")
    config: dict[str, Any] | None = None
    for index, event in enumerate(events):
        validate_numbered(event, config, line_of(events, index))
        if index == 0:
            config = event


def validate_numbered(event: Any, config: dict[str, Any] | None, line: int) -> None:
    """One event against the schema (`config`: the trace's config event, None
    for the first); MalformedTrace naming `line`, the kind and the field."""
    try:
        validate_event(event, config)
    except SchemaError as err:
        kind = event.get("ev") if isinstance(event, dict) and isinstance(event.get("ev"), str) else None
        what = f" {kind} event:" if kind in EVENT_KINDS else ""
        raise MalformedTrace(f"line {line}:{what} {err.message}") from None


def read_events(lines: Iterable[str]) -> NumberedEvents:
    """Parse and validate JSON Lines; blank lines are skipped (and counted)."""
    events, line_numbers = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        events.append(parse_line(line, number))
        line_numbers.append(number)
    numbered = NumberedEvents(events, line_numbers)
    validate_events(numbered)
    return numbered


def read_trace_file(path: str | Path) -> NumberedEvents:
    """The validated events of a trace file; MalformedTrace for a file that
    cannot be read, is not UTF-8 or is not in the format."""
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise MalformedTrace(f"cannot read it: {err.strerror or err}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        refuse_compressed(data)
        line = data.count(b"\n", 0, err.start) + 1
        raise MalformedTrace(f"line {line}: not UTF-8 text (byte {err.start}: {err.reason})") from None
    # split on newlines only: str.splitlines would also split inside strings at
    # U+2028 and other separators a writer need not escape
    return read_events(text.split("\n"))
