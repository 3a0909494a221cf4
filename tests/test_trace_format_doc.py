"""docs/trace-format.md's example traces are what it says they are: every
`jsonl` block is a legal trace (`flightcheck check-trace` exits 0), and every
`jsonl rejected` block is rejected with exactly the output the page shows
after it (so the page shows check-trace's messages as they are)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

PAGE = Path(__file__).resolve().parent.parent / "docs" / "trace-format.md"
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks() -> list[tuple[str, str]]:
    """Every fenced block of the page: (info string, text)."""
    return [(m.group(1).strip(), m.group(2)) for m in FENCE.finditer(PAGE.read_text())]


def is_trace(text: str) -> bool:
    """A block whose first line is an event: an example trace, whatever its fence says."""
    first = text.lstrip().split("\n", 1)[0]
    try:
        return isinstance(json.loads(first), dict) and "ev" in json.loads(first)
    except json.JSONDecodeError:
        return False


def examples(kind: str) -> list[str]:
    return [text for info, text in blocks() if info == kind]


def check_trace(path: Path) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "flightcheck.cli", "check-trace", path.name],
                          capture_output=True, text=True, timeout=120, cwd=path.parent)
    return proc.returncode, proc.stdout, proc.stderr


def test_every_example_trace_on_the_page_is_marked_legal_or_rejected():
    traces = [(info, text) for info, text in blocks() if is_trace(text)]
    assert len(traces) >= 3
    assert {info for info, _ in traces} <= {"jsonl", "jsonl rejected"}, [info for info, _ in traces]


def test_the_page_has_a_minimal_legal_trace():
    shortest = min(examples("jsonl"), key=len)
    assert shortest.count("\n") <= 12


@pytest.mark.parametrize("index", range(len(examples("jsonl"))))
def test_every_legal_example_is_legal(tmp_path, index):
    path = tmp_path / "example.jsonl"
    path.write_text(examples("jsonl")[index])
    code, out, err = check_trace(path)
    assert code == 0 and out.startswith("example.jsonl: legal ("), (code, out, err)


@pytest.mark.parametrize("index", range(len(examples("jsonl rejected"))))
def test_every_rejected_example_prints_what_the_page_shows(tmp_path, index):
    """The `text` block after a rejected trace is `$ flightcheck check-trace
    NAME` and the output, line for line."""
    found = blocks()
    at = [i for i, (info, _) in enumerate(found) if info == "jsonl rejected"][index]
    info, shown = found[at + 1]
    command, *expected = shown.rstrip("\n").split("\n")
    assert info == "text" and command.startswith("$ flightcheck check-trace ")
    path = tmp_path / command.split()[-1]
    path.write_text(found[at][1])
    code, out, err = check_trace(path)
    assert code == 1, (code, out, err)
    assert out.rstrip("\n").split("\n") == expected
