"""The spec's state as Z3 terms: one frame of variables per step, and the
bridges `encode` (a concrete `spec.State` as equalities on a frame) and
`decode` (a Z3 model's frame back to a concrete `spec.State`).

A `Model` fixes the prompts, so a request's prompt length, max_tokens and
labels are constants: only what the scheduler changes is a variable. Every
sequence of the spec (waiting, running, the in-flight FIFO, a batch, a block
table, the free queue) is a fixed array of slots plus a length. Slots past the
length hold a padding value, and every action writes them canonically, so a
concrete state has exactly one representation: that is what lets successor
enumeration block a decoded state, and what makes `decode` a bijection on the
states the transition relation reaches.

Codes: statuses and fates are small integers in the order of `STATUS` and
`FATE`; the fate order is the ageing order (LIVE < ORPHANED < SUPERSEDED), so
"fates only age" is `<=`. A missing label is `Layout.none_label`, chosen
outside every label the model can produce.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import z3
from flightcheck.spec import BlockPool, Config, Entry, Fate, Request, State, Status
from flightcheck.spec.blocks import cdiv
from flightcheck.verification.models import Model
from flightcheck.verification.mutants import mutant as registered_mutant
from flightcheck.verification.z3.encoding.cadence_state import (
    cad_constant,
    cad_frame,
    cad_request_fields,
    cad_state_fields,
    refuse_unencoded_cadence,
)
from flightcheck.verification.z3.encoding.kv_state import (  # noqa: F401  (NotRepresentable re-exported)
    NotRepresentable,
    has_kv,
    kv_constant,
    kv_entry_fields,
    kv_frame,
    kv_offer,
    kv_offer_of,
    kv_request_fields,
    kv_state_fields,
    with_kv_identity,
    refuse_unencoded_connector,
)
from flightcheck.verification.z3.encoding.lora import lora_request_fields, refuse_other_lora, refuse_unencoded_lora
from flightcheck.verification.z3.encoding.priority_state import (
    prio_constant,
    prio_frame,
    prio_request_fields,
    prio_state_fields,
    refuse_unencoded_priority,
)
from flightcheck.verification.z3.encoding.reset_pause_state import (
    refuse_unencoded_reset_pause,
    rp_constant,
    rp_entry_fields,
    rp_frame,
    rp_request_fields,
    rp_state_fields,
)
from flightcheck.verification.z3.encoding.structured_output_state import (
    grammar_constant,
    grammar_entry_fields,
    grammar_frame,
    grammar_request_fields,
    grammar_state_fields,
    has_grammar,
    refuse_unencoded_grammar,
)
from flightcheck.verification.z3.encoding.session_state import (
    has_sessions,
    is_resumable_slot,
    refuse_unencoded_sessions,
    session_constant,
    session_entry_fields,
    session_frame,
    session_req_constant,
    session_req_frame,
    session_request_fields,
    session_state_fields,
)
from flightcheck.verification.z3.encoding.terms import V, leaves, value_of, var
from flightcheck.verification.z3.encoding.unwritten_frame import (refuse_unencoded_unwritten, unw_constant, unw_frame,
                                                            unw_state)

STATUS: tuple[Status, ...] = (Status.NEW, Status.WAITING, Status.RUNNING, Status.PREEMPTED,
                              Status.FINISHED_STOPPED, Status.FINISHED_LENGTH,
                              Status.FINISHED_ABORTED,
                              # only with a KV connector (kv_state.py; `num_statuses`)
                              Status.WAITING_FOR_REMOTE_KVS, Status.FINISHED_ERROR,
                              # only with structured output (structured_output_state.py)
                              Status.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR,
                              # only with streaming sessions (session_state.py)
                              Status.WAITING_FOR_STREAMING_REQ)
NEW, WAITING, RUNNING, PREEMPTED, F_STOPPED, F_LENGTH, F_ABORTED, REMOTE_KVS, F_ERROR, G_WAIT, PARKED = range(11)
FATE: tuple[Fate, ...] = (Fate.LIVE, Fate.ORPHANED, Fate.SUPERSEDED)
LIVE, ORPHANED, SUPERSEDED = range(3)
PAD = -1          # unused slot of a block, request or queue array


@dataclass(frozen=True)
class Layout:
    """The sizes of every array, derived from a `Model`."""

    model: Model
    N: int            # requests
    K: int            # in-flight batch slots (the queue depth D: K pipeline stages, K + 1 under async)
    E: int            # entries per batch
    B: int            # blocks in the pool
    T: int            # block-table slots per request
    none_label: int
    content: tuple[tuple[int, ...], ...]   # content label of (r, block i) once r has arrived
    width: int | None                      # bits of the signed bit-vectors; None: Int
    distinct_labels: bool                  # no prompt repeats a block label

    @property
    def cfg(self) -> Config:
        return self.model.cfg

    def is_mutant(self, name: str) -> bool:
        """Whether the model checks mutant `name` (a name in verification/mutants)."""
        return registered_mutant(name).name == self.model.mutant

    @staticmethod
    def of(model: Model, bitvectors: bool = True) -> "Layout":
        cfg, n = model.cfg, model.num_requests
        # Every entry schedules >= 1 token, charged to the budget, and a batch
        # holds a request once: min(N, budget) entries, unless the budget mutant.
        e = n if model.mutant == "budget_ignored" else min(n, cfg.max_num_batched_tokens)
        t = cdiv(cfg.max_model_len, cfg.block_size)   # a table covers < max_model_len tokens
        content = tuple(tuple(_content_label(model, r, i) for i in range(t)) for r in range(n))
        used = {lab for row in content for lab in row} | {lab for p in model.prompts for lab in p.labels}
        none = min(used | {0}) - 1
        # Every quantity of a reachable state is bounded by these (a batch's
        # token sum by E * max_model_len); four times the bound leaves room for
        # the intermediate sums and differences the actions form.
        bound = max(cfg.max_model_len + cfg.num_spec_tokens, e * cfg.max_model_len, cfg.num_blocks, n, t,
                    cfg.max_num_batched_tokens, -none, *(abs(x) for x in used),
                    *(p.max_tokens for p in model.prompts))
        if cfg.rules.stale_output_counters:
            _refuse_name_reuse(model)
            bound = max(bound, cfg.queue_depth * cfg.max_model_len)   # a request's tokens in flight
        _refuse_admission_knobs(model)
        refuse_unencoded_connector(model)
        refuse_unencoded_sessions(model)
        refuse_unencoded_priority(model)
        refuse_unencoded_unwritten(model)
        refuse_unencoded_reset_pause(model)
        refuse_unencoded_grammar(model)
        refuse_unencoded_cadence(model)
        refuse_unencoded_lora(model)
        width = max(8, (4 * bound).bit_length() + 1) if bitvectors else None
        distinct = all(len(set(p.labels)) == len(p.labels) for p in model.prompts)
        if cfg.rules.output_placeholders:
            # a request's placeholders: 1 + drafts per batch slot at most
            bound = max(bound, cfg.queue_depth * (1 + cfg.num_spec_tokens), cfg.stagger)
        # The in-flight slots are the batch queue's depth D (K, or K + 1 under
        # async scheduling: `Config.queue_depth`).
        return Layout(model, n, cfg.queue_depth, e, cfg.num_blocks, t, none, content, width, distinct)

    def prompt_len(self, r: int) -> int:
        return self.model.prompts[r].prompt_len

    def max_tokens(self, r: int) -> int:
        return self.model.prompts[r].max_tokens


def _refuse_name_reuse(model: Model) -> None:
    """The encoding takes names to be unique (a request's name is its slot, so
    it needs no variable): name reuse is the explicit search's to explore."""
    if model.cfg.allow_name_reuse:
        raise ValueError(f"model {model.name}: the Z3 encoding requires unique request names "
                         "(allow_name_reuse=False); the explicit search explores name reuse")


def _refuse_admission_knobs(model: Model) -> None:
    """The encoding admits as vLLM does with chunked prefill on, in FCFS
    order: chunked prefill off (vLLM 0.33, 0.34) and 0.34's cache-aware
    reorder, where the profile has them, are the explicit search's (the
    prefill cadence, the LoRA cap and prompt logprobs are encoded:
    cadence_state.py, lora.py)."""
    cfg, rules = model.cfg, model.cfg.rules
    unchunked = not cfg.enable_chunked_prefill and (rules.unchunked_prefill_stops_admission
                                                    or rules.threshold_needs_chunked_prefill)
    reordered = cfg.cache_aware_admission_window > 0 and rules.cache_aware_admission and cfg.prefix_caching
    if unchunked or reordered:
        raise ValueError(f"model {model.name}: the Z3 encoding admits with chunked prefill on, in FCFS "
                         "order; the explicit search explores chunked prefill off and the cache-aware reorder")


def num_statuses(layout: Layout) -> int:
    """The status codes a frame may hold: REMOTE_KVS and F_ERROR only with a
    connector; F_ERROR and G_WAIT with structured output (REMOTE_KVS, code 7,
    is then in range but never reached); PARKED only with sessions (whose
    frames hold no connector or grammar code: session_state.session_well_formed)."""
    if has_sessions(layout):
        return PARKED + 1
    if has_grammar(layout):
        return G_WAIT + 1
    return F_ERROR + 1 if has_kv(layout) else F_ABORTED + 1


def has_counters(layout: Layout) -> bool:
    """Whether the frame carries vLLM 0.33's stale-output counters (`SCounters`)."""
    return layout.cfg.rules.stale_output_counters


def has_placeholders(layout: Layout) -> bool:
    """Whether the frame carries async scheduling's per-request placeholders
    and decode countdown (`SAsync`; `Profile.output_placeholders`)."""
    return layout.cfg.rules.output_placeholders


def _content_label(model: Model, r: int, i: int) -> int:
    """spec.state.content_label for request r after its arrival."""
    p, bs = model.prompts[r], model.cfg.block_size
    if (i + 1) * bs <= p.prompt_len and model.cfg.prefix_caching:
        return p.labels[i]
    return -(1 + r + model.num_requests * i)


# --- the symbolic state ------------------------------------------------------------

@dataclass
class SReq:
    status: Any
    num_output: Any
    num_computed: Any
    num_drafts: Any
    table_len: Any
    table: list
    session: list = field(default_factory=list)   # [SSessionReq] with streaming sessions, else []


@dataclass
class SCounters:
    """vLLM 0.33's per-request counters (spec Request.num_in_flight,
    num_stale, drop_stale). Only profiles with stale-output counters have
    them: under 0.8.x the spec keeps them 0/False, and the frame holds none."""

    in_flight: Any
    stale: Any
    drop: Any             # Bool


@dataclass
class SAsync:
    """Asynchronous scheduling's per-request state (spec Request.placeholders,
    decode_countdown): vLLM 0.33's `num_output_placeholders` and the
    schedule() calls left before the request may be scheduled again. Only
    profiles with output placeholders have them; elsewhere the spec keeps
    both 0 and the frame holds none."""

    placeholders: Any
    countdown: Any


@dataclass
class SEntry:
    req: Any
    start: Any
    n: Any
    samples: Any          # Bool
    drafts: Any
    fate: Any


@dataclass
class SBatch:
    length: Any
    entries: list


@dataclass
class SPool:
    ref: list
    label: list
    free: list
    free_len: Any
    # BlockPool.duplicates, as one rank per block: how many of the blocks
    # caching its label were cached before it (0: the copy a hit is served
    # from; 0 too for an unlabelled block). A rank per block instead of the
    # spec's list keeps eviction and caching local updates, not list shifts.
    copy_rank: list


@dataclass
class SState:
    reqs: list
    waiting: list
    waiting_len: Any
    running: list
    running_len: Any
    num_batches: Any
    batches: list
    pool: SPool
    scheduled: list           # Bool per request: one-batch-per-request's in-flight set
    was_preempted: list       # ghost Bool per request: PREEMPTED at some point (sometimes targets)
    counters: list = field(default_factory=list)   # SCounters per request; [] without stale-output counters
    asyncs: list = field(default_factory=list)     # SAsync per request; [] without output placeholders
    kv: list = field(default_factory=list)         # [SKv] with a KV connector (kv_state.py), else []
    sess: list = field(default_factory=list)       # [SSessions] with streaming sessions (session_state.py), else []
    rp: list = field(default_factory=list)         # [SResetPause] with reset and pause (reset_pause_state.py)
    grammar: list = field(default_factory=list)    # [SGrammar] with structured output, else []
    prio: list = field(default_factory=list)       # [SPrio] under the priority policy (priority_state.py), else []
    cad: list = field(default_factory=list)        # [SCadence] with the prefill cadence (cadence_state.py), else []
    unw: list = field(default_factory=list)        # [a label per block] where KV8 is checked (unwritten.py), else []


def frame(layout: Layout, tag: str) -> SState:
    """A fresh frame of named variables `field@tag`."""
    I, Bo = var, z3.Bool

    def ints(name: str, n: int) -> list:
        return [I(f"{name}[{i}]@{tag}") for i in range(n)]

    reqs = [SReq(I(f"status[{r}]@{tag}"), I(f"num_output[{r}]@{tag}"),
                 I(f"num_computed[{r}]@{tag}"), I(f"num_drafts[{r}]@{tag}"),
                 I(f"table_len[{r}]@{tag}"), ints(f"table[{r}]", layout.T), session_req_frame(layout, r, tag))
            for r in range(layout.N)]
    batches = []
    for k in range(layout.K):
        entries = [SEntry(*(I(f"b{k}.e{j}.{f}@{tag}") for f in ("req", "start", "n")),
                          Bo(f"b{k}.e{j}.samples@{tag}"),
                          *(I(f"b{k}.e{j}.{f}@{tag}") for f in ("drafts", "fate")))
                   for j in range(layout.E)]
        batches.append(SBatch(I(f"b{k}.len@{tag}"), entries))
    pool = SPool(ints("ref", layout.B), ints("label", layout.B), ints("free", layout.B), I(f"free_len@{tag}"),
                 ints("copy_rank", layout.B))
    return SState(reqs, ints("waiting", layout.N), I(f"waiting_len@{tag}"),
                  ints("running", layout.N), I(f"running_len@{tag}"), I(f"num_batches@{tag}"),
                  batches, pool, [Bo(f"scheduled[{r}]@{tag}") for r in range(layout.N)],
                  [Bo(f"was_preempted[{r}]@{tag}") for r in range(layout.N)],
                  [SCounters(I(f"in_flight[{r}]@{tag}"), I(f"stale[{r}]@{tag}"), Bo(f"drop_stale[{r}]@{tag}"))
                   for r in range(layout.N)] if has_counters(layout) else [],
                  [SAsync(I(f"placeholders[{r}]@{tag}"), I(f"decode_countdown[{r}]@{tag}"))
                   for r in range(layout.N)] if has_placeholders(layout) else [],
                  kv_frame(layout, tag), session_frame(layout, tag), rp_frame(layout, tag), grammar_frame(layout, tag),
                  prio_frame(layout, tag), cad_frame(layout, tag), unw_frame(layout, tag))


def variables(s: SState, ghost: bool = True) -> list[z3.ExprRef]:
    return [v for name, v in leaves(s) if ghost or not name.startswith("was_preempted")]


# --- concrete <-> symbolic ----------------------------------------------------------

def constant_state(layout: Layout, state: State, was_preempted: tuple[bool, ...] | None = None) -> SState:
    """The concrete `state` as a symbolic state of literals."""
    def padded(xs: tuple, n: int, what: str) -> list:
        if len(xs) > n:
            raise NotRepresentable(f"{what} holds {len(xs)} > {n}")
        return [V(x) for x in xs] + [V(PAD)] * (n - len(xs))

    if len(state.requests) != layout.N or len(state.pool.ref_counts) != layout.B:
        raise NotRepresentable("another number of requests or blocks")
    reqs = [_constant_request(layout, r, q, padded) for r, q in enumerate(state.requests)]
    if len(state.in_flight) > layout.K:
        raise NotRepresentable("too many batches in flight")
    batches = []
    for k in range(layout.K):
        batch = state.in_flight[k] if k < len(state.in_flight) else ()
        if len(batch) > layout.E:
            raise NotRepresentable("too many entries in a batch")
        if any(e.name is not None for e in batch):
            raise NotRepresentable("an entry looked up by a reused name")
        entries = [SEntry(V(e.req), V(e.start), V(e.n), z3.BoolVal(e.samples), V(e.drafts),
                          V(FATE.index(e.fate))) for e in batch]
        entries += [pad_entry() for _ in range(layout.E - len(batch))]
        batches.append(SBatch(V(len(batch)), entries))
    pool = state.pool
    _check_ranks_can_hold(pool)
    labels = [V(layout.none_label if lab is None else lab) for lab in pool.labels]
    spool = SPool([V(c) for c in pool.ref_counts], labels, padded(pool.free_queue, layout.B, "free queue"),
                  V(len(pool.free_queue)), [V(x) for x in copy_ranks(pool)])
    ghost = was_preempted if was_preempted is not None else (False,) * layout.N
    return SState(reqs, padded(state.waiting, layout.N, "waiting"), V(len(state.waiting)),
                  padded(state.running, layout.N, "running"), V(len(state.running)),
                  V(len(state.in_flight)), batches, spool,
                  [z3.BoolVal(r in state.scheduled_ids) for r in range(layout.N)],
                  [z3.BoolVal(g) for g in ghost],
                  [SCounters(V(q.num_in_flight), V(q.num_stale), z3.BoolVal(q.drop_stale)) for q in state.requests]
                  if has_counters(layout) else [],
                  [SAsync(V(q.placeholders), V(q.decode_countdown)) for q in state.requests]
                  if has_placeholders(layout) else [],
                  kv_constant(layout, state), session_constant(layout, state), rp_constant(layout, state),
                  grammar_constant(layout, state), prio_constant(layout, state), cad_constant(layout, state),
                  unw_constant(layout, state))


def _constant_request(layout: Layout, r: int, q: Any, padded: Any) -> "SReq":
    """Request r of a concrete state as literals, refused where the encoding
    cannot hold it (another prompt than the model's, a reused name, counters
    or placeholders its profile lacks)."""
    cfg = layout.cfg
    p = layout.model.prompts[r]
    want = (0, 0, ()) if q.status is Status.NEW else \
        (p.prompt_len, p.max_tokens, p.labels if cfg.prefix_caching else ())
    if has_sessions(layout):        # a session's prompt and max_tokens change by turn: variables
        want = (q.prompt_len, q.max_tokens, want[2])
    if (q.prompt_len, q.max_tokens, q.prompt_labels) != want:
        raise NotRepresentable(f"request {r} has a prompt other than the model's")
    if kv_offer(layout, r, q.status is not Status.NEW) != kv_offer_of(q) and not q.offer_reset:   # rp_constant's
        raise NotRepresentable(f"request {r} is offered other than its model prompt's KV")
    if q.name is not None:
        raise NotRepresentable(f"request {r} arrived under a reused name")
    if not has_counters(layout) and (q.num_in_flight, q.num_stale, q.drop_stale) != (0, 0, False):
        raise NotRepresentable(f"request {r} has stale-output counters under a profile without them")
    if not has_placeholders(layout) and (q.placeholders, q.decode_countdown) != (0, 0):
        raise NotRepresentable(f"request {r} has placeholders under a profile without them")
    refuse_other_lora(layout, r, q)
    return SReq(V(STATUS.index(q.status)), V(q.num_output), V(q.num_computed),
                V(q.num_drafts), V(len(q.block_table)),
                padded(q.block_table, layout.T, f"r{r}'s block table"), session_req_constant(layout, r, q))


def _check_ranks_can_hold(pool: BlockPool) -> None:
    """Copy ranks hold a `duplicates` list that repeats no block, lists only
    labels cached twice or more, in ascending label order. Such a list may
    still miss copies (S9 fails): the missing ones get rank 0 beside the
    first listed copy, so S9's caching clause fails on the ranks too. Any
    other list would be misread, and is refused."""
    dups, labels = pool.duplicates, pool.labels
    listed_labels = [labels[b] for b in dups]
    if (len(set(dups)) != len(dups) or any(lab is None or labels.count(lab) < 2 for lab in listed_labels)
            or listed_labels != sorted(listed_labels)):  # type: ignore[type-var]
        raise NotRepresentable(f"duplicates {dups} repeat a block, list a label cached once or are out of "
                               "label order: copy ranks cannot hold them")


def copy_ranks(pool: BlockPool) -> list[int]:
    """Each block's copy rank: its place among the copies of its label in
    `pool.duplicates` (which lists them in caching order), else 0."""
    ranks, copies_seen = [0] * len(pool.labels), {}
    for b in pool.duplicates:
        label = pool.labels[b]
        ranks[b] = copies_seen.get(label, 0)
        copies_seen[label] = ranks[b] + 1
    return ranks


def duplicates_of(labels: tuple[int | None, ...], ranks: list[int]) -> tuple[int, ...]:
    """`BlockPool.duplicates` from copy ranks: the blocks of every label cached
    twice or more, grouped by ascending label, by rank within a label."""
    copies = {lab: labels.count(lab) for lab in labels if lab is not None}
    listed = [b for b, lab in enumerate(labels) if lab is not None and copies[lab] >= 2]
    return tuple(sorted(listed, key=lambda b: (labels[b], ranks[b])))


def pad_entry() -> SEntry:
    return SEntry(V(PAD), V(0), V(0), z3.BoolVal(False), V(0), V(0))


def equal(a: SState, b: SState, ghost: bool = True) -> list[z3.BoolRef]:
    """Leafwise equalities (the ghost left out unless asked for)."""
    return [x == y for (name, x), (_, y) in zip(leaves(a), leaves(b))
            if ghost or not name.startswith("was_preempted")]


def encode(layout: Layout, state: State, f: SState,
           was_preempted: tuple[bool, ...] | None = None) -> list[z3.BoolRef]:
    """`state` as equalities on frame `f`; the ghost flags only if given."""
    return equal(f, constant_state(layout, state, was_preempted), ghost=was_preempted is not None)


def initial(layout: Layout) -> SState:
    """The initial state: nothing arrived, the whole pool free, no ghost flag."""
    from flightcheck.spec import initial_state
    return constant_state(layout, initial_state(layout.N, layout.B))


def decode(layout: Layout, m: z3.ModelRef, f: SState) -> State:
    """The concrete state frame `f` holds in model `m`."""
    def iv(x) -> int:
        return value_of(m.eval(x, model_completion=True))

    def bv(x) -> bool:
        return z3.is_true(m.eval(x, model_completion=True))

    def code(x, names: tuple, what: str):
        v = iv(x)
        if not 0 <= v < len(names):
            raise NotRepresentable(f"{what} code {v} out of range")
        return names[v]

    cfg = layout.cfg
    reqs = []
    for r, q in enumerate(f.reqs):
        status = code(q.status, STATUS, f"r{r} status")
        p = layout.model.prompts[r]
        fixed = dict(prompt_len=0, max_tokens=0, prompt_labels=()) if status is Status.NEW else \
            dict(prompt_len=p.prompt_len, max_tokens=p.max_tokens,
                 prompt_labels=p.labels if cfg.prefix_caching else ())
        table = tuple(iv(b) for b in q.table[:iv(q.table_len)])
        if f.counters:
            c = f.counters[r]
            fixed.update(num_in_flight=iv(c.in_flight), num_stale=iv(c.stale), drop_stale=bv(c.drop))
        if f.asyncs:
            a = f.asyncs[r]
            fixed.update(placeholders=iv(a.placeholders), decode_countdown=iv(a.countdown))
        fixed.update(kv_offer(layout, r, status is not Status.NEW), **kv_request_fields(layout, f.kv, r, iv, bv),
                     **grammar_request_fields(f.grammar, r, iv), **prio_request_fields(layout, r, status is not Status.NEW),
                     **cad_request_fields(f.cad, r, bv), **lora_request_fields(layout, r, status is not Status.NEW),
                     **rp_request_fields(f.rp, r, bv))
        if q.session:
            fixed.update(session_request_fields(layout, q.session, r, iv),
                         resumable=is_resumable_slot(layout, r) and status is not Status.NEW)
        reqs.append(Request(status=status, num_output=iv(q.num_output), num_computed=iv(q.num_computed),
                            num_drafts=iv(q.num_drafts), block_table=table, **fixed))
    in_flight = []
    for b in f.batches[:iv(f.num_batches)]:
        k = len(in_flight)
        in_flight.append(tuple(Entry(iv(e.req), iv(e.start), iv(e.n), bv(e.samples), iv(e.drafts),
                                     code(e.fate, FATE, "fate"), **kv_entry_fields(f.kv, k, j, iv),
                                     **session_entry_fields(f.sess, k, j, iv),
                                     **rp_entry_fields(f.rp, k, j, bv), **grammar_entry_fields(f.grammar, k, j, iv))
                               for j, e in enumerate(b.entries[:iv(b.length)])))
    labels = tuple(None if iv(x) == layout.none_label else iv(x) for x in f.pool.label)
    pool = BlockPool(tuple(iv(c) for c in f.pool.ref), labels,
                     tuple(iv(b) for b in f.pool.free[:iv(f.pool.free_len)]),
                     duplicates_of(labels, [iv(x) for x in f.pool.copy_rank]))
    return unw_state(layout, f.unw, iv, with_kv_identity(layout, State(requests=tuple(reqs), waiting=tuple(iv(x) for x in f.waiting[:iv(f.waiting_len)]),
                 running=tuple(iv(x) for x in f.running[:iv(f.running_len)]),
                 in_flight=tuple(in_flight), pool=pool,
                 scheduled_ids=frozenset(r for r in range(layout.N) if bv(f.scheduled[r])),
                 **{**kv_state_fields(f.kv, iv, bv), **prio_state_fields(f.prio, iv)},     # priority's arrivals win
                 **session_state_fields(f.sess, iv), **rp_state_fields(f.rp, iv), **grammar_state_fields(f.grammar, bv),
                 **cad_state_fields(f.cad, iv, bv))))


def dump(m: z3.ModelRef, f: SState) -> str:
    """Every variable of a frame with its value (for frames `decode` rejects)."""
    return ", ".join(f"{name}={m.eval(v, model_completion=True)}" for name, v in leaves(f))
