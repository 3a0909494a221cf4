"""`applied(name)`: the spec with one mutant swapped in, for the duration of a
`with` block.

Each function the mutant replaces is swapped in its spec module and in every
loaded module that imported it by name (`from flightcheck.spec import
schedule` binds its own name to the function), and put back on exit, even on
an exception. Swaps do not stack: applying the mutant already applied does
nothing (a search that calls `successors` per state stays cheap), applying a
second one on top of it is an error. A mutant whose originals changed since
it was derived is refused (`MutantNoLongerApplies`): it would test a bug in a
function that no longer exists.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import FunctionType, ModuleType

from flightcheck.verification.mutants.registry import ORIGINALS, Mutant, fingerprint, mutant, stale_fingerprints

_active: str | None = None         # the mutant swapped in now, if any
# (mutant, its fingerprints) found to match the spec's source: checked once per process
_still_apply: set[tuple[str, tuple[tuple[str, str], ...]]] = set()


class MutantNoLongerApplies(RuntimeError):
    """A function the mutant replaces has changed since the mutant was derived."""


def no_longer_applies_message(m: Mutant, stale: list[str]) -> str:
    return "; ".join(f"mutant {m.name} no longer applies: spec.{target} changed; re-derive the "
                     f"mutant and update its fingerprint (now {fingerprint(ORIGINALS[target])})"
                     for target in stale)


def active() -> str | None:
    """The name of the mutant swapped in now, None for the correct spec."""
    return _active


def applied(name: str | None) -> AbstractContextManager[None]:
    """Run the enclosed block on the spec with mutant `name` (None: the correct spec)."""
    if name is None or name == _active:
        return nullcontext()
    return _swapped(mutant(name))


def _holders(original: FunctionType, function_name: str) -> list[ModuleType]:
    """Every loaded module whose `function_name` is `original`."""
    return [module for module in list(sys.modules.values())
            if isinstance(module, ModuleType) and vars(module).get(function_name) is original]


@contextmanager
def _swapped(m: Mutant) -> Iterator[None]:
    global _active
    if _active is not None:
        raise RuntimeError(f"mutant {_active} is applied; mutant {m.name} cannot go on top of it")
    checked = (m.name, tuple(sorted(m.fingerprints.items())))
    if checked not in _still_apply:
        stale = stale_fingerprints(m)
        if stale:
            raise MutantNoLongerApplies(no_longer_applies_message(m, stale))
        _still_apply.add(checked)
    swapped: list[tuple[ModuleType, str, FunctionType]] = []
    _active = m.name
    try:
        for target, replacement in m.replaces.items():
            function_name = target.split(".")[1]
            original = ORIGINALS[target]
            for module in _holders(original, function_name):
                setattr(module, function_name, replacement)
                swapped.append((module, function_name, original))
        yield
    finally:
        for module, function_name, original in reversed(swapped):
            setattr(module, function_name, original)
        _active = None
