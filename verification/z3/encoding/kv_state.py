"""The KV connector's part of a Z3 frame (docs/kv-connector.md, "The model"):
spec State's `kv_holding`, `deferred_frees` and `arrivals`, each request's
`load`, `external` and `held`, and each in-flight entry's `external` and
`blocks`, with `encode`/`decode` for them and their well-formedness.

A frame has this part only when the model configures a connector
(`Config.kv_connector`); every other frame is as it was, so no state count,
proof or cross-check of a model without a connector changes.

Bounded, as every array of the encoding: `deferred_frees` holds at most
`Layout.kv_deferred` freed tables (a model whose reachable states hold
more is caught, not truncated: a step that would append past the capacity
leaves a length that breaks `kv_well_formed`, which every engine checks);
a freed table, like an entry's `blocks`, holds at most T blocks. What a
request is offered (`external_hit`, `load_async`) is its prompt's, fixed
at arrival like its prompt length, so it needs no variable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import z3
from flightcheck.spec import State
from flightcheck.spec.state import Load
from flightcheck.verification.z3.encoding.terms import V, conj, eq, ite, le, lt, var

class NotRepresentable(ValueError):
    """A concrete state this model's encoding cannot hold (other prompts, too
    long a queue); state.py re-exports it, the name every caller uses."""


LOAD: tuple[Load, ...] = (Load.NONE, Load.IN_FLIGHT, Load.FAILED, Load.RECEIVED, Load.DONE)
L_NONE, L_IN_FLIGHT, L_FAILED, L_RECEIVED, L_DONE = range(5)
PAD = -1


def has_kv(layout) -> bool:
    """Whether the model configures a KV connector (the frame has an `SKv`)."""
    return layout.cfg.kv_connector is not None


def kv_deferred_capacity(layout) -> int:
    """How many deferred frees a frame holds: each is a table freed while a
    non-empty batch was in flight, and drains when the last of those
    batches completes, so at most one per request and batch slot."""
    return layout.N * layout.K if layout.cfg.fences_freed_blocks else 0


def tracks_invalid_kv(layout) -> bool:
    """KV7's models (`Config.check_invalid_kv`): `State.invalid_kv` is part of
    a state's identity (spec/kv_invalid.py `InvalidKvState`), so of the frame:
    one Bool per block."""
    return layout.cfg.kv_connector is not None and layout.cfg.check_invalid_kv


def with_kv_identity(layout, state: State) -> State:
    """A decoded state as the explicit search builds it: an `InvalidKvState`
    where KV7 is checked (its `invalid_kv` compared and hashed)."""
    if not tracks_invalid_kv(layout):
        return state
    from flightcheck.spec.kv_invalid import with_invalid_kv_identity
    return with_invalid_kv_identity(state)


def keeps_arrivals(layout) -> bool:
    """vLLM 0.34's load limit orders `waiting` against `async_kv_waiting` by
    arrival (`State.arrivals`, kept only then)."""
    kv = layout.cfg.kv_connector
    return kv is not None and layout.cfg.rules.kv_inflight_load_limit and kv.max_inflight_loads is not None


def refuse_unencoded_connector(model) -> None:
    """The connector features the encoding leaves to the explicit search:
    a model that needs one is refused, never checked by a partial relation."""
    cfg = model.cfg
    kv, rules = cfg.kv_connector, cfg.rules
    if kv is None:
        return
    why = []
    if rules.kv_inflight_load_limit and kv.max_inflight_loads is not None:
        why.append("vLLM 0.34's load limit (max_inflight_loads)")
    loads_async = [p.external_hit > 0 and p.load_async and rules.kv_async_loads for p in model.prompts]
    sync = any(p.external_hit > 0 and rules.kv_sync_hits and not a for p, a in zip(model.prompts, loads_async))
    if sync and kv.load_failure_policy != "recompute":
        why.append("synchronous loads under the fail policy")
    if (sync or cfg.prefix_caching) and (any(loads_async) or kv.producer):     # kv_sync.py's shape
        why.append("asynchronous loads or a producer beside synchronous loads or prefix caching")
    if (sync or cfg.prefix_caching) and cfg.reset_and_pause:     # a reset uncaches outside schedule: not in kv_sync.py
        why.append("synchronous loads or prefix caching beside reset and pause")
    if cfg.num_spec_tokens or rules.output_placeholders:
        why.append("drafts or asynchronous scheduling")
    if not cfg.enable_chunked_prefill or cfg.cache_aware_admission_window:
        why.append("chunked prefill off or the cache-aware order")
    if why:
        raise ValueError(f"model {model.name}: the Z3 encoding of the KV connector leaves out "
                         f"{'; '.join(why)}; the explicit search covers them")


@dataclass
class SKvEntry:
    """An in-flight entry's connector fields: tokens a sync load brings, and
    (only while the fence is in force) the request's table when scheduled."""

    external: Any
    blocks_len: Any
    blocks: list


@dataclass
class SDeferred:
    """One of `deferred_frees`: the non-empty batches it still waits for, and the blocks."""

    left: Any
    length: Any
    blocks: list


@dataclass
class SKv:
    load: list                # LOAD code per request
    external: list            # Request.external per request
    held: list                # Bool per request
    holding: list             # kv_holding, N slots
    holding_len: Any
    arrivals: list            # arrivals, N slots (0.34's load limit only; else PAD)
    arrivals_len: Any
    entries: list             # [K][E] SKvEntry, parallel to the frame's batches
    deferred: list            # SDeferred slots
    deferred_len: Any
    invalid: list = field(default_factory=list)    # Bool per block: State.invalid_kv (KV7's models only)


def kv_frame(layout, tag: str) -> list:
    """[SKv of fresh variables], or [] without a connector."""
    if not has_kv(layout):
        return []
    N, T = layout.N, layout.T

    def ints(name: str, n: int) -> list:
        return [var(f"{name}[{i}]@{tag}") for i in range(n)]

    entries = [[SKvEntry(var(f"kv.b{k}.e{j}.external@{tag}"), var(f"kv.b{k}.e{j}.blocks_len@{tag}"),
                         ints(f"kv.b{k}.e{j}.blocks", T)) for j in range(layout.E)] for k in range(layout.K)]
    deferred = [SDeferred(var(f"kv.deferred{d}.left@{tag}"), var(f"kv.deferred{d}.len@{tag}"),
                          ints(f"kv.deferred{d}.blocks", T)) for d in range(kv_deferred_capacity(layout))]
    return [SKv(ints("kv.load", N), ints("kv.external", N), [z3.Bool(f"kv.held[{r}]@{tag}") for r in range(N)],
                ints("kv.holding", N), var(f"kv.holding_len@{tag}"), ints("kv.arrivals", N),
                var(f"kv.arrivals_len@{tag}"), entries, deferred, var(f"kv.deferred_len@{tag}"),
                [z3.Bool(f"kv.invalid[{b}]@{tag}") for b in range(layout.B)] if tracks_invalid_kv(layout) else [])]


def _padded(xs: tuple, n: int, what: str) -> list:
    if len(xs) > n:
        raise NotRepresentable(f"{what} holds {len(xs)} > {n}")
    return [V(x) for x in xs] + [V(PAD)] * (n - len(xs))


def kv_constant(layout, state: State) -> list:
    """The connector part of a concrete state, as literals ([] without a connector)."""
    if not has_kv(layout):
        pristine = all((q.load, q.external, q.held) == (Load.NONE, 0, False) for q in state.requests) and \
            all(e.external == 0 and not e.blocks for b in state.in_flight for e in b)
        kept_arrivals = state.arrivals and layout.cfg.scheduling_policy != "priority"   # priority_state.py's
        if state.deferred_frees or kept_arrivals or not pristine:     # kv_holding: session_state.py
            raise NotRepresentable("connector state in a model without a connector")
        return []
    if state.arrivals and not keeps_arrivals(layout) and layout.cfg.scheduling_policy != "priority":
        raise NotRepresentable("arrivals kept without the load limit")     # priority: priority_state.py's
    fenced = layout.cfg.fences_freed_blocks
    entries = []
    for k in range(layout.K):
        batch = state.in_flight[k] if k < len(state.in_flight) else ()
        if any(e.blocks for e in batch) and not fenced:
            raise NotRepresentable("an entry records blocks without the fence")
        row = [SKvEntry(V(e.external), V(len(e.blocks)), _padded(e.blocks, layout.T, "an entry's blocks"))
               for e in batch]
        entries.append(row + [pad_kv_entry(layout) for _ in range(layout.E - len(batch))])
    cap = kv_deferred_capacity(layout)
    if len(state.deferred_frees) > cap:
        raise NotRepresentable(f"{len(state.deferred_frees)} deferred frees > {cap}")
    deferred = [SDeferred(V(left), V(len(blocks)), _padded(blocks, layout.T, "a deferred free"))
                for left, blocks in state.deferred_frees]
    deferred += [pad_deferred(layout) for _ in range(cap - len(state.deferred_frees))]
    qs = state.requests
    return [SKv([V(LOAD.index(q.load)) for q in qs], [V(q.external) for q in qs],
                [z3.BoolVal(q.held) for q in qs], _padded(state.kv_holding, layout.N, "kv_holding"),
                V(len(state.kv_holding)), *_arrivals(layout, state),
                entries, deferred, V(len(state.deferred_frees)),
                [z3.BoolVal(b in state.invalid_kv) for b in range(layout.B)] if tracks_invalid_kv(layout) else [])]


def _arrivals(layout, state: State) -> tuple[list, Any]:
    """The arrival order's slots and length: kept here only under the load
    limit (under the priority policy priority_state.py holds it)."""
    arrivals = state.arrivals if keeps_arrivals(layout) else ()
    return _padded(arrivals, layout.N, "arrivals"), V(len(arrivals))


def pad_kv_entry(layout) -> SKvEntry:
    return SKvEntry(V(0), V(0), [V(PAD)] * layout.T)


def pad_deferred(layout) -> SDeferred:
    return SDeferred(V(0), V(0), [V(PAD)] * layout.T)


def kv_offer(layout, r: int, arrived: bool) -> dict:
    """What the connector offers request r (its model prompt's, once arrived;
    nothing before, or without a connector): spec Request's fixed fields."""
    p, rules = layout.model.prompts[r], layout.cfg.rules
    if not arrived or not has_kv(layout) or not layout.cfg.kv_connector.consumer or p.external_hit < 0:
        return dict(external_hit=0, load_async=False)
    hit = p.external_hit if rules.kv_sync_hits else 0       # spec.actions._offer_of_connector
    return dict(external_hit=hit, load_async=p.load_async and hit > 0 and rules.kv_async_loads)


def kv_offer_of(q) -> dict:
    return dict(external_hit=q.external_hit, load_async=q.load_async)


def kv_request_fields(layout, kv: list, r: int, iv, bv) -> dict:
    """Request r's connector fields decoded from a model ({} without a connector)."""
    if not kv:
        return {}
    code = iv(kv[0].load[r])
    if not 0 <= code < len(LOAD):
        raise NotRepresentable(f"r{r} load code {code} out of range")
    return dict(load=LOAD[code], external=iv(kv[0].external[r]), held=bv(kv[0].held[r]))


def kv_entry_fields(kv: list, k: int, j: int, iv) -> dict:
    """Entry (k, j)'s connector fields decoded from a model ({} without a connector)."""
    if not kv:
        return {}
    e = kv[0].entries[k][j]
    return dict(external=iv(e.external), blocks=tuple(iv(b) for b in e.blocks[:iv(e.blocks_len)]))


def kv_state_fields(kv: list, iv, bv=None) -> dict:
    """The State's connector fields decoded from a model ({} without a connector)."""
    if not kv:
        return {}
    s = kv[0]
    deferred = tuple((iv(d.left), tuple(iv(b) for b in d.blocks[:iv(d.length)])) for d in s.deferred[:iv(s.deferred_len)])
    arrivals = tuple(iv(x) for x in s.arrivals[:iv(s.arrivals_len)])
    kept = {"arrivals": arrivals} if arrivals else {}       # under the priority policy priority_state.py's
    if s.invalid:
        kept["invalid_kv"] = frozenset(b for b, x in enumerate(s.invalid) if bv(x))
    return dict(kv_holding=tuple(iv(x) for x in s.holding[:iv(s.holding_len)]), deferred_frees=deferred, **kept)


def kv_well_formed(layout, s) -> Any:
    """Every connector code, index and length in range, every unused slot padded."""
    if not s.kv:
        return z3.BoolVal(True)
    kv, P, out = s.kv[0], V(PAD), []
    for r in range(layout.N):
        out += [le(0, kv.load[r]), lt(kv.load[r], len(LOAD)), le(0, kv.external[r])]
    for xs, n in ((kv.holding, kv.holding_len), (kv.arrivals, kv.arrivals_len)):
        out += [le(0, n), le(n, layout.N)]
        out += [ite(lt(j, n), conj(le(0, x), lt(x, layout.N)), eq(x, P)) for j, x in enumerate(xs)]
    if not keeps_arrivals(layout):
        out.append(eq(kv.arrivals_len, 0))
    for k, (b, row) in enumerate(zip(s.batches, kv.entries)):
        for j, e in enumerate(row):
            used = conj(lt(k, s.num_batches), lt(j, b.length))
            out.append(ite(used, _table_ok(layout, e.blocks_len, e.blocks, le(0, e.external)),
                           conj(eq(e.external, 0), eq(e.blocks_len, 0), *[eq(x, P) for x in e.blocks])))
            if not layout.cfg.fences_freed_blocks:
                out.append(eq(e.blocks_len, 0))
    cap = len(kv.deferred)
    out += [le(0, kv.deferred_len), le(kv.deferred_len, cap)]
    for d, slot in enumerate(kv.deferred):
        out.append(ite(lt(d, kv.deferred_len), _table_ok(layout, slot.length, slot.blocks, le(0, slot.left)),
                       conj(eq(slot.left, 0), eq(slot.length, 0), *[eq(x, P) for x in slot.blocks])))
    return conj(out)


def _table_ok(layout, length: Any, blocks: list, extra: Any) -> Any:
    return conj(extra, le(0, length), le(length, layout.T),
                *[ite(lt(t, length), conj(le(0, x), lt(x, layout.B)), eq(x, V(PAD))) for t, x in enumerate(blocks)])
