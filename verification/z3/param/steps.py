"""The parameterised transition relation: one function per micro-step, its
formula in the docstring (x is the state before, x' after; `a[r ↦ v]` is an
array store; d is the depth before, fixed per query; T(r) = prompt_len[r] +
num_output[r]; C, D, O are num_computed, num_drafts, num_output; L, B, k, θ,
S the configuration). Each returns (guard, post-state); T(x, x') is the
disjunction over the micro-steps and their parameters of guard ∧ x' = post.

Read against spec/schedule.py and spec/actions.py: the effects are the
spec's; only the choice of which request and how many tokens is left free
(verification/z3/param/model.py's docstring says why that over-approximates).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from flightcheck.verification.z3.param.model import (
    CONTINUE,
    LENGTH,
    STOPPED,
    Formula,
    GuardedUpdate,
    Ops,
    ParamConfig,
    ParamState,
    empty_slot,
    finish_if,
    is_one_of,
    replace,
    retire,
    with_request,
    with_slot,
)


def arrive(ops: Ops, x: ParamState, cfg: ParamConfig, d: int, r: Any, prompt_len: Any,
           max_tokens: Any) -> GuardedUpdate:
    """depth = d ∧ status[r] = NEW ∧ 1 ≤ p < L ∧ m ≥ 1
    ⟹ status' = status[r ↦ WAITING], prompt_len' = prompt_len[r ↦ p],
       max_tokens' = max_tokens[r ↦ m], C' = C[r ↦ 0]"""
    guard = ops.and_(x.depth == d, x.status[r] == ops.status("NEW"), 1 <= prompt_len,
                     prompt_len < cfg.max_model_len, max_tokens >= 1)
    return guard, with_request(ops, x, r, status=ops.status("WAITING"), prompt_len=prompt_len,
                               max_tokens=max_tokens, num_computed=0)


def abort(ops: Ops, x: ParamState, cfg: ParamConfig, d: int, r: Any) -> GuardedUpdate:
    """depth = d ∧ status[r] ∈ {WAITING, RUNNING, PREEMPTED} ⟹ finish(r, FINISHED_ABORTED):
    status' = status[r ↦ ABORTED], C' = C[r ↦ 0], D' = D[r ↦ 0], every slot's
    live/orphaned entry of r superseded, num_running' = num_running − [status[r] = RUNNING]"""
    guard = ops.and_(x.depth == d, is_one_of(ops, x.status[r], ("WAITING", "RUNNING", "PREEMPTED")))
    return guard, finish_if(ops, x, r, True, ops.status("FINISHED_ABORTED"))


def preempt(ops: Ops, x: ParamState, cfg: ParamConfig, d: int, r: Any) -> GuardedUpdate:
    """depth = d ∧ status[r] = RUNNING (any running request, at any time: the pool is abstracted)
    ⟹ status' = status[r ↦ PREEMPTED], C' = C[r ↦ 0], D' = D (vLLM 0.8.x) or D[r ↦ 0],
       every slot's live entry of r orphaned, num_running' = num_running − 1"""
    guard = ops.and_(x.depth == d, x.status[r] == ops.status("RUNNING"))
    keep = cfg.mutant == "preempt_keeps_counter"
    x = retire(ops, x, r, True, ("live",), "orphaned")
    x = replace(x, num_running=x.num_running - 1)
    drafts = x.num_drafts[r] if cfg.drafts_kept_through_preemption else 0
    return guard, with_request(ops, x, r, status=ops.status("PREEMPTED"), num_drafts=drafts,
                               num_computed=x.num_computed[r] if keep else 0)


def _joins_open_batch(ops: Ops, x: ParamState, cfg: ParamConfig, d: int, r: Any, n: Any) -> Formula:
    """The guards every add shares: room in the pipeline, r not yet in the
    open batch, n ≥ 1, the budget, the threshold, max_model_len (_clip)."""
    assert d < cfg.K, "no open batch at full depth"
    open_ = x.slots[d]
    return ops.and_(x.depth == d, open_.fate[r] == ops.fate("absent"), n >= 1,
                    open_.tokens + n <= cfg.budget,
                    ops.implies(cfg.threshold > 0, n <= cfg.threshold),
                    n <= cfg.max_model_len - x.num_computed[r])


def _add_entry(ops: Ops, x: ParamState, cfg: ParamConfig, d: int, r: Any, n: Any) -> ParamState:
    """spec schedule._add_entry then _launch's advance, for one request:
    drafts = min(D, max(0, C + n − T)); samples = C + n − drafts ≥ T;
    slot d gets (live, C, n, drafts, samples); D' = samples ? drafts : 0; C' = C + n."""
    open_ = x.slots[d]
    c, t, proposed = x.num_computed[r], x.num_tokens(r), x.num_drafts[r]
    over = c + n - t
    drafts = ops.ite(proposed <= over, proposed, ops.ite(over >= 0, over, 0))
    samples = c + n - drafts >= t
    slot = replace(open_, fate=ops.store(open_.fate, r, ops.fate("live")), start=ops.store(open_.start, r, c),
                   n=ops.store(open_.n, r, n), drafts=ops.store(open_.drafts, r, drafts),
                   samples=ops.store(open_.samples, r, samples), tokens=open_.tokens + n,
                   first=ops.ite(open_.tokens == 0, r, open_.first))
    advance = 0 if cfg.mutant == "advance_at_completion" else n
    x = with_request(ops, x, r, num_drafts=ops.ite(samples, drafts, 0), num_computed=c + advance)
    return with_slot(x, d, slot)


def schedule_running(ops: Ops, x: ParamState, cfg: ParamConfig, d: int, r: Any, n: Any) -> GuardedUpdate:
    """depth = d < K ∧ status[r] = RUNNING ∧ fate_d[r] = absent ∧ 1 ≤ n ≤ T + D − C
    ∧ tokens_d + n ≤ B ∧ (θ > 0 ⇒ n ≤ θ) ∧ n ≤ L − C  ⟹  add_entry(r, n)
    (n ≤ num_new_tokens is the decode gate: nothing is scheduled for a
    request whose known tokens are all in flight)"""
    c, t = x.num_computed[r], x.num_tokens(r)
    gate = n <= t + x.num_drafts[r] - c
    if cfg.mutant == "decode_while_token_in_flight":
        gate = ops.or_(gate, ops.and_(n == 1, c >= t, c < cfg.max_model_len))
    guard = ops.and_(_joins_open_batch(ops, x, cfg, d, r, n), x.status[r] == ops.status("RUNNING"), gate)
    return guard, _add_entry(ops, x, cfg, d, r, n)


def admit(ops: Ops, x: ParamState, cfg: ParamConfig, d: int, r: Any, hit: Any, n: Any) -> GuardedUpdate:
    """depth = d < K ∧ status[r] ∈ {WAITING, PREEMPTED} ∧ num_running < S ∧ fate_d[r] = absent
    ∧ 0 ≤ h ≤ T − 1 ∧ 1 ≤ n ≤ T − h ∧ tokens_d + n ≤ B ∧ (θ > 0 ⇒ n ≤ θ) ∧ n ≤ L − C
    ⟹ (status[r] = PREEMPTED ⇒ r's orphaned entries superseded); status[r] ↦ RUNNING;
       C[r] ↦ h; num_running' = num_running + 1; then add_entry(r, n)
    (h is the prefix hit: any amount below the known tokens, the pool being abstracted)"""
    t = x.num_tokens(r)
    guard = ops.and_(_joins_open_batch(ops, x, cfg, d, r, n),
                     is_one_of(ops, x.status[r], ("WAITING", "PREEMPTED")),
                     x.num_running < cfg.max_num_seqs, 0 <= hit, hit <= t - 1, n <= t - hit)
    if cfg.mutant != "orphan_kept_after_reschedule":
        x = retire(ops, x, r, x.status[r] == ops.status("PREEMPTED"), ("orphaned",), "superseded")
    x = replace(x, num_running=x.num_running + 1)
    x = with_request(ops, x, r, status=ops.status("RUNNING"), num_computed=hit)
    return guard, _add_entry(ops, x, cfg, d, r, n)


def launch(ops: Ops, x: ParamState, cfg: ParamConfig, d: int) -> GuardedUpdate:
    """depth = d < K ∧ fate_d[first_d] ≠ absent (the open batch is not empty) ⟹ depth' = d + 1"""
    assert d < cfg.K
    open_ = x.slots[d]
    guard = ops.and_(x.depth == d, ops.not_(open_.fate[open_.first] == ops.fate("absent")))
    return guard, replace(x, depth=d + 1)


@dataclass(frozen=True)
class EntrySample:
    """The environment's choices for a sampling entry (complete_entry's
    parameters after r): `accepted` drafts accepted, `m` tokens appended
    (check_stop after each: length first, then a stop token), how it ends
    (`outcome`: CONTINUE, LENGTH or STOPPED), `next_drafts` proposed."""

    accepted: Any
    m: Any
    outcome: Any
    next_drafts: Any


def _sample_is_legal(ops: Ops, x: ParamState, cfg: ParamConfig, r: Any, sample: EntrySample) -> Formula:
    """The choices `sample` are ones the model can make for r's entry."""
    accepted, m, outcome, next_drafts = sample.accepted, sample.m, sample.outcome, sample.next_drafts
    o, t, M, L = x.num_output[r], x.num_tokens(r), x.max_tokens[r], cfg.max_model_len
    below_caps = ops.and_(o + m < M, t + m < L)
    length_first_hit = ops.and_(ops.or_(o + m >= M, t + m >= L),
                                ops.or_(m == 1, ops.and_(o + m - 1 < M, t + m - 1 < L)))
    ends = ops.or_(ops.and_(outcome == CONTINUE, m == accepted + 1, below_caps),
                   ops.and_(outcome == LENGTH, length_first_hit),
                   ops.and_(outcome == STOPPED, below_caps))
    cap = cfg.num_spec_tokens
    return ops.and_(0 <= accepted, accepted <= x.slots[0].drafts[r], 1 <= m, m <= accepted + 1, ends,
                    0 <= next_drafts, next_drafts <= cap)


def complete_entry(ops: Ops, x: ParamState, cfg: ParamConfig, d: int, r: Any, sample: EntrySample) -> GuardedUpdate:
    """depth = d ≥ 1 ∧ fate_0[r] ∈ {live, orphaned} ∧ (samples_0[r] ⇒ legal(accepted, m, outcome, nd))
    ⟹ fate_0[r] ↦ superseded (consumed); if samples_0[r]:
         O[r] ↦ O + m; C[r] ↦ C − (fate_0[r] = live ? drafts_0[r] − accepted : 0);
         D[r] ↦ (fate_0[r] = live ? nd : D); and if outcome ≠ CONTINUE, finish(r,
         LENGTH or STOPPED) — spec actions._apply_sample for live and orphaned entries"""
    assert d >= 1
    accepted, m, outcome, next_drafts = sample.accepted, sample.m, sample.outcome, sample.next_drafts
    head = x.slots[0]
    fate = head.fate[r]
    is_live, sampled = fate == ops.fate("live"), head.samples[r]
    guard = ops.and_(x.depth == d, is_one_of(ops, fate, ("live", "orphaned"), "fate"),
                     ops.implies(sampled, _sample_is_legal(ops, x, cfg, r, sample)))
    x = with_slot(x, 0, replace(head, fate=ops.store(head.fate, r, ops.fate("superseded"))))
    c = x.num_computed[r]
    if cfg.mutant == "advance_at_completion":
        c = c + ops.ite(is_live, head.n[r], 0)
    subtract = False if cfg.mutant == "rejections_not_subtracted" else is_live
    x = with_request(ops, x, r,
                     num_computed=c - ops.ite(ops.and_(sampled, subtract), head.drafts[r] - accepted, 0),
                     num_output=x.num_output[r] + ops.ite(sampled, m, 0),
                     num_drafts=ops.ite(ops.and_(sampled, is_live), next_drafts, x.num_drafts[r]))
    ends_here = ops.and_(sampled, ops.not_(outcome == CONTINUE))
    reason = ops.ite(outcome == LENGTH, ops.status("FINISHED_LENGTH"), ops.status("FINISHED_STOPPED"))
    return guard, finish_if(ops, x, r, ends_here, reason)


def pop(ops: Ops, x: ParamState, cfg: ParamConfig, d: int) -> GuardedUpdate:
    """depth = d ≥ 1 ∧ ∀r. fate_0[r] ∈ {absent, superseded} (every entry applied)
    ⟹ slot_i' = slot_{i+1} (i < K − 1), slot_{K−1}' = empty, depth' = d − 1"""
    assert d >= 1
    head = x.slots[0]
    guard = ops.and_(x.depth == d,
                     ops.forall_req(lambda q: is_one_of(ops, head.fate[q], ("absent", "superseded"), "fate")))
    return guard, replace(x, slots=x.slots[1:] + (empty_slot(ops, cfg),), depth=d - 1)


@dataclass(frozen=True)
class StepKind:
    name: str
    update: Callable[..., GuardedUpdate]
    params: tuple[str, ...]          # "r" is a Req, the others Ints
    needs: str = "any"               # "open": depth < K; "launched": depth ≥ 1

    def depths(self, K: int) -> range:
        return {"any": range(K + 1), "open": range(K), "launched": range(1, K + 1)}[self.needs]


MICRO_STEPS: tuple[StepKind, ...] = (
    StepKind("arrive", arrive, ("r", "prompt_len", "max_tokens")),
    StepKind("abort", abort, ("r",)),
    StepKind("preempt", preempt, ("r",)),
    StepKind("schedule_running", schedule_running, ("r", "n"), "open"),
    StepKind("admit", admit, ("r", "hit", "n"), "open"),
    StepKind("launch", launch, (), "open"),
    # every parameter is its own solver variable; complete_entry takes the sample's as one EntrySample
    StepKind("complete_entry", lambda ops, x, cfg, d, r, *sample: complete_entry(ops, x, cfg, d, r, EntrySample(*sample)),
             ("r", "accepted", "m", "outcome", "next_drafts"), "launched"),
    StepKind("pop", pop, (), "launched"),
)
STEPS_BY_NAME = {k.name: k for k in MICRO_STEPS}
