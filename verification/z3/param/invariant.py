"""The parameterised invariant: Inv(x) = Global(x) ∧ ∀r: Req. Local(x, r).

Local(x, r) speaks of one request and its entries in the K slots, so after a
micro-step that stores at index r1 the goal ∀r. Local(x', r) needs the
hypothesis only at the goal's witness r0 and at r1: the queries stay small.

Conjuncts named `S<n>.*` / `L1.*` are the spec's properties
(spec/invariants.py), restated per request: with live_i = fate_i[r] = live,
end_i = start_i + n_i, "later live" = live_j for some j > i,

  S1  active ⇒ 0 ≤ C ≤ T + D;  active ∧ ¬running ⇒ C = 0
  S2  O ≤ max(M, 0) ∧ T ≤ L;  active ⇒ O < M ∧ T < L;  present_i ⇒ end_i ≤ L
  S3  live_i ⇒ n_i ≥ 1;  live_i ∧ live_j ∧ no live between ⇒ end_i = start_j;
      live_i ∧ no later live ⇒ end_i = C
  S5  live_i ⇒ end_i − drafts_i ≤ T ∧ n_i > drafts_i ∧ (samples_i ⇔ end_i − drafts_i = T)
      ∧ (drafts_i > 0 ⇒ samples_i)
  S6  live_i ∧ samples_i ⇒ no later live
  S7  live_i ⇒ RUNNING;  orphaned_i ⇒ PREEMPTED ∧ no live entry  (one entry per batch: by construction)
  S8  present_i ⇒ drafts_i ≤ k;  active ⇒ D ≤ k;  RUNNING ∧ no live entry ⇒ C < T
  S10 (the pool-free part) present_i ∧ θ > 0 ⇒ n_i ≤ θ;  tokens_i ≤ B;  num_running ≤ S
  S11 0 ≤ depth ≤ K;  i < depth ⇒ fate_i[first_i] ≠ absent (no launched batch is empty)
  L1  RUNNING ∧ T + D − C ≤ 0 ⇒ some live entry samples and is r's last live one

Conjuncts named `aux.*` are the hand-written strengthening that makes the
conjunction inductive (1-induction over the micro-steps).
"""

from __future__ import annotations

from typing import Any

from flightcheck.verification.z3.param.model import (
    ACTIVE,
    Formula,
    Ops,
    ParamConfig,
    ParamState,
    is_one_of,
)

PROPERTIES = ("S1", "S2", "S3", "S5", "S6", "S7", "S8", "S10", "S11", "L1")


def local_conjuncts(ops: Ops, x: ParamState, cfg: ParamConfig, r: Any) -> dict[str, Formula]:
    """Local(x, r), conjunct by conjunct."""
    K, L, k = cfg.K, cfg.max_model_len, cfg.num_spec_tokens
    st, t = x.status[r], x.num_tokens(r)
    c, dr, o, mx, p = x.num_computed[r], x.num_drafts[r], x.num_output[r], x.max_tokens[r], x.prompt_len[r]
    fate = [s.fate[r] for s in x.slots]
    live = [f == ops.fate("live") for f in fate]
    orphaned = [f == ops.fate("orphaned") for f in fate]
    present = [ops.not_(f == ops.fate("absent")) for f in fate]
    start = [s.start[r] for s in x.slots]
    n = [s.n[r] for s in x.slots]
    drafts = [s.drafts[r] for s in x.slots]
    samples = [s.samples[r] for s in x.slots]
    end = [start[i] + n[i] for i in range(K)]

    def later_live(i: int) -> Formula:
        return ops.or_(*live[i + 1:])

    active, running = is_one_of(ops, st, ACTIVE), st == ops.status("RUNNING")
    any_live = ops.or_(*live)
    live_sampling = ops.or_(*[ops.and_(live[i], samples[i]) for i in range(K)])
    last_live_samples = ops.or_(*[ops.and_(live[i], samples[i], ops.not_(later_live(i))) for i in range(K)])
    out: dict[str, Formula] = {
        "S1.counter_bounds": ops.implies(active, ops.and_(0 <= c, c <= t + dr)),
        "S1.zero_unless_running": ops.implies(ops.and_(active, ops.not_(running)), c == 0),
        "S2.caps": ops.and_(o <= ops.ite(mx >= 0, mx, 0), t <= L),
        "S2.active_below_caps": ops.implies(active, ops.and_(o < mx, t < L)),
        "S8.request_drafts_within_k": ops.implies(active, dr <= k),
        "S8.rejections_subtracted": ops.implies(ops.and_(running, ops.not_(any_live)), c < t),
        "L1.running_request_unblocked": ops.implies(ops.and_(running, t + dr - c <= 0), last_live_samples),
        "aux.new_is_blank": ops.implies(st == ops.status("NEW"), ops.and_(
            p == 0, o == 0, c == 0, dr == 0, *[ops.not_(q) for q in present])),
        "aux.counts_nonnegative": ops.and_(p >= 0, o >= 0, ops.implies(active, dr >= 0)),
        "aux.no_drafts_unless_running": ops.implies(ops.and_(active, ops.not_(running), *(
            [st == ops.status("WAITING")] if cfg.drafts_kept_through_preemption else [])), dr == 0),
        "aux.behind_unless_sampling": ops.implies(ops.and_(running, ops.not_(live_sampling)), c < t),
    }
    for i in range(K):
        reach = end[i] - drafts[i]
        out[f"S2.entry_within_max_model_len[{i}]"] = ops.implies(present[i], end[i] <= L)
        out[f"S3.live_entry_nonempty[{i}]"] = ops.implies(live[i], n[i] >= 1)
        out[f"S3.last_live_ends_at_num_computed[{i}]"] = ops.implies(
            ops.and_(live[i], ops.not_(later_live(i))), end[i] == c)
        for j in range(i + 1, K):
            between = [ops.not_(live[m]) for m in range(i + 1, j)]
            out[f"S3.contiguous[{i},{j}]"] = ops.implies(ops.and_(live[i], live[j], *between), end[i] == start[j])
        out[f"S5.one_sample_per_prefill[{i}]"] = ops.implies(live[i], ops.and_(
            reach <= t, n[i] > drafts[i], samples[i] == (reach == t), ops.implies(drafts[i] > 0, samples[i])))
        out[f"S6.sampling_entry_is_last[{i}]"] = ops.implies(ops.and_(live[i], samples[i]),
                                                             ops.not_(later_live(i)))
        out[f"S7.live_entry_of_running[{i}]"] = ops.implies(live[i], running)
        out[f"S7.orphan_of_preempted_without_live[{i}]"] = ops.implies(
            orphaned[i], ops.and_(st == ops.status("PREEMPTED"), ops.not_(any_live)))
        out[f"S8.entry_drafts_within_k[{i}]"] = ops.implies(present[i], drafts[i] <= k)
        out[f"S10.threshold[{i}]"] = ops.implies(ops.and_(present[i], cfg.threshold > 0), n[i] <= cfg.threshold)
        out[f"aux.entry_drafts_nonnegative[{i}]"] = ops.implies(present[i], drafts[i] >= 0)
        out[f"aux.sampling_entry_carries_the_drafts[{i}]"] = ops.implies(ops.and_(live[i], samples[i]),
                                                                         dr == drafts[i])
        out[f"aux.nothing_beyond_open_batch[{i}]"] = ops.implies(x.depth < i, fate[i] == ops.fate("absent"))
    return out


def global_conjuncts(ops: Ops, x: ParamState, cfg: ParamConfig) -> dict[str, Formula]:
    """Global(x): the facts about the FIFO and the ghosts."""
    out: dict[str, Formula] = {
        "S11.depth_at_most_K": ops.and_(0 <= x.depth, x.depth <= cfg.K),
        "S10.max_num_seqs": x.num_running <= cfg.max_num_seqs,
    }
    for i, s in enumerate(x.slots):
        out[f"S11.launched_batch_not_empty[{i}]"] = ops.implies(
            i < x.depth, ops.not_(s.fate[s.first] == ops.fate("absent")))
        out[f"S10.budget[{i}]"] = s.tokens <= cfg.budget
        out[f"aux.no_tokens_beyond_open_batch[{i}]"] = ops.implies(x.depth < i, s.tokens == 0)
    return out


def local(ops: Ops, x: ParamState, cfg: ParamConfig, r: Any) -> Formula:
    return ops.and_(*local_conjuncts(ops, x, cfg, r).values())


def invariant(ops: Ops, x: ParamState, cfg: ParamConfig) -> Formula:
    """Inv(x) = Global(x) ∧ ∀r. Local(x, r)."""
    return ops.and_(*global_conjuncts(ops, x, cfg).values(),
                    ops.forall_req(lambda r: local(ops, x, cfg, r)))


def broken_conjuncts(ops: Ops, x: ParamState, cfg: ParamConfig) -> list[str]:
    """The names of the conjuncts a concrete state breaks (for reports)."""
    names = [n for n, f in global_conjuncts(ops, x, cfg).items() if not f]
    for r in range(ops.num_requests):
        names += [f"{n} @r{r}" for n, f in local_conjuncts(ops, x, cfg, r).items() if not f]
    return names


def property_holds(ops: Ops, x: ParamState, cfg: ParamConfig, prop: str) -> bool:
    """One property (e.g. "S3") on a concrete state: its conjuncts only."""
    prefix = prop + "."
    ok = all(f for n, f in global_conjuncts(ops, x, cfg).items() if n.startswith(prefix))
    return ok and all(f for r in range(ops.num_requests)
                      for n, f in local_conjuncts(ops, x, cfg, r).items() if n.startswith(prefix))
