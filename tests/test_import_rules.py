"""The import rules of docs/design.md, enforced on the source tree.

Relative imports count as much as absolute ones: `from ..spec import state`
inside flightcheck/ is resolved to `flightcheck.spec.state` before a rule
reads it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STDLIB = set(sys.stdlib_module_names)


# The top-level folders that install as subpackages of flightcheck
# (pyproject.toml's package-dir), so a relative import resolves as it does
# once installed.
PACKAGE_OF_FOLDER = {"spec": "flightcheck.spec", "reference": "flightcheck.reference",
                     "runtime": "flightcheck.runtime", "verification": "flightcheck.verification",
                     "flightcheck": "flightcheck", "tests": "flightcheck.tests"}


def package_of(path: Path) -> str:
    """The dotted package a source file lives in, as installed."""
    parts = path.resolve().relative_to(ROOT).parts
    base = PACKAGE_OF_FOLDER[parts[0]]
    inner = parts[1:-1]
    return ".".join([base, *inner])


def resolve_relative(path: Path, level: int, module: str | None) -> str:
    """The absolute name of `from <level dots><module> import ...` in `path`."""
    package = package_of(path).split(".")
    if level - 1 >= len(package):
        raise ValueError(f"{path}: relative import beyond the top-level package")
    base = package[:len(package) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, relative imports resolved to absolute names
    (`from . import x` counts as importing the submodule `x`)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif isinstance(node, ast.ImportFrom):
            base = resolve_relative(path, node.level, node.module)
            names.add(base)
            if node.module is None:
                names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def layer_imports(layer: str) -> dict[Path, set[str]]:
    return {p: imported_modules(p) for p in sorted((ROOT / layer).rglob("*.py"))}


def top(name: str) -> str:
    return name.split(".")[0]


def test_spec_imports_only_the_standard_library():
    for path, names in layer_imports("spec").items():
        outside = {n for n in names if top(n) not in STDLIB and top(n) != "__future__"
                   and not n.startswith("flightcheck.spec")}
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
    """The recorder and the replay's KV connector (loaded by vLLM), the
    replay worker and the cost worker (started in a vLLM venv) import vLLM;
    every other module of the package imports without it."""
    for path, names in layer_imports("flightcheck/vllm").items():
        if path.name in ("recorder.py", "kv_connector.py", "replay_worker.py", "cost_worker.py"):
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


def test_relative_imports_are_resolved():
    """The rules above read relative imports too: a reference module that
    reached the spec through `..spec` would be caught."""
    sample = ROOT / "reference" / "scheduler.py"
    assert resolve_relative(sample, 1, "batch") == "flightcheck.reference.batch"
    assert resolve_relative(sample, 2, "spec.state") == "flightcheck.spec.state"
    nested = ROOT / "verification" / "z3" / "encoding" / "state.py"
    assert resolve_relative(nested, 2, None) == "flightcheck.verification.z3"
    names = imported_modules(sample)
    assert "flightcheck.reference.batch" in names
    assert not any(n.startswith("flightcheck.spec") for n in names)
