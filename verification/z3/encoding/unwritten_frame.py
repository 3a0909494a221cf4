"""KV8's frame part in Z3 (the history variable `State.unwritten_kv`,
`SState.unw`; unwritten.py has its updates in `schedule`,
unwritten_formulas.py KV8 and its auxiliary invariants): what state.py
builds and decodes, apart so that state.py imports nothing that imports
it back."""

from __future__ import annotations

import z3
from flightcheck.spec import State
from flightcheck.spec.kv_unwritten import UnwrittenKvState
from flightcheck.verification.z3.encoding.kv_state import NotRepresentable
from flightcheck.verification.z3.encoding.terms import V, var

TRUE = z3.BoolVal(True)


def has_unwritten(layout) -> bool:
    """Whether the model checks KV8 (the frame has `unw`)."""
    return layout.cfg.check_unwritten_kv


def refuse_unencoded_unwritten(model) -> None:
    """A connector (its uncaches and sync loads) or reset beside KV8 is the
    explicit search's: labels would change outside `schedule`."""
    cfg = model.cfg
    if cfg.check_unwritten_kv and (cfg.kv_connector is not None or cfg.reset_and_pause):
        raise ValueError(f"model {model.name}: the Z3 encoding of KV8 leaves out a KV connector and reset; "
                         "the explicit search covers them")


def unw_frame(layout, tag: str) -> list:
    """[a label variable per block], or []."""
    return [[var(f"unw[{b}]@{tag}") for b in range(layout.B)]] if has_unwritten(layout) else []


def unw_constant(layout, state: State) -> list:
    """`state.unwritten_kv` as a label per block ([] without KV8)."""
    if not has_unwritten(layout):
        return []
    labels = [layout.none_label] * layout.B
    for b, label in state.unwritten_kv:
        if labels[b] != layout.none_label:
            raise NotRepresentable(f"block {b} is unwritten under two labels")
        labels[b] = label
    return [[V(x) for x in labels]]


def unw_state(layout, unw: list, iv, state: State) -> State:
    """`state` with the decoded `unwritten_kv`, as an `UnwrittenKvState`
    (its identity) where the frame has the part; else `state`."""
    if not unw:
        return state
    tracked = object.__new__(UnwrittenKvState)
    tracked.__dict__.update({name: getattr(state, name) for name in state.__dataclass_fields__})
    tracked.__dict__["unwritten_kv"] = frozenset((b, iv(x)) for b, x in enumerate(unw[0])
                                                 if iv(x) != layout.none_label)
    return tracked
