"""`applied(name)`: the spec with one mutant's edits in force, for the
duration of a `with` block; `reference_applied(name)`: the same for one of
the reference scheduler's mutants (reference.py).

Each function the mutant edits keeps its object and runs the edited code
(patch.py: the module recompiled with the edits, the function's `__code__`
swapped), so every module that imported it by name, and every class and
subclass that holds it as a method, sees the mutant; the original code is put
back on exit, even on an exception. Swaps do not stack: applying the mutant
already applied does nothing (a search that calls `successors` per state
stays cheap), applying a second one on top of it is an error. The spec and
the reference each have their own slot (a fuzz run checks a reference
mutant against the correct spec, and the two sets share names). A mutant
whose edits no longer apply is refused (`MutantNoLongerApplies`, naming the
mutant and the function): it would test a bug in code that no longer exists.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import CodeType, FunctionType
from typing import Protocol

from flightcheck.verification.mutants.patch import Edit, MutantNoLongerApplies, edited_code, swapped
from flightcheck.verification.mutants.reference import reference_mutant
from flightcheck.verification.mutants.registry import mutant

__all__ = ["MutantNoLongerApplies", "active", "active_reference", "applied", "reference_applied"]


class _Patch(Protocol):
    name: str
    edits: tuple[Edit, ...]


class _Slot:
    """The one mutant of a kind (the spec's, the reference's) in force now."""

    def __init__(self, kind: str, lookup: Callable[[str], _Patch]) -> None:
        self.kind, self.lookup = kind, lookup
        self.active: str | None = None
        # a mutant's edits -> the code they compile to: compiled once per process
        self.compiled: dict[tuple[str, tuple[Edit, ...]], dict[FunctionType, CodeType]] = {}

    def applied(self, name: str | None) -> AbstractContextManager[None]:
        if name is None or name == self.active:
            return nullcontext()
        return self._swapped(self.lookup(name))

    @contextmanager
    def _swapped(self, m: _Patch) -> Iterator[None]:
        if self.active is not None:
            raise RuntimeError(f"{self.kind} mutant {self.active} is applied; "
                               f"mutant {m.name} cannot go on top of it")
        key = (m.name, m.edits)
        if key not in self.compiled:
            self.compiled[key] = edited_code(m.name, m.edits)
        self.active = m.name
        try:
            with swapped(self.compiled[key]):
                yield
        finally:
            self.active = None


_SPEC = _Slot("spec", mutant)
_REFERENCE = _Slot("reference", reference_mutant)


def active() -> str | None:
    """The name of the spec mutant in force now, None for the correct spec."""
    return _SPEC.active


def applied(name: str | None) -> AbstractContextManager[None]:
    """Run the enclosed block on the spec with mutant `name` (None: the correct spec)."""
    return _SPEC.applied(name)


def active_reference() -> str | None:
    """The name of the reference mutant in force now, None for the correct reference."""
    return _REFERENCE.active


def reference_applied(name: str | None) -> AbstractContextManager[None]:
    """Run the enclosed block on the reference scheduler with its mutant
    `name` (None: the correct reference): every `Scheduler` (and subclass)
    built or running inside it runs the mutant's edited steps."""
    return _REFERENCE.applied(name)
