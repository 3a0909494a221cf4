"""Small term-building helpers shared by the Z3 encoding.

They fold constants as they build (`ite(True, a, b)` is `a`, `pick(xs, 2)`
is `xs[2]`), so the parts of an action that the layout fixes statically cost
no solver terms, and `Builder.let` names a term with a fresh auxiliary
variable at loop-iteration boundaries, so that the schedule's unrolled loops
stay a chain of small definitions instead of one deeply nested term.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import z3

from .z3_state import leaves, rebuild


def is_lit(x: Any) -> bool:
    return z3.is_int_value(x) or z3.is_true(x) or z3.is_false(x)


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
    return None


def _z(x: Any) -> Any:
    return z3.IntVal(x) if isinstance(x, int) and not isinstance(x, bool) else x


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
    terms = [ite(b, z3.IntVal(1), z3.IntVal(0)) for b in bools]
    terms = [t for t in terms if not (z3.is_int_value(t) and t.as_long() == 0)]
    return z3.IntVal(0) if not terms else terms[0] if len(terms) == 1 else z3.Sum(terms)


def pick(xs: Sequence[Any], i: Any, default: Any = None) -> Any:
    """xs[i] for a symbolic index (out of range: `default`, else the last)."""
    if isinstance(i, int) or z3.is_int_value(i):
        k = i if isinstance(i, int) else i.as_long()
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
            return z3.IntVal(term)
        if z3.is_const(term):           # a variable or a literal: nothing to name
            return term
        self._n += 1
        v = z3.Const(f"{self.prefix}.{name}#{self._n}", term.sort())
        self.defs.append(v == term)
        return v

    def snap(self, x: Any, name: str) -> Any:
        """Name every non-trivial leaf of a symbolic structure."""
        return rebuild(x, (self.let(f"{name}.{p}", v) for p, v in leaves(x)))
