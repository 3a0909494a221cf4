"""DESIGN.md's import rules, enforced on the source tree."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STDLIB = set(sys.stdlib_module_names)


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def layer_imports(layer: str) -> dict[Path, set[str]]:
    return {p: imported_modules(p) for p in sorted((ROOT / layer).rglob("*.py"))}


def top(name: str) -> str:
    return name.split(".")[0]


def test_spec_imports_only_the_standard_library():
    for path, names in layer_imports("spec").items():
        outside = {n for n in names if top(n) not in STDLIB and top(n) != "__future__"}
        assert not outside, f"{path.name} imports {outside}"


@pytest.mark.parametrize("layer", ["reference", "flightcheck/bench"])
def test_reference_and_bench_import_neither_spec_nor_torch(layer):
    if not (ROOT / layer).exists():
        pytest.skip(f"{layer}/ not written yet")
    for path, names in layer_imports(layer).items():
        bad = {n for n in names if top(n) in ("torch", "z3", "hypothesis")
               or n.startswith("flightcheck.spec") or n.startswith("flightcheck.verification")}
        assert not bad, f"{path} imports {bad}"


@pytest.mark.parametrize("layer", ["spec", "reference", "runtime", "flightcheck"])
def test_only_verification_imports_z3_and_hypothesis(layer):
    for path, names in layer_imports(layer).items():
        bad = {n for n in names if top(n) in ("z3", "hypothesis")}
        assert not bad, f"{path} imports {bad}"


@pytest.mark.parametrize("layer", ["spec", "reference", "verification", "flightcheck"])
def test_only_runtime_imports_torch(layer):
    for path, names in layer_imports(layer).items():
        assert not {n for n in names if top(n) == "torch"}, f"{path} imports torch"


@pytest.mark.parametrize("layer", ["spec", "reference", "runtime", "verification", "flightcheck"])
def test_only_flightcheck_vllm_imports_vllm(layer):
    for path, names in layer_imports(layer).items():
        if (ROOT / "flightcheck" / "vllm") in path.parents:
            continue
        assert not {n for n in names if top(n) == "vllm"}, f"{path} imports vllm"


def test_flightcheck_vllm_imports_vllm_only_where_it_runs_in_a_vllm_venv():
    """The recorder (loaded by vLLM), the replay worker and the cost worker
    (started in a vLLM venv) import vLLM; every other module of the package
    imports without it."""
    for path, names in layer_imports("flightcheck/vllm").items():
        if path.name in ("recorder.py", "replay_worker.py", "cost_worker.py"):
            continue
        assert not {n for n in names if top(n) == "vllm"}, f"{path} imports vllm"


def test_spec_and_reference_share_no_code():
    for path, names in layer_imports("spec").items():
        assert not {n for n in names if "reference" in n}, f"{path} imports the reference"


def test_verify_command_never_imports_torch():
    import subprocess
    code = ("import sys; from flightcheck.cli import main; "
            "main(['verify', '--list-configs']); "
            "import flightcheck.verification.suite, flightcheck.verification.explicit.search; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
