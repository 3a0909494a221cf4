"""`applied(name)`: the spec with one mutant's edits in force, for the
duration of a `with` block.

Each function the mutant edits keeps its object and runs the edited code
(patch.py: the module recompiled with the edits, the function's `__code__`
swapped), so every module that imported it by name sees the mutant; the
original code is put back on exit, even on an exception. Swaps do not stack:
applying the mutant already applied does nothing (a search that calls
`successors` per state stays cheap), applying a second one on top of it is an
error. A mutant whose edits no longer apply to the spec is refused
(`MutantNoLongerApplies`, naming the mutant and the function): it would test
a bug in code that no longer exists.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import CodeType, FunctionType

from flightcheck.verification.mutants.patch import Edit, MutantNoLongerApplies, edited_code, swapped
from flightcheck.verification.mutants.registry import Mutant, mutant

__all__ = ["MutantNoLongerApplies", "active", "applied"]

_active: str | None = None         # the mutant in force now, if any
# a mutant's edits -> the code they compile to: compiled once per process
_compiled: dict[tuple[str, tuple[Edit, ...]], dict[FunctionType, CodeType]] = {}


def active() -> str | None:
    """The name of the mutant in force now, None for the correct spec."""
    return _active


def applied(name: str | None) -> AbstractContextManager[None]:
    """Run the enclosed block on the spec with mutant `name` (None: the correct spec)."""
    if name is None or name == _active:
        return nullcontext()
    return _swapped(mutant(name))


@contextmanager
def _swapped(m: Mutant) -> Iterator[None]:
    global _active
    if _active is not None:
        raise RuntimeError(f"mutant {_active} is applied; mutant {m.name} cannot go on top of it")
    key = (m.name, m.edits)
    if key not in _compiled:
        _compiled[key] = edited_code(m.name, m.edits)
    _active = m.name
    try:
        with swapped(_compiled[key]):
            yield
    finally:
        _active = None
