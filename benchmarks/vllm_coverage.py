"""How much of vLLM's real scheduler the project's vLLM campaign runs.

    python benchmarks/vllm_coverage.py --versions 0.34.0 [--kv-connector | --all-features]
        [--workloads N] [--seed S] [--modes sync,async] [--spec-tokens K [--lookahead]]
        [--functions f1,f2] [--json PATH]

For each version it runs the differential campaign (flightcheck/vllm/
campaign.py, `run_campaign`, without the mutant hunt, which runs only the
reference) once per mode, sync and async scheduling by default, with the
replay worker under Python's `coverage`, and measures the statements of
vLLM's `vllm/v1/core/sched/scheduler.py` that ran, both modes together.
It prints, per function of that file, its body statements, how many ran
and the percentage, then the functions none of whose statements ran, and
with `--functions` the figure for that set of functions (the connector
issue's acceptance set: `--functions kv`). Every report also gives the
request-states cut: the functions of that file whose names contain none of
`CUT_NAME_PARTS` (encoder, multimodal, mamba, statistics, ...), and
`PriorityRequestQueue` of `request_queue.py` (measured beside it).

Where `coverage` comes from. The vLLM venvs in ~/.cache/flightcheck are
never modified (no `pip install` into them). The first run installs
`coverage` with the venv's own pip into a folder of ours,
`~/.cache/flightcheck/coverage-tools/pyX.Y` (`pip install --target`;
coverage has no dependencies, so nothing else lands there), and the worker
is started through a small launcher script that the campaign takes as the
version's interpreter (`FLIGHTCHECK_VLLM_PYTHON_<version>`, replay.py): it
adds that folder to PYTHONPATH and runs `python -m coverage run
--parallel-mode --include=*/<file> -m flightcheck.vllm.replay_worker`. The
measured data is combined and read back by the same interpreter, so this
environment needs no `coverage` of its own.

Statements are coverage's (its executable lines); a function's body
statements are those inside its body, the `def` line, decorators and
docstring excluded, each counted for the innermost function that holds it
(`schedule`'s nested `skip_request` is its own row). Statements outside any
function (imports, class bodies, the `def` lines themselves) run at import
and are counted in the file's total only.

Exit 0 when every campaign ran (its differential verdicts are the
campaign's business, printed on stderr), 2 without a venv or an option the
campaign lacks.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from flightcheck.vllm.replay import CACHE_ENV, PYTHON_ENV, missing_venv_message, venv_python  # noqa: E402
from flightcheck.vllm.versions import UnknownRelease, release  # noqa: E402

SCHEDULER_FILE = "vllm/v1/core/sched/scheduler.py"
COVERAGE_PIN = "coverage==7.18.0"
TOOLS_ENV = "FLIGHTCHECK_COVERAGE_TOOLS"

# The connector's functions the acceptance names (`--functions kv`);
# `_drain_deferred_loads` and `_reserve_parked` need HiSparse and are left out.
KV_FUNCTIONS = ("_update_waiting_for_remote_kv", "_update_from_kv_xfer_finished",
                "_update_requests_with_invalid_blocks", "_handle_invalid_blocks", "_handle_failed_recving",
                "_drain_deferred_frees", "_connector_finished", "_admits_inflight_kv_load",
                "_next_waiting_queue", "_request_blocks_can_be_freed")
FUNCTION_SETS = {"kv": KV_FUNCTIONS}

# The request-states issue's cut (`--cut`): every function of the scheduler's
# file except those whose qualified name contains one of these (encoder and
# multimodal inputs, mamba, statistics, metrics, KV events, shutdown, perf:
# parts vLLM cannot run here, or that decide nothing), and the priority
# queue's class of request_queue.py.
CUT_NAME_PARTS = ("encoder", "_mm_", "multimodal", "mamba", "stats", "metrics", "_events", "shutdown", "perf")
QUEUE_FILE = "vllm/v1/core/sched/request_queue.py"
QUEUE_CLASS = "PriorityRequestQueue"


# ---------------------------------------------------------------------------
# Statements to functions
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class FunctionSpan:
    """A function of the file: its qualified name (`Class.method`,
    `Class.method.inner`) and the lines of its body, docstring excluded."""
    name: str
    first: int
    last: int
    depth: int


@dataclass(frozen=True)
class FunctionCoverage:
    name: str
    statements: int
    run: int
    missing: tuple[int, ...] = ()         # the body statements (lines) that did not run

    @property
    def percent(self) -> float:
        return 100.0 * self.run / self.statements if self.statements else 100.0

    @property
    def short_name(self) -> str:
        return self.name.rsplit(".", 1)[-1]


def _body_start(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int | None:
    """The first line of the body after its docstring (None: a body that is
    only a docstring)."""
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return body[0].lineno if body else None


def function_spans(source: str) -> list[FunctionSpan]:
    """Every function and method of `source`, nested ones included."""
    spans: list[FunctionSpan] = []

    def visit(node: ast.AST, prefix: str, depth: int) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                start = _body_start(child)
                if start is not None:
                    spans.append(FunctionSpan(name, start, child.end_lineno or start, depth))
                visit(child, name + ".", depth + 1)
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.", depth)
            else:
                visit(child, prefix, depth)

    visit(ast.parse(source), "", 0)
    return spans


def owner_of_lines(spans: list[FunctionSpan], lines: Iterable[int]) -> dict[int, str]:
    """Each line that lies in some function's body, mapped to the innermost
    such function (a nested function's `def` line belongs to its parent)."""
    owners: dict[int, str] = {}
    for line in lines:
        holders = [s for s in spans if s.first <= line <= s.last]
        if holders:
            owners[line] = max(holders, key=lambda s: (s.depth, s.first)).name
    return owners


def per_function(source: str, statements: Iterable[int], executed: Iterable[int]) -> list[FunctionCoverage]:
    """The body statements of every function of `source` and how many of
    them ran, in the file's order; functions with no statement are left out."""
    spans = function_spans(source)
    statements = set(statements)
    ran = set(executed) & statements
    owners = owner_of_lines(spans, statements)
    rows = []
    for span in sorted(spans, key=lambda s: s.first):
        mine = {line for line, owner in owners.items() if owner == span.name}
        if mine:
            rows.append(FunctionCoverage(span.name, len(mine), len(mine & ran), tuple(sorted(mine - ran))))
    return rows


def chosen(rows: list[FunctionCoverage], names: Iterable[str]) -> tuple[list[FunctionCoverage], list[str]]:
    """The rows named (by qualified or short name), and the names that match
    no function."""
    wanted = list(names)
    found = [r for r in rows if r.name in wanted or r.short_name in wanted]
    unknown = [n for n in wanted if not any(r.name == n or r.short_name == n for r in found)]
    return found, unknown


def total(rows: Iterable[FunctionCoverage]) -> tuple[int, int]:
    rows = list(rows)
    return sum(r.statements for r in rows), sum(r.run for r in rows)


def table(rows: list[FunctionCoverage]) -> list[str]:
    """The per-function table, one line a function."""
    width = max([len("function")] + [len(r.name) for r in rows])
    lines = [f"{'function':<{width}}  {'statements':>10}  {'run':>5}  {'%':>5}"]
    lines += [f"{r.name:<{width}}  {r.statements:>10}  {r.run:>5}  {r.percent:>5.1f}" for r in rows]
    return lines


def uncovered(rows: list[FunctionCoverage]) -> list[str]:
    """The functions none of whose body statements ran."""
    return [r.name for r in rows if r.run == 0]


def figure(label: str, rows: list[FunctionCoverage]) -> str:
    statements, run = total(rows)
    percent = 100.0 * run / statements if statements else 100.0
    return f"{label}: {run} of {statements} body statements run ({percent:.1f} %)"


# ---------------------------------------------------------------------------
# Running the campaign under coverage
# ---------------------------------------------------------------------------

# Read in the vLLM venv, with the tools folder on its path: the measured
# statements and the missing ones of every measured file whose path ends in
# argv[2], from the data files in argv[1].
_ANALYSE = r"""
import json, sys
from coverage import Coverage
folder, suffix = sys.argv[1], sys.argv[2]
cov = Coverage(data_file=folder + "/worker")
cov.combine([folder], keep=True)
found = []
for path in sorted(cov.get_data().measured_files()):
    if path.endswith(suffix):
        _, statements, _, missing, _ = cov.analysis2(path)
        found.append({"path": path, "statements": statements, "missing": missing})
print(json.dumps(found))
"""


def tools_folder(python: Path) -> Path:
    """Where `coverage` for this interpreter lives (outside its venv)."""
    explicit = os.environ.get(TOOLS_ENV)
    if explicit:
        return Path(explicit)
    tag = subprocess.run([str(python), "-c", "import sys; print(f'py{sys.version_info[0]}.{sys.version_info[1]}')"],
                         capture_output=True, text=True, check=True).stdout.strip()
    cache = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "flightcheck")
    return Path(cache) / "coverage-tools" / tag


def ensure_coverage(python: Path) -> Path:
    """The tools folder, with `coverage` installed there by the venv's own
    pip (`--target`: the venv itself is left as it is)."""
    folder = tools_folder(python)
    if not (folder / "coverage" / "__init__.py").exists():
        print(f"installing {COVERAGE_PIN} into {folder} (outside the vLLM venv)", file=sys.stderr)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "--target", str(folder), COVERAGE_PIN], check=True)
    return folder


def write_launcher(folder: Path, python: Path, tools: Path, data: Path) -> Path:
    """A script that starts `python -m MODULE` (the campaign's worker) under
    coverage, measuring only the scheduler's file."""
    launcher = folder / "python"
    launcher.write_text(
        "#!/bin/sh\n"
        f"PYTHONPATH=\"${{PYTHONPATH:+$PYTHONPATH:}}{tools}\"\nexport PYTHONPATH\n"
        f"exec {shlex.quote(str(python))} -m coverage run --parallel-mode "
        f"--data-file={shlex.quote(str(data / 'worker'))} --include='*/{SCHEDULER_FILE},*/{QUEUE_FILE}' "
        "\"$@\"\n")
    launcher.chmod(0o755)
    return launcher


@contextlib.contextmanager
def launcher_for(version: str, python: Path, tools: Path, data: Path) -> Iterator[None]:
    """While the block runs, the campaign's workers of `version` start
    under coverage (replay.venv_python reads the variable)."""
    variable = PYTHON_ENV.format(version.replace(".", "_"))
    before = os.environ.get(variable)
    with tempfile.TemporaryDirectory(prefix="flightcheck-coverage-") as scratch:
        os.environ[variable] = str(write_launcher(Path(scratch), python, tools, data))
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(variable, None)
            else:
                os.environ[variable] = before


def campaign_runs(version: str, options: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """The campaigns to run, one per mode: (label, the campaign's argv).
    With `--kv-connector` (or `--all-features`) the campaign itself runs each version sync and
    async unless `--async` asks for async alone, so sync and async together
    are one campaign there (and sync alone is not available)."""
    common = ["--versions", version, "--workloads", str(options.workloads), "--seed", str(options.seed),
              "--no-mutants"]
    if getattr(options, "spec_tokens", 0):           # drafts, and a drafter with lookahead slots
        common += ["--spec-tokens", str(options.spec_tokens), *(["--lookahead"] if options.lookahead else [])]
    if options.kv_connector or getattr(options, "all_features", False):
        common.append("--kv-connector" if options.kv_connector else "--all-features")
        if options.modes == ["async"]:
            return [("async", [*common, "--async"])]
        return [("sync+async", common)]
    return [(mode, [*common, "--async"] if mode == "async" else common) for mode in options.modes]


def run_campaigns(version: str, options: argparse.Namespace, data: Path) -> dict[str, int]:
    """The campaign of every mode on `version`, its workers under coverage;
    the campaign's exit status per mode (its report goes to stderr)."""
    from flightcheck.vllm import campaign

    parser = argparse.ArgumentParser(prog="campaign")
    campaign.add_options(parser)
    python = venv_python(version)
    tools = ensure_coverage(python)
    statuses = {}
    with launcher_for(version, python, tools, data):
        for mode, argv in campaign_runs(version, options):
            args = parser.parse_args(argv)
            print(f"vLLM {version} {mode}: the campaign under coverage", file=sys.stderr, flush=True)
            with contextlib.redirect_stdout(sys.stderr):
                statuses[mode] = campaign.run_campaign(args, parser.error)
    return statuses


def read_measurement(version: str, data: Path, file: str = SCHEDULER_FILE) -> dict[str, Any]:
    """One measured file's statements (the scheduler's by default) and the
    ones that ran, as the vLLM venv's coverage reads its data."""
    python = venv_python(version)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(tools_folder(python))
    done = subprocess.run([str(python), "-c", _ANALYSE, str(data), file], capture_output=True,
                          text=True, env=env, check=True)
    found = json.loads(done.stdout)
    if len(found) != 1:
        raise RuntimeError(f"vLLM {version}: expected one measured {file}, found {found}")
    measured = found[0]
    executed = sorted(set(measured["statements"]) - set(measured["missing"]))
    return {"path": measured["path"], "statements": measured["statements"], "executed": executed}


def measure(version: str, options: argparse.Namespace) -> dict[str, Any]:
    """One version's campaigns under coverage, and what ran."""
    with tempfile.TemporaryDirectory(prefix="flightcheck-coverage-data-") as data:
        statuses = run_campaigns(version, options, Path(data))
        measured = read_measurement(version, Path(data))
        queue = read_measurement(version, Path(data), QUEUE_FILE)
    source = Path(measured["path"]).read_text()
    rows = per_function(source, measured["statements"], measured["executed"])
    queue_rows = [r for r in per_function(Path(queue["path"]).read_text(), queue["statements"], queue["executed"])
                  if r.name.startswith(QUEUE_CLASS + ".")]
    return {"version": version, "modes": list(options.modes), "campaign_exit": statuses,
            "file": SCHEDULER_FILE, "statements": len(measured["statements"]),
            "run": len(measured["executed"]), "rows": rows, "queue_rows": queue_rows}


def in_cut(row: FunctionCoverage) -> bool:
    """Whether a function of the scheduler's file counts in the cut."""
    return not any(part in row.name.lower() for part in CUT_NAME_PARTS)


def cut_lines(result: dict[str, Any]) -> list[str]:
    """The cut's two figures: the scheduler's functions kept, the priority queue's."""
    kept = [r for r in result["rows"] if in_cut(r)]
    return [figure(f"the cut ({len(kept)} functions of {len(result['rows'])}; names without "
                   f"{', '.join(CUT_NAME_PARTS)})", kept),
            figure(f"{QUEUE_CLASS} ({QUEUE_FILE})", result.get("queue_rows", []))]


# ---------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------

def report_lines(result: dict[str, Any], functions: list[str]) -> list[str]:
    rows: list[FunctionCoverage] = result["rows"]
    percent = 100.0 * result["run"] / result["statements"] if result["statements"] else 100.0
    lines = [f"vLLM {result['version']} ({' + '.join(result['modes'])}): {result['run']} of "
             f"{result['statements']} statements of {result['file']} run ({percent:.1f} %)", *cut_lines(result),
             *table(rows), "uncovered functions: " + (", ".join(uncovered(rows)) or "none")]
    if functions:
        picked, unknown = chosen(rows, functions)
        lines.append(figure("chosen functions (" + ", ".join(r.short_name for r in picked) + ")", picked))
        lines += [f"  not run in {r.short_name}: lines {', '.join(map(str, r.missing))}" for r in picked if r.missing]
        if unknown:
            lines.append("no such function: " + ", ".join(unknown))
    return lines


def result_json(result: dict[str, Any], functions: list[str]) -> dict[str, Any]:
    rows: list[FunctionCoverage] = result["rows"]
    out = {k: v for k, v in result.items() if k not in ("rows", "queue_rows")}
    out["functions"] = [{"name": r.name, "statements": r.statements, "run": r.run} for r in rows]
    kept = [r for r in rows if in_cut(r)]
    queue = result.get("queue_rows", [])
    out["cut"] = {"statements": total(kept)[0], "run": total(kept)[1],
                  "missing": {r.name: list(r.missing) for r in kept if r.missing}}
    out["priority_queue"] = {"statements": total(queue)[0], "run": total(queue)[1],
                             "missing": {r.name: list(r.missing) for r in queue if r.missing}}
    out["uncovered"] = uncovered(rows)
    if functions:
        picked, unknown = chosen(rows, functions)
        statements, run = total(picked)
        out["chosen"] = {"functions": [r.name for r in picked], "statements": statements, "run": run,
                         "unknown": unknown, "missing": {r.name: list(r.missing) for r in picked if r.missing}}
    return out


def parse_functions(text: str | None) -> list[str]:
    if not text:
        return []
    names: list[str] = []
    for item in text.split(","):
        names.extend(FUNCTION_SETS.get(item.strip(), (item.strip(),)))
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/vllm_coverage.py", description=__doc__.split("\n")[0])
    parser.add_argument("--versions", default="0.34.0")
    parser.add_argument("--kv-connector", action="store_true", help="the campaign's --kv-connector")
    parser.add_argument("--all-features", action="store_true", help="the campaign's --all-features")
    parser.add_argument("--workloads", type=_positive, default=100, help="workloads per version and mode")
    parser.add_argument("--spec-tokens", type=int, default=0, metavar="K", help="the campaign's --spec-tokens")
    parser.add_argument("--lookahead", action="store_true", help="the campaign's --lookahead (with --spec-tokens)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--modes", default="sync,async", help="sync, async or both (one measurement)")
    parser.add_argument("--functions", help="comma-separated function names (or `kv`): their figure")
    parser.add_argument("--json", help="write the report here")
    options = parser.parse_args(argv)
    options.modes = [m for m in options.modes.split(",") if m]
    if not set(options.modes) <= {"sync", "async"} or not options.modes:
        parser.error("--modes takes sync, async or sync,async")
    try:
        for version in options.versions.split(","):
            release(version)
    except UnknownRelease as err:
        parser.error(str(err))
    if (options.kv_connector or options.all_features) and options.modes == ["sync"]:
        parser.error("--kv-connector and --all-features run sync and async together (or --modes async): "
                     "no sync alone")
    if options.kv_connector and options.all_features:
        parser.error("--all-features includes the connector: not both")
    functions = parse_functions(options.functions)
    results = []
    for version in options.versions.split(","):
        if not venv_python(version).exists():
            print(missing_venv_message(version), file=sys.stderr)
            return 2
        result = measure(version, options)
        print("\n".join(report_lines(result, functions)), flush=True)
        results.append(result_json(result, functions))
    if options.json:
        Path(options.json).write_text(json.dumps({"seed": options.seed, "workloads": options.workloads,
                                                  "kv_connector": options.kv_connector,
                                                  "all_features": options.all_features,
                                                  "results": results}, indent=1))
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


if __name__ == "__main__":
    sys.exit(main())
