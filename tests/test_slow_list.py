"""tests/slow_tests.txt, the default suite's time budget: every line names a
test that exists (conftest.py marks them `slow` at collection, and refuses a
whole-suite run whose list names a missing test)."""

from __future__ import annotations

import ast
from pathlib import Path

from .conftest import SLOW_TESTS_FILE, slow_test_ids

TESTS = Path(__file__).resolve().parent


def test_every_listed_slow_test_names_a_test_function_that_exists():
    for node_id in sorted(slow_test_ids()):
        path, _, rest = node_id.partition("::")
        function = rest.split("[")[0].split("::")[-1]
        source = TESTS.parent / path
        assert source.is_file(), node_id
        names = {n.name for n in ast.walk(ast.parse(source.read_text(encoding="utf-8")))
                 if isinstance(n, ast.FunctionDef)}
        assert function in names, f"{SLOW_TESTS_FILE.name}: {node_id} names no test"


def test_each_line_carries_its_measured_seconds():
    for line in SLOW_TESTS_FILE.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            node_id, seconds = line.split()
            assert float(seconds) >= 10, line
