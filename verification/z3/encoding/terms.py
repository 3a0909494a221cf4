"""Small term-building helpers shared by the Z3 encoding, and its arithmetic.

The encoding's numbers are either mathematical integers (Z3 `Int`, for
Spacer, whose arithmetic engines want them) or signed bit-vectors of a width
wide enough for every quantity of the model (the default: unrolled, the
schedule is a combinational circuit, and bit-blasting it for Z3's
incremental SAT solver is much faster than integer case splits). Which one a
term gets is set while it is built, by `arithmetic(width)`; `System` enters
it around everything it builds.

They fold constants as they build (`ite(True, a, b)` is `a`, `pick(xs, 2)`
is `xs[2]`), so the parts of an action that the layout fixes statically cost
no solver terms, and `Builder.let` names a term with a fresh auxiliary
variable at loop-iteration boundaries, so that the schedule's unrolled loops
stay a chain of small definitions instead of one deeply nested term.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

import z3

_WIDTH: list[int | None] = [None]      # stack; None = Int


@contextlib.contextmanager
def arithmetic(width: int | None) -> Iterator[None]:
    """Build terms as `width`-bit signed bit-vectors (None: as Ints)."""
    _WIDTH.append(width)
    try:
        yield
    finally:
        _WIDTH.pop()


def width() -> int | None:
    return _WIDTH[-1]


def num_sort() -> z3.SortRef:
    w = _WIDTH[-1]
    return z3.IntSort() if w is None else z3.BitVecSort(w)


def V(n: int) -> Any:
    """The number n as a literal of the current arithmetic."""
    w = _WIDTH[-1]
    return z3.IntVal(n) if w is None else z3.BitVecVal(n, w)


def var(name: str) -> Any:
    return z3.Const(name, num_sort())


def value_of(x: Any) -> int:
    """A model's value for a number term as a Python int."""
    return x.as_signed_long() if z3.is_bv_value(x) else x.as_long()


def div_const(a: Any, d: int) -> Any:
    """floor(a / d) for a constant d >= 1 (Python's //)."""
    if d == 1:
        return a
    if isinstance(a, z3.BitVecRef):
        if d & (d - 1) == 0:
            return a >> (d.bit_length() - 1)          # arithmetic shift = floor division
        return z3.If(a >= 0, a / d, -((-a + (d - 1)) / d))
    return a / d                                        # Int division is floor division for d > 0


def sum_terms(xs: Iterable[Any]) -> Any:
    xs = list(xs)
    return V(0) if not xs else xs[0] if len(xs) == 1 else z3.Sum(xs)


def is_lit(x: Any) -> bool:
    return z3.is_int_value(x) or z3.is_bv_value(x) or z3.is_true(x) or z3.is_false(x)


def same(a: Any, b: Any) -> bool:
    return a is b or (isinstance(a, z3.AstRef) and isinstance(b, z3.AstRef) and a.eq(b))


def ite(c: Any, a: Any, b: Any) -> Any:
    if z3.is_true(c) or c is True:
        return a
    if z3.is_false(c) or c is False:
        return b
    if same(a, b):
        return a
    return z3.If(c, a, b)


def num(x: Any) -> int | None:
    """The value of an integer literal (Python or Z3), else None."""
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if z3.is_int_value(x):
        return x.as_long()
    if z3.is_bv_value(x):
        return x.as_signed_long()
    return None


def _z(x: Any) -> Any:
    return V(x) if isinstance(x, int) and not isinstance(x, bool) else x


def eq(a: Any, b: Any) -> Any:
    na, nb = num(a), num(b)
    if na is not None and nb is not None:
        return z3.BoolVal(na == nb)
    if same(a, b):
        return z3.BoolVal(True)
    if isinstance(a, z3.BoolRef) and is_lit(a) and isinstance(b, z3.BoolRef) and is_lit(b):
        return z3.BoolVal(a.eq(b))
    return _z(a) == _z(b)


def lt(a: Any, b: Any) -> Any:
    na, nb = num(a), num(b)
    if na is not None and nb is not None:
        return z3.BoolVal(na < nb)
    return _z(a) < _z(b)


def le(a: Any, b: Any) -> Any:
    na, nb = num(a), num(b)
    if na is not None and nb is not None:
        return z3.BoolVal(na <= nb)
    return _z(a) <= _z(b)


def conj(*xs: Any) -> Any:
    items = []
    for x in _flat(xs):
        if z3.is_false(x) or x is False:
            return z3.BoolVal(False)
        if not (z3.is_true(x) or x is True):
            items.append(x)
    return z3.BoolVal(True) if not items else items[0] if len(items) == 1 else z3.And(items)


def disj(*xs: Any) -> Any:
    items = []
    for x in _flat(xs):
        if z3.is_true(x) or x is True:
            return z3.BoolVal(True)
        if not (z3.is_false(x) or x is False):
            items.append(x)
    return z3.BoolVal(False) if not items else items[0] if len(items) == 1 else z3.Or(items)


def neg(x: Any) -> Any:
    if z3.is_true(x):
        return z3.BoolVal(False)
    if z3.is_false(x):
        return z3.BoolVal(True)
    return z3.Not(x)


def _flat(xs: Iterable) -> Iterable:
    for x in xs:
        if isinstance(x, (list, tuple)):
            yield from _flat(x)
        else:
            yield x


def count(bools: Iterable[Any]) -> Any:
    terms = [ite(b, V(1), V(0)) for b in bools]
    return sum_terms(t for t in terms if num(t) != 0)


def pick(xs: Sequence[Any], i: Any, default: Any = None) -> Any:
    """xs[i] for a symbolic index (out of range: `default`, else the last)."""
    k = num(i)
    if k is not None:
        if 0 <= k < len(xs):
            return xs[k]
        return default if default is not None else xs[-1]
    if default is None:
        out, rest = xs[-1], range(len(xs) - 2, -1, -1)
    else:
        out, rest = default, range(len(xs) - 1, -1, -1)
    for k in rest:
        out = ite(eq(i, k), xs[k], out)
    return out


def put(xs: list, i: Any, v: Any, when: Any = True) -> list:
    """xs with xs[i] := v (for a symbolic index), if `when`."""
    return [ite(conj(when, eq(i, k)), v, x) for k, x in enumerate(xs)]


def remove(xs: list, length: Any, r: Any) -> tuple[list, Any]:
    """xs[:length] without r (which occurs at most once), padded with -1 (state.PAD)."""
    seen, out = z3.BoolVal(False), []
    for j in range(len(xs)):
        seen = disj(seen, conj(lt(j, length), eq(xs[j], r)))
        nxt = xs[j + 1] if j + 1 < len(xs) else V(-1)
        out.append(ite(seen, nxt, xs[j]))
    return out, ite(seen, length - 1, length)


def member(x: Any, xs: Sequence[Any], length: Any) -> Any:
    """x occurs among the first `length` slots of xs."""
    return disj(*[conj(lt(k, length), eq(x, xs[k])) for k in range(len(xs))])


def imax(a: Any, b: Any) -> Any:
    return ite(le(b, a), a, b)


def imin(a: Any, b: Any) -> Any:
    return ite(le(a, b), a, b)


def merge(c: Any, a: Any, b: Any) -> Any:
    """Leafwise If(c, a, b) over two symbolic structures of one shape."""
    pairs = zip((v for _, v in leaves(a)), (v for _, v in leaves(b)))
    return rebuild(a, (ite(c, x, y) for x, y in pairs))


class Builder:
    """Collects definitional constraints `aux == term` under one name prefix.

    Every auxiliary variable is a function of the frame (and the step's
    choices) it is built from, so asserting its definition never constrains
    the frame itself."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.defs: list[z3.BoolRef] = []
        self._n = 0

    def let(self, name: str, term: Any) -> Any:
        if isinstance(term, bool):
            return z3.BoolVal(term)
        if isinstance(term, int):
            return V(term)
        if z3.is_const(term):           # a variable or a literal: nothing to name
            return term
        self._n += 1
        v = z3.Const(f"{self.prefix}.{name}#{self._n}", term.sort())
        self.defs.append(v == term)
        return v

    def snap(self, x: Any, name: str) -> Any:
        """Name every non-trivial leaf of a symbolic structure."""
        return rebuild(x, (self.let(f"{name}.{p}", v) for p, v in leaves(x)))

    def step(self, before: Any, fn: Callable[[Any], Any], name: str, record: list["MicroStep"]) -> Any:
        """snap(fn(before)), recorded as a MicroStep with the definitions it added."""
        first = len(self.defs)
        after = self.snap(fn(before), name)
        record.append(MicroStep(name, before, after, self.defs[first:]))
        return after


@dataclass
class MicroStep:
    """One unrolled loop iteration of an action: the structure it works on
    before and after it (both named by `Builder.snap`), and the definitions
    of the auxiliary variables it introduced, so that a proof can reason
    about this one iteration alone (z3.induction.microsteps)."""

    name: str
    before: Any
    after: Any
    defs: list


# --- symbolic structures: dataclasses and lists of terms ---------------------------

def leaves(x: Any, path: str = "") -> Iterator[tuple[str, z3.ExprRef]]:
    """Every Z3 term of a symbolic structure, with a readable path name."""
    if dataclasses.is_dataclass(x):
        for f in dataclasses.fields(x):
            yield from leaves(getattr(x, f.name), f"{path}.{f.name}" if path else f.name)
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from leaves(v, f"{path}[{i}]")
    else:
        yield path, x


def rebuild(template: Any, values: Iterator[Any]) -> Any:
    """A copy of `template` whose leaves are taken, in order, from `values`."""
    if dataclasses.is_dataclass(template):
        return type(template)(**{f.name: rebuild(getattr(template, f.name), values)
                                 for f in dataclasses.fields(template)})
    if isinstance(template, list):
        return [rebuild(v, values) for v in template]
    return next(values)


def clone(x: Any) -> Any:
    """A structural copy (the terms are shared), safe to mutate."""
    return rebuild(x, (v for _, v in leaves(x)))
