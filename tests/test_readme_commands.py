"""CI runs the README's two commands as written, in order, in one clone
(.ci/run reads them from README.md through .ci/readme_commands.py): these
tests pin what that proves."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _extractor():
    spec = importlib.util.spec_from_file_location("readme_commands", ROOT / ".ci" / "readme_commands.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_the_readme_has_two_commands_verify_then_test():
    verify, test = _extractor().readme_commands((ROOT / "README.md").read_text())
    assert verify.endswith("flightcheck verify")
    assert test.endswith("python -m pytest -q -n auto")   # pytest-xdist: every core
    # both install into the same venv of the same clone, the second on top of the first
    assert verify.startswith("python3 -m venv .venv") and test.startswith("python3 -m venv .venv")
    assert "torch==2.13.0" in test, "torch's CPU build pinned before the project's extras"


def test_ci_runs_the_readme_commands_not_a_copy():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "readme_commands.py 1" in ci and "readme_commands.py 2" in ci
    assert ci.index("readme_commands.py 1") < ci.index("readme_commands.py 2")
    assert "pytest -q" not in ci.replace("# ", ""), "the test command comes from README.md only"


def test_the_extractor_refuses_a_readme_without_two_commands(tmp_path: Path):
    fake = tmp_path / ".ci"
    fake.mkdir()
    (fake / "readme_commands.py").write_text((ROOT / ".ci" / "readme_commands.py").read_text())
    (tmp_path / "README.md").write_text("# x\n\n## The two commands\n\n```bash\necho one\n```\n")
    done = subprocess.run([sys.executable, str(fake / "readme_commands.py"), "1"],
                          capture_output=True, text=True)
    assert done.returncode == 1 and "holds 1 bash blocks, not 2" in done.stderr
