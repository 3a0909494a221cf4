"""Machine-made mutants of the reference, run against the refinement fuzzer.

Each mutant changes one token of one function of a reference module (the
operator set of cosmic-ray and mutmut, cut down: a comparison flipped or made
strict, an arithmetic or bitwise operator swapped, an integer constant
bumped, `and`/`or` swapped, a `not` dropped, `True`/`False` swapped,
`continue`/`break` swapped). A mutant is run in this process: the module is
recompiled with the one change and only the changed function's code object
is swapped in (`function.__code__`), so every class, every subclass
(`TracingScheduler`) and every `from ... import` that already holds the
function sees the mutant, and nothing is re-imported. The compiling and the
swap are the ones the hand-written mutants use (verification/mutants/patch.py).

Why our own operators over `ast` and not mutmut or cosmic-ray: both rewrite
files on disk under a source tree they copy or patch, and this package maps
`flightcheck.reference` onto the top-level `reference/` folder
(pyproject's package-dir), which neither follows without a custom layout;
both then start a test process per mutant, which re-imports Hypothesis and the
spec (about a second) for a fuzz run that kills most mutants in a fraction
of that. In-process code swapping needs neither.

A mutant's key names the file, the function, the operator and which
occurrence of that operator in the function it is: keys survive edits
elsewhere in the file, so the triage in docs/mutation-equivalents.toml stays
attached to the right mutant.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import importlib
import re
import signal
import subprocess
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

from flightcheck.verification.mutants import patch

REPO_ROOT = Path(__file__).resolve().parents[2]
EQUIVALENTS_FILE = REPO_ROOT / "docs" / "mutation-equivalents.toml"

# The files the acceptance figure covers, and the module each is imported as.
TARGETS: dict[str, str] = {
    "reference/scheduler.py": "flightcheck.reference.scheduler",
    "reference/waiting.py": "flightcheck.reference.waiting",      # the waiting loop, once scheduler.py's
    "reference/update.py": "flightcheck.reference.update",
    "reference/kv_cache_manager.py": "flightcheck.reference.kv_cache_manager",
}
# Files that may be mutated on request (--file), outside the figure.
OPTIONAL_TARGETS: dict[str, str] = {
    "reference/completion.py": "flightcheck.reference.completion",
}
MODULES: dict[str, str] = {**TARGETS, **OPTIONAL_TARGETS}

_COMPARISON: dict[type, tuple[type, ...]] = {
    ast.Lt: (ast.LtE, ast.Gt), ast.LtE: (ast.Lt, ast.GtE), ast.Gt: (ast.GtE, ast.Lt),
    ast.GtE: (ast.Gt, ast.LtE), ast.Eq: (ast.NotEq,), ast.NotEq: (ast.Eq,),
    ast.Is: (ast.IsNot,), ast.IsNot: (ast.Is,), ast.In: (ast.NotIn,), ast.NotIn: (ast.In,),
}
_ARITHMETIC: dict[type, tuple[type, ...]] = {
    ast.Add: (ast.Sub, ast.BitOr), ast.Sub: (ast.Add, ast.BitXor), ast.Mult: (ast.Add,),
    ast.FloorDiv: (ast.Mult,), ast.Mod: (ast.FloorDiv,), ast.BitOr: (ast.BitAnd,),
    ast.BitAnd: (ast.BitOr,),
}
_BOOLEAN: dict[type, type] = {ast.And: ast.Or, ast.Or: ast.And}


@dataclass(frozen=True)
class Mutant:
    """One single-token change to one function."""

    key: str            # "scheduler.py::Scheduler._clip::Sub->Add#1"
    path: str           # repository-relative file
    function: str       # qualified name of the top-level function or method
    line: int
    index: int          # the node's position in `ast.walk` of the parsed module
    replacement: str    # the operator (class name) or constant written in its place
    diff: str           # "-  old line\n+  new line"


# -- generating ---------------------------------------------------------------

def _replacements(node: ast.AST) -> list[tuple[str, str, Callable[[ast.AST], None]]]:
    """(from, to, apply) for each mutation of `node` (apply edits a copy in place)."""
    found: list[tuple[str, str, Callable[[ast.AST], None]]] = []
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        for new in _COMPARISON.get(type(node.ops[0]), ()):
            found.append((type(node.ops[0]).__name__, new.__name__,
                          lambda n, new=new: setattr(n, "ops", [new()])))
    elif isinstance(node, (ast.BinOp, ast.AugAssign)):
        for new in _ARITHMETIC.get(type(node.op), ()):
            found.append((type(node.op).__name__, new.__name__,
                          lambda n, new=new: setattr(n, "op", new())))
    elif isinstance(node, ast.BoolOp):
        new = _BOOLEAN[type(node.op)]
        found.append((type(node.op).__name__, new.__name__, lambda n, new=new: setattr(n, "op", new())))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        found.append(("Not", "drop", None))               # node swap: see _apply_to
    elif isinstance(node, ast.Constant) and type(node.value) is bool:
        found.append((str(node.value), str(not node.value),
                      lambda n: setattr(n, "value", not n.value)))
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        found.append((str(node.value), str(node.value + 1),
                      lambda n: setattr(n, "value", n.value + 1)))
    elif isinstance(node, ast.Continue):
        found.append(("continue", "break", None))         # node swap: see _apply_to
    elif isinstance(node, ast.Break):
        found.append(("break", "continue", None))
    return found


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef]]:
    """Top-level functions and the methods of top-level classes, by qualified name."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    yield f"{node.name}.{item.name}", item


def _body_nodes(function: ast.FunctionDef) -> set[int]:
    """ids of the nodes in the function's body, not its signature, annotations
    or docstring (a changed annotation or docstring changes no behaviour)."""
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    ids = {id(node) for statement in body for node in ast.walk(statement)}
    for statement in body:
        for node in ast.walk(statement):
            if isinstance(node, ast.AnnAssign):
                ids.difference_update(id(n) for n in ast.walk(node.annotation))
    return ids


def mutants_of(path: str) -> list[Mutant]:
    """Every mutant of the file at `path` (repository-relative), in source order."""
    source = (REPO_ROOT / path).read_text()
    tree = ast.parse(source)
    lines = source.splitlines()
    in_function: dict[int, str] = {}
    for name, function in _functions(tree):
        for node_id in _body_nodes(function):
            in_function[node_id] = name
    found: list[Mutant] = []
    occurrences: dict[tuple[str, str], int] = {}
    for index, node in enumerate(ast.walk(tree)):
        function = in_function.get(id(node))
        if function is None:
            continue
        for old, new, _ in _replacements(node):
            label = f"{old}->{new}"
            count = occurrences[(function, label)] = occurrences.get((function, label), 0) + 1
            key = f"{Path(path).name}::{function}::{label}#{count}"
            found.append(Mutant(key, path, function, node.lineno, index, new,
                                _diff(lines, node, _mutated(tree, index, new))))
    found.sort(key=lambda m: (m.line, m.key))
    return found


def _diff(lines: list[str], node: ast.AST, mutated: ast.AST) -> str:
    old = lines[node.lineno - 1]
    if node.lineno == node.end_lineno:
        new = old[:node.col_offset] + ast.unparse(mutated) + old[node.end_col_offset:]
        return f"-{old}\n+{new}"
    return f"-{old}\n+  ... {ast.unparse(mutated)} ..."


def _mutated(tree: ast.Module, index: int, replacement: str) -> ast.AST:
    """A copy of the node at `index` with the mutation applied."""
    node = list(ast.walk(tree))[index]
    return _apply_to(copy.deepcopy(node), replacement)


def _apply_to(node: ast.AST, replacement: str) -> ast.AST:
    if isinstance(node, ast.Continue):
        return ast.copy_location(ast.Break(), node)
    if isinstance(node, ast.Break):
        return ast.copy_location(ast.Continue(), node)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return node.operand
    for _, new, apply in _replacements(node):
        if new == replacement:
            apply(node)
            return node
    raise ValueError(f"no mutation {replacement!r} of {ast.dump(node)}")


# -- applying -----------------------------------------------------------------

def _compile_mutant(mutant: Mutant) -> types.CodeType:
    """The mutated function's code object."""
    source = (REPO_ROOT / mutant.path).read_text()
    tree = ast.parse(source)
    nodes = list(ast.walk(tree))
    target = nodes[mutant.index]
    replaced = _apply_to(target, mutant.replacement)
    if replaced is not target:                         # a node swap: splice it in
        for parent in nodes:
            for field, value in ast.iter_fields(parent):
                if value is target:
                    setattr(parent, field, replaced)
                elif isinstance(value, list) and any(v is target for v in value):
                    value[[id(v) for v in value].index(id(target))] = replaced
    try:
        return patch.compile_function(tree, str(REPO_ROOT / mutant.path), mutant.function)
    except LookupError:
        raise LookupError(f"no code object {mutant.function} in the mutated {mutant.path}") from None


def applied(mutant: Mutant) -> contextlib.AbstractContextManager[None]:
    """The mutant in force in this process for the duration of the block
    (the one swap every mutant uses: verification/mutants/patch.py)."""
    module = importlib.import_module(MODULES[mutant.path])
    return patch.swapped({patch.function_object(module, mutant.function): _compile_mutant(mutant)})


# -- a recorded run -------------------------------------------------------------

_RECORD_LINE = re.compile(
    r"^(killed|timeout|survived)\s+(\S+::\S+)(?:\s+seed (\d+), (\d+) steps)?")
_RECORD_SETTINGS = re.compile(r"^# (\d+) steps, seeds (\[[^]]*\]), runs (\[[^]]*\]):")


@dataclass(frozen=True)
class Record:
    """A saved text output of benchmarks/mutation_score.py: its kills and
    timeouts, its survivors, and the runs it made ("2000 steps, seeds [0, 1],
    runs ['default', ...]", from its summary line; None if it has none)."""

    kills: dict[str, tuple[str, int | None, int | None]]
    survivors: set[str]
    settings: str | None


def settings_line(steps: int, seeds: list[int], profiles: tuple[str | None, ...]) -> str:
    """How the summary line names a run's budget, seeds and runs."""
    return f"{steps} steps, seeds {seeds}, runs {[p or 'default' for p in profiles]}"


def read_record(path: Path) -> Record:
    """Read a saved output. A survivor may be taken from it only when it made
    the same runs (see `settings`): a run added since could kill it."""
    kills: dict[str, tuple[str, int | None, int | None]] = {}
    survivors: set[str] = set()
    settings = None
    for line in path.read_text().splitlines():
        match = _RECORD_LINE.match(line)
        if match and match.group(1) == "survived":
            survivors.add(match.group(2))
        elif match:
            seed, steps = match.group(3), match.group(4)
            kills[match.group(2)] = (match.group(1), int(seed) if seed else None,
                                     int(steps) if steps else None)
        found = _RECORD_SETTINGS.match(line)
        if found:
            settings = f"{found.group(1)} steps, seeds {found.group(2)}, runs {found.group(3)}"
    return Record(kills, survivors, settings)


def function_sources(path: str, commit: str | None = None) -> dict[str, str]:
    """Each function's code (qualified name -> `ast.unparse`, comments and
    layout ignored) in the file at `path`, as it is now or at a git commit."""
    if commit is None:
        source = (REPO_ROOT / path).read_text()
    else:
        source = subprocess.run(["git", "-C", str(REPO_ROOT), "show", f"{commit}:{path}"],
                                check=True, capture_output=True, text=True).stdout
    return {name: ast.unparse(function) for name, function in _functions(ast.parse(source))}


def unchanged_functions(commit: str) -> set[tuple[str, str]]:
    """(path, qualified name) of every function of the mutated files whose
    code is the same now as at `commit`."""
    same: set[tuple[str, str]] = set()
    for path in MODULES:
        before = function_sources(path, commit)
        for name, code in function_sources(path).items():
            if before.get(name) == code:
                same.add((path, name))
    return same


# -- triage -------------------------------------------------------------------

@dataclass(frozen=True)
class Triage:
    """docs/mutation-equivalents.toml: mutants that cannot change behaviour
    (key -> reason) and functions outside what the fuzzer is responsible for
    (qualified name -> reason)."""

    equivalent: dict[str, str]
    out_of_scope: dict[str, str]


def read_triage(path: Path = EQUIVALENTS_FILE) -> Triage:
    data = tomllib.loads(path.read_text())
    return Triage(dict(data.get("equivalent", {})), dict(data.get("out_of_scope", {})))


# -- running ------------------------------------------------------------------

class MutantTimedOut(BaseException):
    """A mutant ran past its wall-clock limit (an infinite loop, most often).
    A BaseException, so Hypothesis does not take it for a test failure."""


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    def expire(signum: int, frame: Any) -> None:
        raise MutantTimedOut()
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass(frozen=True)
class MutantResult:
    mutant: Mutant
    status: str                 # killed, timeout, survived, equivalent, out_of_scope
    seed: int | None = None     # the seed that killed it
    steps: int | None = None    # rule steps to the kill
    reason: str | None = None   # the triage's reason, or the first line of the failure

    def to_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {"key": self.mutant.key, "line": self.mutant.line,
                               "status": self.status}
        if self.seed is not None:
            row.update(seed=self.seed, steps=self.steps)
        if self.reason is not None:
            row["reason"] = self.reason
        if self.status == "survived":
            row["diff"] = self.mutant.diff
        return row


def run_mutant(mutant: Mutant, steps: int, seeds: list[int],
               time_limit: float = 60.0,
               profiles: tuple[str | None, ...] = (None,)) -> MutantResult:
    """Fuzz with the mutant in force, seed by seed and, for each seed, run by
    run over `profiles` (None: the default run, which drives every profile
    the fuzzer draws; a name: `fuzz --profile NAME`), until one run kills it."""
    from flightcheck.verification.refinement.fuzz import fuzz
    for seed in seeds:
        for profile in profiles:
            try:
                with applied(mutant), _time_limit(time_limit):
                    result = fuzz(steps, seed, shrink=False, profile=profile)
            except MutantTimedOut:
                return MutantResult(mutant, "timeout", seed, None, f"no answer within {time_limit:.0f} s")
            if result.failed:
                reason = (result.failure or "").strip().splitlines()[-1][:200]
                return MutantResult(mutant, "killed", seed, result.steps_run, reason)
    return MutantResult(mutant, "survived")


def baseline_failures(steps: int, seeds: list[int],
                      profiles: tuple[str | None, ...] = (None,)) -> list[str]:
    """The runs that fail on the reference as it is: a mutant "killed" by a
    run that fails anyway would be a false kill, so a score is only
    meaningful when this is empty."""
    from flightcheck.verification.refinement.fuzz import fuzz
    failures = []
    for seed in seeds:
        for profile in profiles:
            result = fuzz(steps, seed, shrink=False, profile=profile)
            if result.failed:
                failures.append(f"seed {seed}, profile {profile or 'default'}: "
                                + (result.failure or "").strip().splitlines()[-1][:200])
    return failures


def score(results: list[MutantResult]) -> dict[str, Any]:
    """Counts and the score: killed (timeouts included) over non-equivalent,
    in-scope mutants."""
    counts = {s: sum(1 for r in results if r.status == s)
              for s in ("killed", "timeout", "survived", "equivalent", "out_of_scope")}
    judged = counts["killed"] + counts["timeout"] + counts["survived"]
    counts["score"] = round((counts["killed"] + counts["timeout"]) / judged, 4) if judged else None
    return counts
