"""reference/ imports only the standard library and itself (docs/design.md §"Import rules")."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REFERENCE = Path(__file__).resolve().parent.parent / "reference"


def test_reference_imports_only_the_standard_library_and_itself():
    bad = []
    for path in sorted(REFERENCE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:          # relative: inside reference/
                    continue
                names = [node.module or ""]
            else:
                continue
            for name in names:
                if name.split(".")[0] not in sys.stdlib_module_names:
                    bad.append(f"{path.name}: {name}")
    assert bad == []
