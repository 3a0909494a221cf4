"""KV8 in Z3 (spec/kv_unwritten.py): the history variable `State.unwritten_kv`
as a frame part, its updates in `schedule`, KV8 as a step formula of
`schedule`, and its auxiliary invariant under finding 1's fix.

A frame has the part only where a model checks KV8
(`Config.check_unwritten_kv`); every other frame is as it was
(`SState.unw` is []), so no state count, proof or cross-check changes.

* `SState.unw`: one label per block (`Layout.none_label`: not in
  `unwritten_kv`), the label the block was cached with when a priority
  victim was handed back. A block holds at most one pair at a call's
  boundary (`forget_written` drops the pairs whose label the block lost),
  and no action but `schedule` changes a label in the models it is built
  for (`refuse_unencoded_unwritten`: no connector, no reset).
* marked at the victim's choice (priority.py `victim_to_tail`), on the
  blocks spec `cached_past_computed` names (`handed_back_blocks`), under
  either rule; under the fix they are then uncached;
* cleared after the call's launch (`forget_written`): a block an entry of
  the batch writes a token of, or whose label is no longer the pair's.

KV8 (`kv8_no_hit_on_unwritten_kv`) reads the batch `schedule` queued with
the tables after the call and the pairs before it, as spec
`schedule_unwritten_reads`. Under the fix every pair a call adds loses
its block's label in the same call, so `forget_written` drops it:
`KVU1_nothing_unwritten` (every block's pair none at a call's boundary)
is inductive and KV8 follows from it in one step.
"""

from __future__ import annotations

from typing import Any

import z3
from flightcheck.spec import State
from flightcheck.spec.kv_unwritten import UnwrittenKvState
from flightcheck.verification.z3.encoding.kv_state import NotRepresentable
from flightcheck.verification.z3.encoding.terms import V, conj, disj, eq, ite, lt, neg, var

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


def handed_back_blocks(layout, acc, st, victim: Any) -> list:
    """A Bool per block: spec `cached_past_computed` of a victim with an
    entry in the batch so far (spec `hand_back_blocks`' guard): its labelled
    blocks holding a token at or past its num_computed."""
    from flightcheck.verification.z3.encoding.requests import req_at     # (state.py imports this module)
    in_batch = disj(*[conj(lt(j, acc.count), eq(e.req, victim)) for j, e in enumerate(acc.entries)])
    v, bs = req_at(st, victim), layout.cfg.block_size
    return [conj(in_batch, neg(eq(st.pool.label[b], layout.none_label)),
                 disj(*[conj(lt(i, v.table_len), eq(x, b), lt(v.num_computed, V((i + 1) * bs)))
                        for i, x in enumerate(v.table)]))
            for b in range(layout.B)]


def mark(layout, st, marked: list) -> list:
    """`st.unw` with each marked block paired with its label now."""
    return [[ite(marked[b], st.pool.label[b], x) for b, x in enumerate(st.unw[0])]]


def written(layout, st, entries: list, count: Any) -> list:
    """A Bool per block: an entry of the batch (`entries[:count]`, tables in
    `st`) writes a token of it (spec `written`; no connector: external 0)."""
    from flightcheck.verification.z3.encoding.requests import req_at
    bs, out = layout.cfg.block_size, [z3.BoolVal(False)] * layout.B
    for j, e in enumerate(entries):
        q = req_at(st, e.req)
        for i, x in enumerate(q.table):
            hit = conj(lt(j, count), lt(i, q.table_len), lt(e.start, V((i + 1) * bs)), lt(V(i * bs), e.start + e.n))
            out = [disj(out[b], conj(hit, eq(x, b))) for b in range(layout.B)]
    return out


def forget_written(layout, st, acc):
    """spec `forget_written` after the launch (`st`, the tables after the
    call): a pair leaves when the batch writes its block or the block's
    label is no longer its."""
    if not st.unw:
        return st
    gone = written(layout, st, acc.entries, acc.count)
    st.unw = [[ite(disj(gone[b], neg(eq(st.pool.label[b], x))), V(layout.none_label), x)
               for b, x in enumerate(st.unw[0])]]
    return st


def kv8_no_hit_on_unwritten_kv(layout, stp) -> Any:
    """KV8 on a schedule step (spec `schedule_unwritten_reads`): no entry of
    the queued batch has in its computed prefix (its table after the call
    below its start) a block paired before the call with the label it had
    then, unless the batch writes it."""
    from flightcheck.verification.z3.encoding.actions import SCHEDULE
    from flightcheck.verification.z3.encoding.requests import req_at
    before, after, sch = stp.before, stp.after, stp.sched
    if not before.unw:
        return TRUE
    bs = layout.cfg.block_size
    gone = written(layout, after, sch.entries, sch.count)
    unwritten = [conj(neg(eq(x, layout.none_label)), eq(before.pool.label[b], x), neg(gone[b]))
                 for b, x in enumerate(before.unw[0])]
    out = []
    for j, e in enumerate(sch.entries):
        q = req_at(after, e.req)
        for i, x in enumerate(q.table):
            read = conj(lt(j, sch.count), lt(i, q.table_len), lt(V(i * bs), e.start))
            out += [z3.Implies(conj(read, eq(x, b)), neg(unwritten[b])) for b in range(layout.B)]
    return z3.Implies(conj(eq(stp.choices.act, SCHEDULE), sch.result), conj(*out))


def kvu1_nothing_unwritten(layout, s) -> Any:
    """KVU1 (auxiliary, under the fix): no block is paired."""
    return conj(*[eq(x, layout.none_label) for x in s.unw[0]]) if s.unw else TRUE


def kvu2_cached_blocks_computed(layout, s) -> Any:
    """KVU2 (auxiliary): at a call's boundary every labelled block of a
    request's table is within its computed tokens (an allocation caches
    through num_computed + num_new, where launch takes the counter; a hit
    through the hit). So a block a victim's allocation cached in the call is
    held by it alone: no one else could have hit it."""
    bs, out = layout.cfg.block_size, []
    for q in s.reqs:
        for i, x in enumerate(q.table):
            labelled = disj(*[conj(eq(x, b), neg(eq(s.pool.label[b], layout.none_label))) for b in range(layout.B)])
            out.append(z3.Implies(conj(lt(i, q.table_len), labelled), z3.Not(lt(q.num_computed, V((i + 1) * bs)))))
    return conj(*out)


# KV8's step formula and its auxiliary invariants (z3/unwritten_engines.py)
UNWRITTEN_STEP_FORMULAS = {"KV8_no_hit_on_unwritten_kv": kv8_no_hit_on_unwritten_kv}
UNWRITTEN_AUXILIARY = {"KVU1_nothing_unwritten": kvu1_nothing_unwritten,
                       "KVU2_cached_blocks_computed": kvu2_cached_blocks_computed}
