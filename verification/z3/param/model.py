"""A parameterised model of the in-flight batch accounting: any number of
requests, any configuration, at most K batches in flight (K fixed).

This module is the vocabulary; the transition relation (micro-steps) is in
`verification/z3/param/steps.py`, the invariant in `verification/z3/param/invariant.py`, the proof in
`verification/z3/param/proof.py`, the link to the concrete spec in `verification/z3/param/link.py`.

Vocabulary. Requests are an uninterpreted sort `Req` (no bound on how many);
each per-request field is an array `Req -> value`: `status`, `prompt_len`,
`max_tokens`, `num_output`, `num_computed`, `num_drafts`. The in-flight FIFO
is K slots (slot 0 oldest), each slot a per-request map: `fate[r]`
(`absent` when r has no entry in the batch; else live/orphaned/superseded as
in spec/state.py), `start[r]`, `n[r]`, `drafts[r]`, `samples[r]`, plus two
ghosts: `tokens` (the batch's Σ n, so the token budget is a per-batch fact)
and `first` (a request with an entry in the batch: a witness that a launched
batch is not empty). `depth` counts the launched batches; slot `depth`, when
`depth < K`, is the batch under construction. `num_running` is a ghost count
of RUNNING requests. The configuration (budget, max_num_seqs, max_model_len,
k, threshold) is symbolic too: the proof holds for every value `Config`
accepts.

Transitions: one-request micro-steps. `schedule` is split into `preempt(r)`,
`schedule_running(r, n)`, `admit(r, h, n)` (each adds one request's entry to
the open batch and advances its counter at once: it is scheduled once per
batch, so advancing at the add or at the launch gives the same end state)
and `launch()`; `complete_oldest` into `complete_entry(r, ...)` (apply the
oldest batch's entry for r and mark it superseded, i.e. consumed) and
`pop()` (drop the oldest batch once no entry of it is left to apply).
`arrive` and `abort` are single-request already.

What is abstracted away, and why that is sound. The micro-steps may be taken
in any order, interleaved with one another (a completion's entries with a
batch under construction, an abort or a preemption anywhere), by any request
the per-request guards allow, with any token count the guards allow. So the
POLICY is over-approximated: the running loop's order and skips, FCFS
admission and head-of-line blocking, "no admission in a step that
preempted", the choice of `running[-1]` as victim and the clipping to
exactly min(...) are all replaced by "any choice within the guards". The
guards kept are those of spec/schedule.py: pipeline room (`depth < K`),
`num_new_tokens > 0` (decode gating), the token budget (ghost `tokens`), the
long-prefill threshold, `max_model_len`, `max_num_seqs` at admission (ghost
`num_running`), one entry per request per batch, a prefix hit below the
known tokens. The KV BLOCK POOL is abstracted away entirely: whether an
allocation succeeds is an environment choice (any admission may be refused,
any running request may be preempted at any time), and a prefix hit is any h
with 0 <= h < num_tokens. Token ids, block labels and block size vanish with
the pool. The environment's choices at completion (drafts accepted, where a
stop token falls, drafts proposed next) are free within their ranges, and
check_stop's order (length first) is kept.

The argument, and which parts are proved for every number of requests:
(1) map(initial spec state) = Init            — checked (z3.param.link);
(2) every spec step s → s' is a sequence of micro-steps map(s) →* map(s')
                                              — by construction (each
    micro-step transcribes one request's part of a spec action, and the
    ghosts change by exactly what the step changes), checked exhaustively on
    five small models (N = 2, 3; K = 2, 3; both policies), not proved for all N;
(3) Init ⇒ Inv and Inv ∧ micro-step ⇒ Inv'  — PROVED by Z3 for any |Req|
    and any configuration, for the fixed K (z3.param.proof);
(4) Inv's S-conjuncts on map(s) imply the spec's predicates on s
                                              — by construction (per-request
    transcriptions), checked on the states of the spec's mutants.
Hence the spec's S1, S2, S3, S5, S6, S7, S8, the budget/threshold/max_num_seqs
part of S10, S11 (depth, no empty batch) and L1 hold in every reachable state
for any number of requests — and, since only the guards were used, for any
scheduling policy that obeys them, the one-batch-per-request policy included
(the link holds on its model too).

Not covered, because they need what is abstracted: S9 (KV ownership), the
parts of S10 about queues (running/waiting match the statuses) and every
pool-dependent policy decision, L2 (deadlock freedom needs the policy and the
pool), L3 and liveness proper, the one-batch policy's `scheduled_ids`
clauses (S11's in-flight set, L1's "in scheduled_ids ⇒ live entry"), the
transition properties (S4, S7's fate ageing, S12), and the trace checker's
option of dropping an orphaned entry's tokens.

Every formula is written once against `Ops`, which either builds Z3 terms
(`Symbolic`: for the proofs, or over a finite enumerated `Req` for the link)
or computes Python values on a concrete interpretation (`Concrete`: the link
evaluates the very same definitions on mapped spec states).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import z3

STATUSES = ("NEW", "WAITING", "RUNNING", "PREEMPTED",
            "FINISHED_STOPPED", "FINISHED_LENGTH", "FINISHED_ABORTED")
ACTIVE = ("WAITING", "RUNNING", "PREEMPTED")
FATES = ("absent", "live", "orphaned", "superseded")
CONTINUE, LENGTH, STOPPED = 0, 1, 2          # complete_entry's outcome parameter

# The mutants (verification/mutants) that have a switch here (negative controls).
PARAM_MUTANTS = ("advance_at_completion", "decode_while_token_in_flight", "rejections_not_subtracted",
                 "preempt_keeps_counter", "orphan_kept_after_reschedule")

REQ = z3.DeclareSort("Req")
STATUS_SORT, _STATUS_CONSTS = z3.EnumSort("PStatus", STATUSES)
FATE_SORT, _FATE_CONSTS = z3.EnumSort("PFate", FATES)
Formula = Any

_FINITE_REQ_SORTS: dict[int, tuple[z3.SortRef, list[Any]]] = {}


def finite_req_sort(num_requests: int) -> tuple[z3.SortRef, list[Any]]:
    """Req interpreted as exactly `num_requests` elements (an enumerated sort,
    declared once per size: Z3 refuses a second declaration of a name)."""
    if num_requests not in _FINITE_REQ_SORTS:
        _FINITE_REQ_SORTS[num_requests] = z3.EnumSort(f"Req{num_requests}",
                                                      [f"req{i}" for i in range(num_requests)])
    return _FINITE_REQ_SORTS[num_requests]


class Symbolic:
    """Z3 terms. `domain`: the elements of a finite enumerated Req sort (the
    link's finite models); None for the uninterpreted sort (the proofs)."""

    def __init__(self, req_sort: z3.SortRef = REQ, domain: list[Any] | None = None) -> None:
        self.req_sort, self.domain = req_sort, domain
        self._status = dict(zip(STATUSES, _STATUS_CONSTS))
        self._fate = dict(zip(FATES, _FATE_CONSTS))

    def status(self, name: str) -> Any:
        return self._status[name]

    def fate(self, name: str) -> Any:
        return self._fate[name]

    def and_(self, *xs: Formula) -> Formula:
        return z3.And(*xs) if xs else z3.BoolVal(True)

    def or_(self, *xs: Formula) -> Formula:
        return z3.Or(*xs) if xs else z3.BoolVal(False)

    def not_(self, x: Formula) -> Formula:
        return z3.Not(x)

    def implies(self, a: Formula, b: Formula) -> Formula:
        return z3.Implies(a, b)

    def ite(self, c: Formula, a: Any, b: Any) -> Any:
        return z3.If(c, a, b)

    def store(self, array: Any, r: Any, v: Any) -> Any:
        return z3.Store(array, r, v)

    def const_array(self, value: Any) -> Any:
        return z3.K(self.req_sort, value)

    def forall_req(self, body: Callable[[Any], Formula]) -> Formula:
        if self.domain is not None:
            return z3.And([body(c) for c in self.domain])
        r = z3.Const("r", self.req_sort)
        return z3.ForAll([r], body(r))


class Concrete:
    """Python values on a finite interpretation: Req = range(num_requests),
    arrays are tuples, statuses and fates their names."""

    def __init__(self, num_requests: int) -> None:
        self.num_requests = num_requests

    def status(self, name: str) -> str:
        return name

    def fate(self, name: str) -> str:
        return name

    def and_(self, *xs: bool) -> bool:
        return all(xs)

    def or_(self, *xs: bool) -> bool:
        return any(xs)

    def not_(self, x: bool) -> bool:
        return not x

    def implies(self, a: bool, b: bool) -> bool:
        return (not a) or b

    def ite(self, c: bool, a: Any, b: Any) -> Any:
        return a if c else b

    def store(self, array: tuple, r: int, v: Any) -> tuple:
        return array[:r] + (v,) + array[r + 1:]

    def const_array(self, value: Any) -> tuple:
        return (value,) * self.num_requests

    def forall_req(self, body: Callable[[int], bool]) -> bool:
        return all(body(r) for r in range(self.num_requests))


Ops = Symbolic | Concrete


@dataclass(frozen=True)
class ParamConfig:
    """The constants: K is fixed (the number of slots), the rest may be symbolic."""

    K: int
    budget: Any                 # max_num_batched_tokens
    max_num_seqs: Any
    max_model_len: Any
    num_spec_tokens: Any        # k
    threshold: Any              # long_prefill_token_threshold, 0 = off
    nobody: Any                 # a Req: the `first` ghost of a batch nobody has joined yet
    mutant: str | None = None
    # a preempted request keeps its drafts (spec.drafts.drafts_after_preemption):
    # the default profile's, vLLM 0.8.x's `held_drafts_left_uncached`
    drafts_kept_through_preemption: bool = True

    def assumptions(self) -> list[Formula]:
        """What spec/config.py's Config validates."""
        return [self.budget >= 1, self.max_num_seqs >= 1, self.max_model_len >= 1,
                self.num_spec_tokens >= 0, self.threshold >= 0]


@dataclass(frozen=True)
class Slot:
    fate: Any       # Req -> Fate
    start: Any      # Req -> Int
    n: Any          # Req -> Int
    drafts: Any     # Req -> Int
    samples: Any    # Req -> Bool
    tokens: Any     # ghost: Σ n over the batch
    first: Any      # ghost: a Req with an entry (meaningful once something joined)


@dataclass(frozen=True)
class ParamState:
    status: Any
    prompt_len: Any
    max_tokens: Any
    num_output: Any
    num_computed: Any
    num_drafts: Any
    slots: tuple[Slot, ...]
    depth: Any           # launched batches; slot `depth` is the open one
    num_running: Any     # ghost: how many requests are RUNNING

    def num_tokens(self, r: Any) -> Any:
        return self.prompt_len[r] + self.num_output[r]


def replace(x: Any, **changes: Any) -> Any:
    return dataclasses.replace(x, **changes)


def symbolic_config(K: int, mutant: str | None = None, req_sort: z3.SortRef = REQ) -> ParamConfig:
    return ParamConfig(K, z3.Int("budget"), z3.Int("max_num_seqs"), z3.Int("max_model_len"),
                   z3.Int("k"), z3.Int("threshold"), z3.Const("nobody", req_sort), mutant)


def symbolic_state(K: int, tag: str, req_sort: z3.SortRef = REQ) -> ParamState:
    def array(name: str, sort: z3.SortRef) -> Any:
        return z3.Array(f"{name}@{tag}", req_sort, sort)

    ints = {f: array(f, z3.IntSort()) for f in
            ("prompt_len", "max_tokens", "num_output", "num_computed", "num_drafts")}
    slots = tuple(Slot(array(f"fate{i}", FATE_SORT), array(f"start{i}", z3.IntSort()), array(f"n{i}", z3.IntSort()),
                       array(f"drafts{i}", z3.IntSort()), array(f"samples{i}", z3.BoolSort()),
                       z3.Int(f"tokens{i}@{tag}"), z3.Const(f"first{i}@{tag}", req_sort))
                  for i in range(K))
    return ParamState(array("status", STATUS_SORT), slots=slots, depth=z3.Int(f"depth@{tag}"),
                  num_running=z3.Int(f"num_running@{tag}"), **ints)


def empty_slot(ops: Ops, cfg: ParamConfig) -> Slot:
    return Slot(ops.const_array(ops.fate("absent")), ops.const_array(0), ops.const_array(0),
                ops.const_array(0), ops.const_array(False), 0, cfg.nobody)


def initial(ops: Ops, cfg: ParamConfig) -> ParamState:
    """Init: every request NEW with zero fields (spec's Request()), nothing in flight."""
    zero = ops.const_array(0)
    return ParamState(ops.const_array(ops.status("NEW")), zero, zero, zero, zero, zero,
                  tuple(empty_slot(ops, cfg) for _ in range(cfg.K)), 0, 0)


def with_request(ops: Ops, x: ParamState, r: Any, **fields: Any) -> ParamState:
    return replace(x, **{f: ops.store(getattr(x, f), r, v) for f, v in fields.items()})


def with_slot(x: ParamState, i: int, slot: Slot) -> ParamState:
    return replace(x, slots=x.slots[:i] + (slot,) + x.slots[i + 1:])


def is_one_of(ops: Ops, value: Any, names: tuple[str, ...], kind: str = "status") -> Formula:
    make = ops.status if kind == "status" else ops.fate
    return ops.or_(*[value == make(n) for n in names])


def retire(ops: Ops, x: ParamState, r: Any, when: Formula, from_fates: tuple[str, ...], to: str) -> ParamState:
    """If `when`: r's entries in every slot whose fate is in `from_fates` become `to`."""
    slots = []
    for s in x.slots:
        f = s.fate[r]
        hit = ops.and_(when, is_one_of(ops, f, from_fates, "fate"))
        slots.append(replace(s, fate=ops.store(s.fate, r, ops.ite(hit, ops.fate(to), f))))
    return replace(x, slots=tuple(slots))


def finish_if(ops: Ops, x: ParamState, r: Any, when: Formula, status: Any) -> ParamState:
    """spec actions._finish, if `when`: finished, counters reset, in-flight work superseded."""
    was_running = x.status[r] == ops.status("RUNNING")
    x = retire(ops, x, r, when, ("live", "orphaned"), "superseded")
    x = replace(x, num_running=x.num_running - ops.ite(ops.and_(when, was_running), 1, 0))
    return with_request(ops, x, r, status=ops.ite(when, status, x.status[r]),
                        num_computed=ops.ite(when, 0, x.num_computed[r]),
                        num_drafts=ops.ite(when, 0, x.num_drafts[r]))


GuardedUpdate = tuple[Formula, ParamState]      # (guard, post-state)
