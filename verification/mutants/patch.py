"""One mechanism for every mutant: an edit of one function, compiled into
its module and swapped in as the function's code object.

An `Edit` names a function (its module and qualified name) and replaces one
piece of its body, `old`, by `new`; both are Python source, an expression
or one or more statements. The module's file is parsed, the edit made on the
syntax tree, the whole module compiled again and the function's code object
(`function.__code__`) swapped for the one compiled: every module that imported
the function by name, every class and subclass that holds it as a method,
sees the edit, and nothing is re-imported. The spec's mutants (spec.py) and
the reference scheduler's (reference.py) are edits; the machine-made mutants
of the mutation score (verification/refinement/mutation.py) are applied the
same way, their one-token change made on the tree directly.

`old` is matched as a syntax tree, not as text: line breaks, comments,
docstrings and spacing do not count, so an edit survives a reformatted
function or a reworded comment and breaks only when the code it edits
changes. It must occur exactly once in the function's body (its signature
and docstring are not searched); otherwise the edit no longer applies and
`MutantNoLongerApplies` says which mutant, which function, what it looked
for and how often it was found. An edit whose result is the function it
started from is refused too: a mutant that changes nothing kills nothing.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import re
import textwrap
import types
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class MutantNoLongerApplies(RuntimeError):
    """An edit of a mutant no longer matches the function it edits."""


@dataclass(frozen=True)
class Edit:
    """In `module`'s function `function` (a qualified name: "_preempt",
    "Scheduler._clip"), the one occurrence of `old` becomes `new`."""

    module: str         # import name: "flightcheck.spec.schedule"
    function: str
    old: str
    new: str

    @property
    def where(self) -> str:
        """The function as a reader names it: "spec.schedule._preempt"."""
        return f"{self.module.removeprefix('flightcheck.')}.{self.function}"


# -- finding the function and the edited piece ------------------------------------

_KEYWORD = re.compile(r"^\w+=(?!=)")          # `num_computed=0`: a keyword argument (PEP 8 spacing)


def _fragment(text: str) -> tuple[str, list[ast.AST]]:
    """`text` parsed: ("keyword", its keyword arguments) when it reads
    `name=value, ...`; ("expression", [it]) when it is one; ("statements",
    them) otherwise. An assignment is written `name = value`, a keyword
    argument `name=value`, as PEP 8 spaces them."""
    source = textwrap.dedent(text).strip()
    if _KEYWORD.match(source):
        call = ast.parse(f"_({source})", mode="eval").body
        if not isinstance(call, ast.Call) or call.args:
            raise ValueError(f"not keyword arguments only: {source}")
        return "keyword", list(call.keywords)
    try:
        return "expression", [ast.parse(source, mode="eval").body]
    except SyntaxError:
        return "statements", list(ast.parse(source).body)


def _function_node(tree: ast.Module, qualname: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    scope: list[ast.stmt] = tree.body
    node: ast.AST | None = None
    for part in qualname.split("."):
        node = next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            return None
        scope = node.body
    return node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def body_without_docstring(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.stmt]:
    """The statements of the function's body, its docstring left out."""
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:]
    return body


def _statement_lists(statements: list[ast.stmt]) -> Iterator[list[ast.stmt]]:
    """`statements` and every statement list nested in them (bodies of if,
    for, while, with, try and its handlers, match cases, nested defs)."""
    yield statements
    for statement in statements:
        for node in ast.walk(statement):
            for _, value in ast.iter_fields(node):
                if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                    yield value


def _dump(node: ast.AST) -> str:
    return ast.dump(node)                   # positions left out: layout does not count


def _node_sites(body: list[ast.stmt], old: ast.AST) -> list[tuple[ast.AST, str, int | None]]:
    """(parent, field, index in a list field or None) of each node in `body`
    equal to `old` (an expression or a keyword argument)."""
    wanted, sites = _dump(old), []
    for statement in body:
        for parent in ast.walk(statement):
            for field, value in ast.iter_fields(parent):
                if isinstance(value, ast.AST) and _dump(value) == wanted:
                    sites.append((parent, field, None))
                elif isinstance(value, list):
                    sites.extend((parent, field, i) for i, item in enumerate(value)
                                 if isinstance(item, ast.AST) and _dump(item) == wanted)
    return sites


def _statement_sites(body: list[ast.stmt], old: list[ast.stmt]) -> list[tuple[list[ast.stmt], int]]:
    """(statement list, index) where the run of statements `old` starts."""
    wanted = [_dump(s) for s in old]
    return [(statements, i) for statements in _statement_lists(body)
            for i in range(len(statements) - len(old) + 1)
            if [_dump(s) for s in statements[i:i + len(old)]] == wanted]


def _placed(fragment: list[ast.AST], at: ast.AST) -> list[ast.AST]:
    """`fragment` moved to the line of `at`, for tracebacks."""
    return [ast.increment_lineno(node, getattr(at, "lineno", 1) - 1) for node in fragment]


def _as_statements(kind: str, nodes: list[ast.AST]) -> list[ast.stmt]:
    return [ast.Expr(node) for node in nodes] if kind == "expression" else nodes   # type: ignore[misc]


def _no_longer_applies(edit: Edit, owner: str, found: int) -> MutantNoLongerApplies:
    return MutantNoLongerApplies(
        f"mutant {owner} no longer applies: {edit.where} holds its old text {found} times, not once "
        f"(compared as code: layout, comments and docstrings do not count); re-derive the edit from "
        f"the function as it is now.\n  old: {edit.old.strip()}")


def _apply_edit(function: ast.FunctionDef | ast.AsyncFunctionDef, edit: Edit, owner: str) -> None:
    """Make `edit` on the function's tree in place (its docstring set aside
    by the caller), or say loudly why not."""
    (old_kind, old), (new_kind, new) = _fragment(edit.old), _fragment(edit.new)
    if old_kind == "keyword" and new_kind == "statements" and new:
        raise ValueError(f"mutant {owner}: a keyword argument of {edit.where} can only become keyword arguments")
    if old_kind == "keyword" or (old_kind == new_kind == "expression"):
        sites = _node_sites(function.body, old[0]) if len(old) == 1 else []
        if len(sites) != 1:
            raise _no_longer_applies(edit, owner, len(sites))
        parent, field, index = sites[0]
        if index is None:
            setattr(parent, field, _placed(new, getattr(parent, field))[0])
        else:
            items = getattr(parent, field)
            items[index:index + 1] = _placed(new, items[index])
        return
    old_statements = _as_statements(old_kind, old)
    runs = _statement_sites(function.body, old_statements) if old_statements else []
    if len(runs) != 1:
        raise _no_longer_applies(edit, owner, len(runs))
    statements, i = runs[0]
    statements[i:i + len(old_statements)] = _placed(_as_statements(new_kind, new), statements[i])
    if not statements and statements is not function.body:
        statements.append(ast.copy_location(ast.Pass(), function))


# -- compiling and swapping -------------------------------------------------------

def module_source(module: types.ModuleType) -> tuple[str, str]:
    """(file name, source) of a loaded module, read from its file now."""
    path = Path(module.__file__ or "")
    return str(path), path.read_text()


def find_code(code: types.CodeType, qualname: str) -> types.CodeType | None:
    """The code object of the function `qualname` among those `code` (a
    compiled module) defines, at any depth."""
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_qualname == qualname:
                return const
            found = find_code(const, qualname)
            if found is not None:
                return found
    return None


def compile_function(tree: ast.Module, filename: str, qualname: str) -> types.CodeType:
    """Compile the module `tree` and return the code of its function `qualname`."""
    ast.fix_missing_locations(tree)
    code = find_code(compile(tree, filename, "exec"), qualname)
    if code is None:
        raise LookupError(f"no code object {qualname} in the edited {filename}")
    return code


def function_object(module: types.ModuleType, qualname: str) -> types.FunctionType:
    """The function object behind `qualname` in `module` (a method's
    function, a static or class method's, a property's getter)."""
    owner: Any = module
    parts = qualname.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part)
    attribute = owner.__dict__[parts[-1]] if isinstance(owner, type) else getattr(owner, parts[-1])
    if isinstance(attribute, (staticmethod, classmethod)):
        attribute = attribute.__func__
    if isinstance(attribute, property):
        attribute = attribute.fget
    return attribute


def edited_code(owner: str, edits: Sequence[Edit]) -> dict[types.FunctionType, types.CodeType]:
    """For each function `edits` edit (several edits of one function are made
    in order), its function object and the code it has with the edits made.
    `owner` names the mutant in a failure."""
    by_function: dict[tuple[str, str], list[Edit]] = {}
    for edit in edits:
        by_function.setdefault((edit.module, edit.function), []).append(edit)
    swaps: dict[types.FunctionType, types.CodeType] = {}
    for (module_name, qualname), own in by_function.items():
        module = importlib.import_module(module_name)
        filename, source = module_source(module)
        tree = ast.parse(source)
        node = _function_node(tree, qualname)
        if node is None:
            raise MutantNoLongerApplies(f"mutant {owner} no longer applies: {own[0].where} "
                                        f"is not a function of {filename} any more")
        before = _dump(node)
        docstring = node.body[:len(node.body) - len(body_without_docstring(node))]
        node.body = body_without_docstring(node)      # edited apart from the docstring
        for edit in own:
            _apply_edit(node, edit, owner)
        node.body = docstring + (node.body or [ast.copy_location(ast.Pass(), node)])
        if _dump(node) == before:
            raise MutantNoLongerApplies(f"mutant {owner}: its edits leave {own[0].where} as it was")
        function = function_object(module, qualname)
        code = compile_function(tree, filename, qualname)
        if len(code.co_freevars) != len(function.__closure__ or ()):
            raise MutantNoLongerApplies(f"mutant {owner}: the edited {own[0].where} reads "
                                        f"variables of an enclosing function the original does not")
        swaps[function] = code
    return swaps


def edited_functions(owner: str, edits: Sequence[Edit]) -> list[types.FunctionType]:
    """Each function `edits` edit, as a function object of its own with the
    edits made (the original untouched), for reading: its signature, its code."""
    made = []
    for function, code in edited_code(owner, edits).items():
        copy = types.FunctionType(code, function.__globals__, function.__name__,
                                  function.__defaults__, function.__closure__)
        copy.__kwdefaults__ = function.__kwdefaults__
        copy.__qualname__ = function.__qualname__
        copy.__doc__ = f"{function.__qualname__} as mutant {owner} edits it"
        made.append(copy)
    return made


@contextlib.contextmanager
def swapped(swaps: Mapping[types.FunctionType, types.CodeType]) -> Iterator[None]:
    """Each function runs its new code for the duration of the block; the
    original code is put back on exit, even on an exception."""
    originals = {function: function.__code__ for function in swaps}
    try:
        for function, code in swaps.items():
            function.__code__ = code
        yield
    finally:
        for function, code in originals.items():
            function.__code__ = code
