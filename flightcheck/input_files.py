"""Reading a user's input file with bounds: a regular file only (a device
such as /dev/zero, a FIFO or a directory is refused at once, and opening
never blocks), at most a stated number of bytes (counted while reading:
/dev/zero's size is 0 and a file may grow), UTF-8 text whose first bad byte
is named by its line, and JSON whose nesting or integers Python cannot read
refused in one line. Every refusal is an InputFileError (a ValueError), one
line, for exit code 2.

Standard library only: the vLLM replay worker imports it in vLLM's venv.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from typing import Any

MiB = 2**20
CHUNK = 1 * MiB


class InputFileError(ValueError):
    """An input file that is not readable within the bounds (exit code 2)."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO or pipe"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str | os.PathLike[str], what: str) -> int:
    """A read-only descriptor of `path`, refused unless it is a regular file.
    O_NONBLOCK: opening a FIFO with no writer returns at once (then refused)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as err:
        raise InputFileError(f"{what} {os.fspath(path)}: cannot read it ({err.strerror or err})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise InputFileError(f"{what} {os.fspath(path)}: is {_kind(mode)}, not a regular file")
    return fd


def read_bytes(path: str | os.PathLike[str], limit: int, what: str) -> bytes:
    """The whole file, refused past `limit` bytes (never more is read)."""
    fd = open_regular(path, what)
    chunks, total = [], 0
    try:
        while True:
            chunk = os.read(fd, min(CHUNK, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise InputFileError(f"{what} {os.fspath(path)}: larger than {limit} bytes "
                                     f"({limit // MiB} MiB), the most it may hold")
    except OSError as err:
        raise InputFileError(f"{what} {os.fspath(path)}: cannot read it ({err.strerror or err})") from None
    finally:
        os.close(fd)
    return b"".join(chunks)


def decode(data: bytes, path: str | os.PathLike[str], what: str) -> str:
    """UTF-8 text; a bad byte is named by its line (1-based) and offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise InputFileError(f"{what} {os.fspath(path)}:{line}: not UTF-8 text "
                             f"(byte {err.start}: {err.reason})") from None


def read_text(path: str | os.PathLike[str], limit: int, what: str) -> str:
    return decode(read_bytes(path, limit, what), path, what)


def text_lines(path: str | os.PathLike[str], limit: int, what: str) -> Iterator[str]:
    """The file's lines as text (newlines kept), read as they are needed, in
    `limit` bytes at most; a bad byte is named by its line."""
    fd = open_regular(path, what)
    with os.fdopen(fd, "rb") as f:
        total = 0
        for number, raw in enumerate(f, start=1):
            total += len(raw)
            if total > limit:
                raise InputFileError(f"{what} {os.fspath(path)}: larger than {limit} bytes "
                                     f"({limit // MiB} MiB), the most it may hold")
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise InputFileError(f"{what} {os.fspath(path)}:{number}: not UTF-8 text "
                                     f"(byte {err.start} of the line: {err.reason})") from None


def parse_json(text: str, where: str) -> Any:
    """json.loads, every failure one line naming `where` (e.g. "file.json:3").
    JSONDecodeError is re-raised as it is for callers that try another
    reading; RecursionError (nesting past about 1,000 levels) and ValueError
    (an integer of more than 4,300 digits) become InputFileError."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise InputFileError(f"{where}: JSON nested too deeply to read") from None
    except ValueError as err:                  # int digits past sys.get_int_max_str_digits()
        raise InputFileError(f"{where}: JSON this reader cannot take ({str(err).split(';')[0]})") from None


def json_lines(text: str, where: str) -> list[Any]:
    """Each non-blank line of `text` as a JSON value; InputFileError naming
    `where:LINE` (1-based, blank lines counted) at the first that is not."""
    values = []
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            try:
                values.append(parse_json(line, f"{where}:{number}"))
            except json.JSONDecodeError as err:
                raise InputFileError(f"{where}:{number}: not JSON ({err.msg})") from None
    return values
