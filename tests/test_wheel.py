"""The wheel ships every package: built from the source tree, installed in a
fresh virtual environment (nothing of the source tree on its path), it runs
`flightcheck verify --no-z3`. A subpackage missing from pyproject's package
list passes every other test (they import from the tree) and fails here."""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)


def test_wheel_installed_in_a_fresh_venv_runs_verify(tmp_path):
    # Built from a copy: a build/ folder left in the tree by an earlier build
    # would otherwise put packages in the wheel that the package list omits.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", ".ci-venv", ".venv", "__pycache__", ".hypothesis",
        ".pytest_cache", "docs"))
    dist = tmp_path / "dist"
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                 "-w", str(dist), str(source)], tmp_path)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = dist.glob("flightcheck-*.whl")

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    # The dependencies come from this interpreter's site-packages, added as a
    # plain path: .pth files there (the editable install's finder) are not run.
    purelib = next(Path(p) for p in site.getsitepackages() if Path(p).name == "site-packages")
    new_site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        tmp_path).stdout.strip())
    (new_site / "dependencies.pth").write_text(f"{purelib}\n")
    installed = run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                     "--no-index", str(wheel)], tmp_path)
    assert installed.returncode == 0, installed.stderr[-2000:]

    where = run([str(python), "-c", "import flightcheck.verification.z3.suite as m; print(m.__file__)"], tmp_path)
    assert where.returncode == 0, where.stderr[-2000:]
    assert str(env_dir) in where.stdout, f"imported from the source tree: {where.stdout}"

    verify = run([str(env_dir / "bin" / "flightcheck"), "verify", "--no-z3"], tmp_path)
    assert verify.returncode == 0, (verify.stdout + verify.stderr)[-3000:]
