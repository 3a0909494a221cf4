"""The command line as a new user meets it: `--version`, one line (exit 2)
for a missing optional package, `verify`'s progress on stderr (a line per
phase when stderr is not a terminal, stdout kept pure JSON) and the legend
under its table."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from rich.console import Console

from flightcheck.cli import main
from flightcheck.commands.common import OPTIONAL_PACKAGES, missing_dependency
from flightcheck.commands.progress import PhaseProgress
from flightcheck.commands.verify import LEGEND, _print_suite, legend_key, mark_of
from flightcheck.verification.results import PropertyResult
from flightcheck.verification.suite import MutantResult, SuiteResult

GOLDEN = Path(__file__).parent / "golden" / "verify-before-layout-move.json"


def cli(*args: str, block: str | None = None) -> subprocess.CompletedProcess:
    """`flightcheck ARGS` in a fresh interpreter; `block`: a package made
    unimportable first, as if it were not installed."""
    blocker = f"import sys; sys.modules[{block!r}] = None; " if block else "import sys; "
    code = blocker + "from flightcheck.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)


# -- --version ------------------------------------------------------------------------------


def test_version_prints_the_installed_package_version():
    p = cli("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"flightcheck {version('flightcheck')}"


# -- a missing optional package: one line, exit 2 ------------------------------------------


@pytest.mark.parametrize("args", [
    ["run", "--pp", "1", "--num-prompts", "1"],
    ["bench", "--pp", "1", "--num-prompts", "2", "--dataset", "random"],
])
def test_a_command_without_torch_says_so_in_one_line_with_the_install_command(args):
    p = cli(*args, block="torch")
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert lines[0].startswith(f"flightcheck: error: flightcheck {args[0]} needs torch")
    assert "pip install torch==2.13.0" in lines[0] and "pip install -e '.[runtime]'" in lines[0]


def test_every_optional_package_has_its_line_and_other_modules_do_not():
    for package, install in OPTIONAL_PACKAGES.items():
        line = missing_dependency(ModuleNotFoundError(f"No module named {package!r}", name=package), "run")
        assert line is not None and package in line and install in line
    assert missing_dependency(ModuleNotFoundError("No module named 'nope'", name="nope"), "run") is None
    # the package is installed and only a part of it is missing: not "install torch"
    assert missing_dependency(ModuleNotFoundError("x", name="torch.no_such_part"), "run") is None


# -- verify's progress ---------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_off_a_terminal_is_one_line_per_phase_with_the_seconds():
    stream = io.StringIO()
    with PhaseProgress("flightcheck verify (vllm-0.8.5)", stream) as progress:
        progress.phase("exhaustive search of shared-k3")
        progress.phase("k-induction on shared-k3")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3 and "\x1b" not in stream.getvalue()
    for line, what in zip(lines, ("exhaustive search of shared-k3", "k-induction on shared-k3", "done")):
        assert line.startswith("flightcheck verify (vllm-0.8.5) [") and line.endswith(f" s] {what}")
        float(line.split("[")[1].split(" s]")[0])


def test_progress_on_a_terminal_is_live_and_names_the_phase():
    stream = _Terminal()
    with PhaseProgress("flightcheck verify (vllm-0.8.5)", stream) as progress:
        assert progress.live
        progress.phase("k-induction on shared-k3")
    assert "k-induction on shared-k3" in stream.getvalue()
    assert "] k-induction" not in stream.getvalue()          # not the plain lines


def test_verify_writes_its_phases_to_stderr_and_pure_json_to_stdout(capsys, monkeypatch):
    import flightcheck.verification.suite as suite

    def fake_run_suite(options, progress):
        progress("exhaustive search of shared-k3")
        progress("k-induction on shared-k3")
        return SuiteResult(0.1, [PropertyResult("S1_counter_bounds", "invariant", "proved", "m", None, 0.1)], [],
                           options.profile)

    monkeypatch.setattr(suite, "run_suite", fake_run_suite)
    assert main(["verify", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["ok"]
    phases = [line.split(" s] ", 1)[1] for line in captured.err.splitlines()]
    assert phases == ["exhaustive search of shared-k3", "k-induction on shared-k3", "done"]


# -- verify's legend -----------------------------------------------------------------------


def _suite(rows: list[PropertyResult]) -> SuiteResult:
    return SuiteResult(1.0, rows, [MutantResult("advance_at_completion", True, 2, 0.1, "S3", "shared-k3")])


def _printed(suite: SuiteResult) -> str:
    console = Console(record=True, width=200)
    _print_suite(console, suite)
    return console.export_text()


def test_the_legend_explains_every_mark_in_the_table_and_blank_cells():
    rows = [PropertyResult("S1_counter_bounds", "invariant", "proved", "exhaustive", None, 0.1),
            PropertyResult("S1_counter_bounds", "invariant", "proved", "k-induction", 1, 0.1),
            PropertyResult("S1_counter_bounds", "invariant", "bounded", "bmc", 4, 0.1),
            PropertyResult("pipeline_can_be_full", "sometimes", "unknown", "bmc", 4, 0.1),
            PropertyResult("request_can_finish", "sometimes", "reached", "bmc", 3, 0.1),
            PropertyResult("L2_no_deadlock", "liveness", "unknown", "param", None, 0.1)]
    text = _printed(_suite(rows))
    legend = text[text.index("legend"):]
    for shown in ("proved:", "proved@n:", "bounded@n:", "unknown@n:", "reached@n:", "unknown:", "(blank):"):
        assert f"    {shown}" in legend, shown
    assert "violated" not in legend                    # only the marks the table has
    assert "kind: invariant" in legend and "steps: its shortest counterexample" in text


def test_no_blank_entry_when_every_cell_is_filled():
    rows = [PropertyResult("S1_counter_bounds", "invariant", "proved", "exhaustive", None, 0.1)]
    assert "(blank)" not in _printed(_suite(rows))


def test_every_mark_of_the_default_run_has_a_legend_entry():
    """The golden file holds the default run's rows (every method): each
    cell's mark, and the blank cell, has its entry."""
    report = json.loads(GOLDEN.read_text())
    marks = {mark_of(PropertyResult(**{k: p[k] for k in ("name", "kind", "status", "method", "depth", "seconds")}))
             for p in report["properties"]}
    assert {"proved", "proved@1", "bounded@4", "reached@3"} <= marks
    for mark in marks | {"", "violated", "violated@3", "unknown", "unknown@4"}:
        assert legend_key(mark) in LEGEND, mark
