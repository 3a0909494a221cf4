"""spec/actions.py in Z3: `arrive`, `complete_oldest`, `abort` (and `_finish`)
as guard + effect on a symbolic state, given the environment's choices for
the step: which request arrives or is aborted, and for each entry of the
oldest batch how many drafts are accepted, where a stop token falls and how
many drafts the request proposes next.

`complete_oldest` applies the oldest batch's entries one micro-step each,
named with `Builder.snap`, in batch order, exactly as the concrete loop does;
the entries' fates and sampling flags are read from the batch as it was
before the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import z3
from flightcheck.verification.z3.encoding import blocks as zb
from flightcheck.verification.z3.encoding import structured_output as grammar
from flightcheck.verification.z3.encoding.connector import drain_deferred_frees, finish_with_connector, shift_entries
from flightcheck.verification.z3.encoding.drafts import drafts_come_with_output, next_drafts_cap
from flightcheck.verification.z3.encoding.priority import arrive_with_priority
from flightcheck.verification.z3.encoding.reset_pause_state import shift_reset_flags
from flightcheck.verification.z3.encoding.requests import (
    async_at,
    at,
    label_at,
    counters_at,
    empty_table,
    max_tokens,
    prompt_len,
    put_flag,
    req_at,
    with_async,
    with_counters,
    with_req,
)
from flightcheck.verification.z3.encoding.sessions import (
    arrival_fields,
    finish_session,
    resumable,
    shift_session_entries,
    stop_session,
)
from flightcheck.verification.z3.encoding.state import (
    F_ABORTED,
    F_ERROR,
    F_LENGTH,
    F_STOPPED,
    G_WAIT,
    LIVE,
    NEW,
    ORPHANED,
    PAD,
    PARKED,
    PREEMPTED,
    REMOTE_KVS,
    RUNNING,
    SUPERSEDED,
    WAITING,
    Layout,
    SBatch,
    SState,
    pad_entry,
)
from flightcheck.verification.z3.encoding.terms import (
    Builder,
    V,
    clone,
    conj,
    disj,
    div_const,
    eq,
    ite,
    le,
    lt,
    merge,
    neg,
    pick,
    put,
    remove,
    var,
)

ARRIVE, SCHEDULE, COMPLETE, ABORT = range(4)
NO_STOP = -1


@dataclass
class Choices:
    """The environment's choices for one step (fresh variables per step)."""

    act: Any                  # ARRIVE | SCHEDULE | COMPLETE | ABORT
    req: Any                  # the request that arrives or is aborted
    accepted: list            # per entry slot of the oldest batch
    stop_at: list             # NO_STOP or the index of the stop token
    next_drafts: list
    from_block: Any = None    # with a KV connector: the first failed block of `fail_kv_load`


def choices(layout: Layout, tag: str) -> Choices:
    I = var
    return Choices(I(f"act@{tag}"), I(f"req@{tag}"),
                   [I(f"accepted[{j}]@{tag}") for j in range(layout.E)],
                   [I(f"stop_at[{j}]@{tag}") for j in range(layout.E)],
                   [I(f"next_drafts[{j}]@{tag}") for j in range(layout.E)],
                   I(f"from_block@{tag}") if layout.cfg.kv_connector is not None else None)


def is_active(status: Any, kv: bool = False, grammar: bool = False, parked: bool = False) -> Any:
    """spec Status.is_active: WAITING_FOR_REMOTE_KVS too in a frame with a
    connector (`kv`), WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR in one with
    structured output (`grammar`), WAITING_FOR_STREAMING_REQ in one with
    sessions (`parked`). (Each feature's encoding refuses the other two.)"""
    if grammar:
        return disj(eq(status, WAITING), eq(status, RUNNING), eq(status, PREEMPTED), eq(status, G_WAIT))
    if parked:
        return disj(eq(status, WAITING), eq(status, RUNNING), eq(status, PREEMPTED), eq(status, PARKED))
    if kv:
        return disj(eq(status, WAITING), eq(status, RUNNING), eq(status, PREEMPTED), eq(status, REMOTE_KVS))
    return disj(eq(status, WAITING), eq(status, RUNNING), eq(status, PREEMPTED))


def finish(layout: Layout, s: SState, r: Any, status: Any, when: Any = True, is_abort: bool = False) -> SState:
    """_finish: out of every queue, blocks freed, in-flight work superseded
    (with a connector, its table may be held or fenced: connector.py)."""
    if s.kv:
        return finish_with_connector(layout, s, r, status, when)
    keep = is_abort and layout.is_mutant("blocks_not_freed_on_abort")
    q = req_at(s, r)
    st = clone(s)
    if not keep:
        st.pool = zb.free_table(layout, s.pool, q.table, q.table_len)
    st.waiting, st.waiting_len = remove(s.waiting, s.waiting_len, r)
    st.running, st.running_len = remove(s.running, s.running_len, r)
    st.scheduled = put_flag(s.scheduled, r, z3.BoolVal(False))
    for b in st.batches:
        for e in b.entries:
            mine = conj(eq(e.req, r), disj(eq(e.fate, LIVE), eq(e.fate, ORPHANED)))
            e.fate = ite(mine, V(SUPERSEDED), e.fate)
    if keep:
        st = with_req(st, r, status=status, num_computed=V(0), num_drafts=V(0))
    else:
        st = with_req(st, r, status=status, num_computed=V(0), num_drafts=V(0), table_len=V(0),
                      table=empty_table(layout))
    # spec.actions._forget_counters: both callers of _finish drop the counters
    st = with_counters(st, r, in_flight=V(0), stale=V(0), drop=z3.BoolVal(False))
    st = with_async(st, r, placeholders=V(0), countdown=V(0))
    st = finish_session(st, r)
    return merge(when, st, s)


def arrive_guard(layout: Layout, s: SState, ch: Choices) -> Any:
    """r is NEW and the model's prompt for r is one `arrive` accepts."""
    cfg = layout.cfg

    def valid(k: int) -> bool:
        p = layout.model.prompts[k]
        ok = 1 <= p.prompt_len < cfg.max_model_len and p.max_tokens >= 1
        return ok and (not cfg.prefix_caching or len(p.labels) == p.prompt_len // cfg.block_size)

    return conj(le(0, ch.req), lt(ch.req, layout.N), at(layout, s, ch.req, lambda q, k: eq(q.status, NEW)),
                pick([z3.BoolVal(valid(k)) for k in range(layout.N)], ch.req))


def arrive(layout: Layout, s: SState, ch: Choices) -> SState:
    """Request r joins the tail of `waiting`."""
    st = clone(s)
    st.waiting = put(s.waiting, s.waiting_len, ch.req)
    st.waiting_len = s.waiting_len + 1
    if layout.is_mutant("arrival_counter_stale"):
        return arrive_with_priority(layout, s, with_req(st, ch.req, status=V(WAITING), num_computed=V(1),
                                                        **arrival_fields(layout, ch.req)), ch.req)
    st = with_req(st, ch.req, status=V(WAITING), **arrival_fields(layout, ch.req))
    st = grammar.arrive_structured(layout, st, ch.req) if s.grammar else st
    return arrive_with_priority(layout, s, st, ch.req)      # FCFS: unchanged


def abort_guard(layout: Layout, s: SState, ch: Choices) -> Any:
    if not layout.model.allow_abort:
        return z3.BoolVal(False)
    return conj(le(0, ch.req), lt(ch.req, layout.N), at(layout, s, ch.req, lambda q, k: is_active(q.status, bool(s.kv), bool(s.grammar), bool(s.sess))))


def abort(layout: Layout, s: SState, ch: Choices) -> SState:
    return finish(layout, s, ch.req, V(F_ABORTED), is_abort=True)


def draft_cap(layout: Layout) -> int:
    """The most drafts a Sample may propose: k (one more under the mutant)."""
    return layout.cfg.num_spec_tokens + layout.is_mutant("draft_cap_ignored")


def complete_guard(layout: Layout, s: SState) -> Any:
    """A batch is in flight."""
    guard = lt(0, s.num_batches)
    if layout.is_mutant("complete_refuses_orphans"):
        b0 = s.batches[0]
        orphaned = disj(*[conj(lt(j, b0.length), eq(e.fate, ORPHANED)) for j, e in enumerate(b0.entries)])
        guard = conj(guard, neg(orphaned))
    return guard


@dataclass
class Completion:
    state: SState
    samples_here: list        # per entry slot: the entry takes a Sample
    choice_ok: Any            # the choices are a valid Sample for each such entry
    start: SState = None      # the state the entries are applied to (oldest batch removed)
    micro: list = field(default_factory=list)   # MicroStep per entry


@dataclass(frozen=True)
class Returned:
    """What the model returned for one entry of the completing batch (the
    step's choices for its slot): the drafts accepted, where a stop token
    falls among the tokens (NO_STOP: nowhere), the drafts proposed next."""

    accepted: Any
    stop_at: Any
    next_drafts: Any
    mask: Any = None          # structured output: the FSM position the entry's bitmask was built at


@dataclass(frozen=True)
class OutputRule:
    """Whether an entry's output is applied at all (`here`), and by which
    rule: a live entry's (`is_live`) or an orphaned one's (`is_orphaned`)."""

    here: Any
    is_live: Any
    is_orphaned: Any


def entry_samples(layout: Layout, s: SState, e) -> Any:
    """Whether the model returns tokens for e: decided by the snapshot."""
    if layout.is_mutant("final_chunk_from_live_counter"):
        live_view = at(layout, s, e.req, lambda q, k: q.num_computed >= prompt_len(layout, q, k) + q.num_output)
        return ite(eq(e.fate, LIVE), live_view, e.samples)
    return e.samples


def complete_oldest(layout: Layout, builder: Builder, s: SState, ch: Choices) -> Completion:
    """The oldest in-flight batch returns; its entries' outputs are applied in order."""
    b0 = s.batches[0]
    st = clone(s)
    st.batches = [clone(b) for b in s.batches[1:]] + [SBatch(V(0), [pad_entry() for _ in range(layout.E)])]
    st.num_batches = s.num_batches - 1
    if s.kv:        # spec.kv_fence.drain_deferred_frees, before the outputs are applied
        st = shift_entries(layout, drain_deferred_frees(layout, st, lt(0, b0.length)))
    st = shift_session_entries(st)
    if s.rp:        # the oldest batch's reset marks leave with it (reset_pause_state.py)
        st = shift_reset_flags(layout, st)
    if s.grammar:   # the oldest batch's masks go with it (structured_output.py)
        st = grammar.shift_masks(layout, st)
    flags, oks, micro, start = [], [], [], st
    by_name = bool(s.counters)
    for j, e in enumerate(b0.entries):
        valid = lt(j, b0.length)
        if by_name:
            here = builder.let(f"samples{j}", conj(valid, _output_applied(layout, s, e)))
        else:
            here = builder.let(f"samples{j}", conj(valid, neg(eq(e.fate, SUPERSEDED)), entry_samples(layout, s, e)))
        flags.append(here)
        acc, stop, nd = ch.accepted[j], ch.stop_at[j], ch.next_drafts[j]
        stop_ok = eq(stop, NO_STOP) if not layout.model.allow_stop else \
            disj(eq(stop, NO_STOP), conj(le(0, stop), le(stop, acc)))
        good = conj(le(0, acc), le(acc, e.drafts), stop_ok, le(0, nd),
                    le(nd, next_drafts_cap(layout, draft_cap(layout))))
        canonical = conj(eq(acc, 0), eq(stop, NO_STOP), eq(nd, 0))
        oks.append(ite(conj(eq(ch.act, COMPLETE), here), good, canonical))
        live = conj(valid, eq(e.fate, LIVE))

        returned = Returned(acc, stop, nd, s.grammar[0].masks[0][j] if s.grammar else None)

        def apply_by_fate(st: SState, e=e, live=live, here=here, returned=returned) -> SState:
            rule = OutputRule(here, eq(e.fate, LIVE), eq(e.fate, ORPHANED))
            return _apply_sample(layout, builder, _settle_live(layout, st, e, live), e, returned, rule)

        def apply_by_name(st: SState, e=e, valid=valid, here=here, returned=returned) -> SState:
            return _apply_by_name(layout, builder, st, e, valid, here, returned)

        st = builder.step(st, apply_by_name if by_name else apply_by_fate, f"entry{j}", micro)
    if s.grammar:   # spec.actions.after_output: failed grammars finish with FINISHED_ERROR
        st = builder.snap(grammar.after_output(layout, st, finish), "after_output")
    return Completion(st, flags, conj(*oks), start, micro)


def _output_applied(layout: Layout, s: SState, e) -> Any:
    """spec.actions._output_applied with unique names: e's request is
    unfinished, e samples, and its output is not stale in drop mode; read on
    the state before the batch."""
    c = counters_at(s, e.req)
    unfinished = at(layout, s, e.req, lambda q, k: is_active(q.status, bool(s.kv), bool(s.grammar), bool(s.sess)))
    return conj(unfinished, entry_samples(layout, s, e), neg(conj(lt(0, c.stale), c.drop)))


def _apply_by_name(layout: Layout, builder: Builder, st: SState, e, valid: Any, here: Any,
                   returned: Returned) -> SState:
    """One entry of spec.actions._complete_by_name (vLLM 0.33): the fate is not
    read. If e's request is unfinished its counters settle (in flight -= n,
    and stale -= n while it has stale output), and a token it returns is
    applied as an orphan's (stale) or as a live one."""
    unfinished = builder.let("unfinished", conj(valid, at(layout, st, e.req,
                                                           lambda q, k: is_active(q.status, bool(st.kv), bool(st.grammar),
                                                                                  bool(st.sess)))))
    c = builder.snap(counters_at(st, e.req), "c")
    stale = builder.let("stale", lt(0, c.stale))
    in_flight = c.in_flight - e.n
    if layout.cfg.rules.in_flight_floor:
        # spec.actions._floor_in_flight (the hardened variant): floored at 0
        in_flight = ite(lt(in_flight, 0), V(0), in_flight)
    settled = with_counters(st, e.req, unfinished, in_flight=in_flight,
                            stale=ite(stale, c.stale - e.n, c.stale))
    return _apply_sample(layout, builder, settled, e, returned, OutputRule(conj(unfinished, here), neg(stale), stale))


def _settle_live(layout: Layout, st: SState, e, live: Any) -> SState:
    """Bookkeeping every live entry gets, whether or not it sampled."""
    cfg = layout.cfg
    if not cfg.continue_prefill:
        st = clone(st)
        st.scheduled = put_flag(st.scheduled, e.req, z3.BoolVal(False), live)
    if layout.is_mutant("advance_at_completion"):
        q = req_at(st, e.req)
        st = with_req(st, e.req, live, num_computed=q.num_computed + e.n)
    return st


def _apply_sample(layout: Layout, builder: Builder, st: SState, e, returned: Returned,
                  rule: OutputRule) -> SState:
    """e's tokens applied to its request where `rule.here`, by the rule of a
    live entry (`rule.is_live`) or an orphaned one (`rule.is_orphaned`): the
    entry's fate in 0.8.x, whether its output is stale under vLLM 0.33."""
    cfg = layout.cfg
    r = e.req
    acc, stop, nd = returned.accepted, returned.stop_at, returned.next_drafts
    here, is_live, is_orphaned = rule.here, rule.is_live, rule.is_orphaned
    q = builder.snap(req_at(st, r), "q")
    plen = builder.let("plen", at(layout, st, r, lambda q_, k: prompt_len(layout, q_, k)))
    cap = builder.let("max_tokens", at(layout, st, r, lambda q_, k: max_tokens(layout, q_, k)))
    subtract = disj(conj(is_live, not layout.is_mutant("rejections_not_subtracted")),
                    conj(is_orphaned, layout.is_mutant("rejections_subtracted_after_reset")))
    num_computed = ite(subtract, q.num_computed - (e.drafts - acc), q.num_computed)
    num_output, finished, status = q.num_output, z3.BoolVal(False), V(PAD)
    appended = acc                      # the tokens appended before a stop (j at the loop's break)
    for j in range(draft_cap(layout) + 1):
        going = conj(le(j, acc), neg(finished))
        num_output = ite(going, num_output + 1, num_output)
        length = disj(plen + num_output >= cfg.max_model_len,
                      conj(num_output >= cap, not layout.is_mutant("no_length_cap")))
        reason = conj(going, disj(length, eq(stop, j)))
        if cfg.rules.stop_tokens_before_length:
            # spec.actions._stop_reason under vLLM 0.33 (`check_stop`): EOS and stop ids first
            status = ite(reason, ite(eq(stop, j), V(F_STOPPED), V(F_LENGTH)), status)
        else:
            status = ite(reason, ite(length, V(F_LENGTH), V(F_STOPPED)), status)
        appended = ite(reason, V(j), appended)
        finished = builder.let(f"finished{j}", disj(finished, reason))
    # a completion brings drafts where the profile says so (spec.drafts.drafts_come_with_output)
    drafts = ite(is_live, nd, q.num_drafts) if drafts_come_with_output(cfg) else q.num_drafts
    applied = with_req(st, r, num_output=num_output, num_computed=num_computed, num_drafts=drafts)
    if st.grammar:      # spec.grammar.advance_fsm: a token the FSM refuses finishes r with FINISHED_ERROR
        applied, refused = grammar.advance_fsm(st, applied, r, num_output - q.num_output, returned.mask)
        finished, status = disj(finished, refused), ite(refused, V(F_ERROR), status)
    if st.asyncs:
        applied = _settle_placeholders(layout, builder, SampleApplied(st, applied, q, e, acc, appended,
                                                                      num_computed, subtract, is_live))
    elif st.counters and cfg.num_spec_tokens:      # vLLM 0.33 sync with drafts
        applied = cache_settled_blocks(layout, builder, SampleApplied(st, applied, q, e, acc, appended,
                                                                      num_computed, subtract, is_live),
                                       applied, z3.BoolVal(False))
    done = finish(layout, applied, r, status)
    if st.sess:         # a session's stop (sessions.stop_session), its kept tokens but the last computed
        trimmed = with_req(applied, r, num_computed=req_at(applied, r).num_computed - ite(is_live, acc - appended, V(0)))
        done = merge(resumable(layout, r), stop_session(layout, builder.snap(trimmed, "trimmed"), r, status, finish),
                     done)
    return merge(here, merge(finished, done, applied), st)


# --- asynchronous scheduling (vllm-0.33-async: `Profile.output_placeholders`) ------


@dataclass(frozen=True)
class SampleApplied:
    """One entry's output applied to its request by `_apply_sample`, for its
    async part: the state `before` and `after` (the output appended), the
    request's snapshot `q` before, the `entry`, the drafts it `accepted`, the
    tokens `appended` before a stop, the counter after (`num_computed`),
    whether rejections were subtracted, and whether the live rule applied."""

    before: SState
    after: SState
    q: Any
    entry: Any
    accepted: Any
    appended: Any
    num_computed: Any
    subtract: Any
    is_live: Any


def _settle_placeholders(layout: Layout, builder: Builder, out: SampleApplied) -> SState:
    """spec.actions._apply_sample's async part on `applied` (st with the
    output appended): the rejected drafts (where rejections are subtracted),
    then the returned tokens (a live output) are taken back from the
    placeholders, each only while they are > 0; a live output of a RUNNING
    request that had placeholders hashes the full blocks of its settled tokens
    (spec.actions._cache_settled_blocks) before a stop frees them."""
    st, applied, q, e, r = out.before, out.after, out.q, out.entry, out.entry.req
    acc, subtract, is_live = out.accepted, out.subtract, out.is_live
    a = builder.snap(async_at(st, r), "ph")
    placeholders = ite(conj(subtract, lt(0, a.placeholders)), a.placeholders - (e.drafts - acc), a.placeholders)
    placeholders = ite(conj(is_live, lt(0, placeholders)), placeholders - (acc + 1), placeholders)
    applied = with_async(applied, r, placeholders=builder.let("placeholders", placeholders))
    return cache_settled_blocks(layout, builder, out, applied, lt(0, a.placeholders))


def cache_settled_blocks(layout: Layout, builder: Builder, out: SampleApplied, applied: SState,
                         had_placeholders: Any) -> SState:
    """spec.actions._cache_settled_blocks where `_apply_sample` calls it: a
    live output of a RUNNING request with placeholders, or with drafts
    configured (vLLM 0.33 sync and async), hashes the full blocks of its
    settled tokens before a stop frees them."""
    st, q, r, acc, is_live = out.before, out.q, out.entry.req, out.accepted, out.is_live
    cfg = layout.cfg
    if not (cfg.rules.cache_settled_blocks_on_output and cfg.prefix_caching):
        return applied
    in_flight = counters_at(st, r).in_flight          # already settled for this output
    settled = builder.let("settled", out.num_computed - (acc - out.appended) - in_flight)
    cause = z3.BoolVal(True) if cfg.num_spec_tokens > 0 else had_placeholders
    hashes = conj(is_live, cause, eq(q.status, RUNNING), le(cfg.block_size, settled))
    labels = [label_at(layout, st, r, i) for i in range(layout.T)]
    pool = zb.cache_labels(layout, st.pool, q.table, q.table_len, labels, div_const(settled, cfg.block_size))
    cached = clone(applied)
    cached.pool = merge(hashes, pool, applied.pool)
    return cached
