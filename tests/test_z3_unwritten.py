"""KV8 in Z3 (verification/z3/encoding/unwritten.py) and finding 1's fix of
the unwritten-KV findings (`vllm-0.34-unwritten-kv-fixed`,
`Profile.hand_back_uncaches_unwritten`; encoding/priority.py
`victim_to_tail`) against the spec, on KV8's model
(verification/priority_models.py `prio-unwritten-k3`):

* without KV8's frame part, on the states whose schedule hands a victim
  back, every Z3 successor is a spec successor and every spec successor a
  Z3 one, under the fix and under 0.34's rules; without the uncache the
  fixed relation differs;
* with it (`unwritten_kv` as a label per block, compared as part of the
  state), the same on those states, on the states that hold a pair and
  along the counterexample; KV8's step formula agrees with the spec's
  transition property on every schedule step from them; KVU1 and KVU2 hold
  on every reachable state of the fixed model (KVU1 fails on 0.34's where a
  pair is held);
* KV8 by k-induction under the fix (z3/unwritten_engines.py
  `unwritten_microstep_induction`, `schedule` micro-step by micro-step):
  the proof on prio-unwritten-k3, every conjunct it offers true of every
  reachable state, and the chain's facts inside a call true at every
  micro-step of every schedule of the K = 1 twin (`prio-unwritten-k1`),
  whose explicit search breaks KV8 under 0.34 and keeps it under the fix."""

from __future__ import annotations

from dataclasses import replace

import pytest
import z3

from flightcheck.spec import Schedule, schedule, step, transition_properties_for
from flightcheck.verification.priority_models import PRIORITY_UNWRITTEN_MODELS
from flightcheck.verification.z3.encoding.actions import SCHEDULE
from flightcheck.verification.z3.encoding.crosscheck import CrossChecker, CrossReport, reachable
from flightcheck.verification.z3.encoding.system import System
from flightcheck.verification.z3.encoding.unwritten_formulas import UNWRITTEN_AUXILIARY, UNWRITTEN_STEP_FORMULAS

KV8 = "KV8_no_hit_on_unwritten_kv"


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["vllm-0.34-unwritten-kv-fixed", "vllm-0.34"])
def test_the_relation_is_spec_step_where_a_victim_is_handed_back(profile: str):
    (model,) = PRIORITY_UNWRITTEN_MODELS[profile]
    model = replace(model, cfg=replace(model.cfg, check_unwritten_kv=False))   # the Z3 frame has no unwritten_kv
    handed_back = [s for s in reachable(model) if (sch := schedule(s, model.cfg)) is not None and sch.taken_back]
    assert len(handed_back) == 5
    checker, report = CrossChecker(model), CrossReport()
    for s in handed_back:
        checker.check(s, report)
    assert report.problems == [] and report.edges >= len(handed_back)


@pytest.mark.slow
def test_the_check_is_not_vacuous_without_the_uncache_the_fixed_relation_differs(monkeypatch):
    from flightcheck.verification.z3.encoding import priority as z3_priority
    monkeypatch.setattr(z3_priority, "uncaches_handed_back", lambda layout: False)
    (model,) = PRIORITY_UNWRITTEN_MODELS["vllm-0.34-unwritten-kv-fixed"]
    model = replace(model, cfg=replace(model.cfg, check_unwritten_kv=False))
    handed_back = [s for s in reachable(model) if (sch := schedule(s, model.cfg)) is not None and sch.taken_back]
    checker, report = CrossChecker(model), CrossReport()
    for s in handed_back:
        checker.check(s, report)
    assert report.problems and all("schedule" in p.split(" from ")[0] for p in report.problems)


def _with_a_pair_or_a_hand_back(model) -> list:
    return [s for s in reachable(model)
            if s.unwritten_kv or ((sch := schedule(s, model.cfg)) is not None and sch.taken_back)]


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["vllm-0.34", "vllm-0.34-unwritten-kv-fixed"])
def test_with_kv8s_frame_the_relation_is_spec_step_history_included(profile: str):
    (model,) = PRIORITY_UNWRITTEN_MODELS[profile]
    states = _with_a_pair_or_a_hand_back(model)
    assert len(states) == (40 if profile == "vllm-0.34" else 5)     # 35 holding a pair, 5 handing back
    checker, report = CrossChecker(model), CrossReport()
    for s in states:
        checker.check(s, report)
    assert report.problems == [] and report.edges >= len(states)


@pytest.mark.slow
def test_kv8s_formula_agrees_with_the_spec_on_schedule_steps_from_held_pairs():
    (model,) = PRIORITY_UNWRITTEN_MODELS["vllm-0.34"]
    system = System(model)
    stp = system.step(0, 1)
    solver = z3.Solver()
    solver.add(*stp.constraints, stp.choices.act == SCHEDULE)
    formula = system.build(UNWRITTEN_STEP_FORMULAS[KV8], stp)
    (prop,) = [p for p in transition_properties_for(model.cfg) if p.name == KV8]
    verdicts = []
    for s in reachable(model):
        after = step(s, model.cfg, Schedule())
        if not s.unwritten_kv or after is None:
            continue
        solver.push()
        solver.add(*system.encode(s, 0))
        assert solver.check() == z3.sat
        verdicts.append((z3.is_true(solver.model().eval(formula, model_completion=True)),
                         prop.holds(s, after, Schedule(), model.cfg)))
        solver.pop()
    assert verdicts and all(z == want for z, want in verdicts)
    assert (False, False) in verdicts and (True, True) in verdicts     # KV8 breaks on some, holds on others


@pytest.mark.slow
def test_kvu1_and_kvu2_hold_on_the_fixed_models_states_and_kvu1_fails_where_0_34_holds_a_pair():
    for profile, unheld in (("vllm-0.34-unwritten-kv-fixed", 0), ("vllm-0.34", 35)):
        (model,) = PRIORITY_UNWRITTEN_MODELS[profile]
        system, broken = System(model), {name: 0 for name in UNWRITTEN_AUXILIARY}
        for s in reachable(model):
            c = system.constant(s)
            for name, f in UNWRITTEN_AUXILIARY.items():
                broken[name] += not z3.is_true(z3.simplify(system.build(f, c)))
        assert broken == {"KVU1_nothing_unwritten": unheld, "KVU2_cached_blocks_computed": 0}, profile


@pytest.mark.slow
def test_k_induction_keeps_pr1_and_pa1_pa3_but_not_kvu1_kvu2_so_kv8_stays_unknown():
    """The gap, recorded (docs/proofs.md, "KV8"): without the block part of
    the state's well-formedness KVU1 and KVU2 have counterexamples to
    induction on ill-formed frames, so KV8 is not proved by this engine
    (kv_engines' one-query step); the micro-step engine proves it
    (test_kv8_is_proved_by_k_induction_on_prio_unwritten_k3_under_the_fix)."""
    from flightcheck.verification.z3.unwritten_engines import unwritten_induction
    (model,) = PRIORITY_UNWRITTEN_MODELS["vllm-0.34-unwritten-kv-fixed"]
    statuses = {p.name: p.status for p in unwritten_induction(model).properties}
    assert statuses == {"PR1_waiting_in_priority_order": "proved", "PA1_arrived_iff_placed": "proved",
                        "PA2_well_formed_but_the_blocks": "proved", "PA3_queues_match_statuses": "proved",
                        "KVU1_nothing_unwritten": "unknown", "KVU2_cached_blocks_computed": "unknown",
                        KV8: "unknown"}


@pytest.mark.slow
def test_the_block_candidates_hold_on_every_state_of_the_fixed_model():
    """The strengthening offered to KV8's proof (unwritten_engines.BLOCK_CANDIDATES,
    with WF_encoding) is true of every reachable state of prio-unwritten-k3 under the
    fix: where the Houdini loop drops one, it is for want of a stronger invariant, not
    because the conjunct is false."""
    from flightcheck.verification.z3.kv_engines import WF, _on
    from flightcheck.verification.z3.unwritten_engines import BLOCK_CANDIDATES
    (model,) = PRIORITY_UNWRITTEN_MODELS["vllm-0.34-unwritten-kv-fixed"]
    system, names, broken, states = System(model), [WF, *BLOCK_CANDIDATES], {}, 0
    for s in reachable(model):
        c, states = system.constant(s), states + 1
        for name in names:
            if not z3.is_true(z3.simplify(_on(system, name, c))):
                broken[name] = broken.get(name, 0) + 1
    assert states == 1572 and broken == {}


@pytest.mark.slow
def test_without_the_in_flight_sums_wf_and_s9_fall_on_schedule_so_kv8_stays_unknown():
    """The gap with a block strengthening (docs/proofs.md, "KV8": the third row):
    without IF1/IF2 and S2, WF_encoding and S9 have counterexamples to induction
    under `schedule` on frames whose counters no run reaches; KVU1 falls with
    them and KV8 stays unknown by this engine (the micro-step engine proves
    it: test_kv8_is_proved_by_k_induction_on_prio_unwritten_k3_under_the_fix)."""
    from flightcheck.verification.z3.kv_engines import CANDIDATE
    from flightcheck.verification.z3.unwritten_engines import BLOCK_CANDIDATES, unwritten_induction
    (model,) = PRIORITY_UNWRITTEN_MODELS["vllm-0.34-unwritten-kv-fixed"]
    offered = tuple(n for n in BLOCK_CANDIDATES
                    if n not in {CANDIDATE + "S2_length_cap", CANDIDATE + "IF1_in_flight_counter",
                                 CANDIDATE + "IF2_stale_counter"})
    rows = {p.name: p for p in unwritten_induction(model, strengthening=offered, with_wf=True).properties}
    assert rows["WF_encoding"].status == "unknown" and "under action 1 " in rows["WF_encoding"].message
    assert rows[CANDIDATE + "S9_kv_ownership"].status == "unknown"
    assert rows["KVU1_nothing_unwritten"].status == "unknown" and rows[KV8].status == "unknown"
    assert all(rows[n].status == "proved" for n in ("PR1_waiting_in_priority_order", "PA1_arrived_iff_placed",
                                                   "PA2_well_formed_but_the_blocks", "PA3_queues_match_statuses"))


# --- KV8 by k-induction, micro-step by micro-step (unwritten_engines.unwritten_microstep_induction)

FIXED = "vllm-0.34-unwritten-kv-fixed"


def _twin(profile: str):
    """prio-unwritten-k1 (verification/priority_models.py), K3's run with one batch in flight."""
    from flightcheck.verification.priority_models import PRIO_UNWRITTEN_K1, _under
    return PRIO_UNWRITTEN_K1 if profile == PRIO_UNWRITTEN_K1.cfg.profile else _under(PRIO_UNWRITTEN_K1, profile)


def test_the_k1_twin_breaks_kv8_under_the_released_rules_and_keeps_it_under_the_fix():
    from flightcheck.verification.explicit import search as explicit
    from flightcheck.verification.results import SOMETIMES_NAMES
    for profile, broken in (("vllm-0.34", {KV8}), (FIXED, set())):
        result = explicit.search(_twin(profile))
        assert result.complete and (result.num_states, result.num_edges, result.max_depth) == (242, 281, 13)
        assert {v.property for v in result.violations if v.property not in SOMETIMES_NAMES} == broken, profile


def _chain_facts_along_each_schedule(model, states) -> list[dict[str, bool]]:
    """For each state, the micro-step chain's facts of the priority retry and of
    KV8 (z3.induction.microsteps.batch_facts) on every batch under construction
    of its `schedule` (the trail), evaluated in the one model of the step from
    it: name -> holds at every micro-step, per state."""
    from flightcheck.verification.z3.induction.microsteps import batch_facts
    system = System(model)
    stp = system.step(0, 1)
    solver = z3.Solver()
    solver.add(*stp.constraints, stp.choices.act == SCHEDULE)
    facts = [system.build(batch_facts, acc, stp.before) for acc in stp.sched.trail]
    out = []
    for s in states:
        solver.push()
        solver.add(*system.encode(s, 0))
        assert solver.check() == z3.sat
        witness = solver.model()
        out.append({name: all(z3.is_true(witness.eval(f[name], model_completion=True)) for f in facts)
                    for name in facts[-1] if name.startswith(("batch.retry.", "batch.unwritten."))})
        solver.pop()
    return out


@pytest.mark.slow
def test_the_chains_facts_hold_inside_every_schedule_of_the_twin_under_the_fix_and_a_pair_keeps_its_label_under_0_34():
    """The facts the micro-step chain offers inside a call (the retry after a
    hand-back; KVU1's and KVU2's in-call forms) on the real batches under
    construction: under the fix true at every micro-step of every schedule
    step from a reachable state; under 0.34's rules the pair's fact is false
    where a victim is handed back (its block keeps the pair's label)."""
    fixed = _twin(FIXED)
    enabled = [s for s in reachable(fixed) if schedule(s, fixed.cfg) is not None]
    verdicts = _chain_facts_along_each_schedule(fixed, enabled)
    assert len(verdicts) == 85 and all(all(v.values()) for v in verdicts)     # 85 of its 242 states schedule
    assert {n.split(".")[1] for n in verdicts[0]} == {"retry", "unwritten"}
    released = _twin("vllm-0.34")
    handed_back = [s for s in reachable(released) if (sch := schedule(s, released.cfg)) is not None and sch.taken_back]
    verdicts = _chain_facts_along_each_schedule(released, handed_back)
    assert handed_back and any(not v["batch.unwritten.pairs_lose_their_label"] for v in verdicts)


@pytest.mark.slow
def test_every_conjunct_offered_to_the_proof_holds_on_every_state_of_the_fixed_model_and_kvu1_breaks_under_0_34():
    """The conjuncts unwritten_microstep_induction offers are true of every
    reachable state of prio-unwritten-k3 under the fix (the proof's model),
    and KVU1 is false of the twin's states that hold a pair under 0.34's rules
    (the only one: not vacuous)."""
    from flightcheck.verification.z3.induction.step import formula
    from flightcheck.verification.z3.unwritten_engines import microstep_conjuncts
    (k3,) = PRIORITY_UNWRITTEN_MODELS[FIXED]
    for model, states_wanted, broken_wanted in ((k3, 1572, {}), (_twin("vllm-0.34"), 242, None)):
        invariants, auxiliary = microstep_conjuncts(model.cfg)
        system, broken, states = System(model), {}, 0
        for s in reachable(model):
            c, states = system.constant(s), states + 1
            for name in ["WF_encoding", *invariants, *auxiliary]:
                if not z3.is_true(z3.simplify(formula(system, name, c))):
                    broken[name] = broken.get(name, 0) + 1
        assert states == states_wanted
        if broken_wanted is not None:
            assert broken == broken_wanted
        else:
            assert set(broken) == {"KVU1_nothing_unwritten"}


@pytest.mark.slow
def test_kv8_is_proved_by_k_induction_on_prio_unwritten_k3_under_the_fix():
    """KV8 by k-induction (docs/proofs.md, "KV8"): the base proof's conjuncts
    (less L2), PR1, PA1, PA3, KVU1 and KVU2 inductive on prio-unwritten-k3
    under the fix, `schedule` and `complete_oldest` proved micro-step by
    micro-step (z3.induction), and KV8 one step from them."""
    from flightcheck.verification.z3.unwritten_engines import microstep_conjuncts, unwritten_microstep_induction
    (model,) = PRIORITY_UNWRITTEN_MODELS[FIXED]
    rows = {p.name: p for p in unwritten_microstep_induction(model).properties}
    invariants, auxiliary = microstep_conjuncts(model.cfg)
    assert {"KVU1_nothing_unwritten", "KVU2_cached_blocks_computed", "PR1_waiting_in_priority_order",
            "S9_kv_ownership", "IF1_in_flight_counter"} <= {*invariants, *auxiliary}
    assert set(rows) >= {"WF_encoding", *invariants, *auxiliary, KV8}
    assert {n: r.status for n, r in rows.items() if r.status != "proved"} == {}
    assert rows[KV8].method == "one step from the k-induction invariant"


def test_the_chains_new_facts_are_false_of_a_batch_that_breaks_them():
    """Not vacuous: on a reachable frame of the twin under the fix (r0 running
    with a labelled block), a batch under construction with a retry pending
    for no request breaks the retry's fact, and one pairing r0's held block
    with its own label, no entry writing it, breaks the pair's fact; the
    batch as the call starts keeps both."""
    from dataclasses import replace as with_fields
    from flightcheck.verification.z3.encoding.schedule import BatchInProgress
    from flightcheck.verification.z3.encoding.state import pad_entry
    from flightcheck.verification.z3.encoding.terms import V, clone
    from flightcheck.spec.pool_store import label_of
    from flightcheck.verification.z3.induction.microsteps import batch_facts
    model = _twin(FIXED)
    system = System(model)
    s = next(s for s in reachable(model) if 0 in s.running and s.requests[0].block_table
             and label_of(s.pool, s.requests[0].block_table[0]) is not None)
    block = s.requests[0].block_table[0]
    frame = system.constant(s)

    def facts(layout, st, pending, retried, paired):
        acc = BatchInProgress(st, V(layout.cfg.max_num_batched_tokens), V(0), [pad_entry() for _ in range(layout.E)],
                              [z3.BoolVal(False)] * layout.N, [z3.BoolVal(False)] * layout.N,
                              [z3.BoolVal(False)] * layout.N, z3.BoolVal(paired), V(0), z3.BoolVal(False), V(0),
                              pending=V(pending), retried=V(retried))
        if paired:
            acc = with_fields(acc, state=clone(st))
            acc.state.unw = [[st.pool.label[b] if b == block else x for b, x in enumerate(st.unw[0])]]
        return {n: z3.is_true(z3.simplify(f)) for n, f in batch_facts(layout, acc, frame).items()
                if n.startswith(("batch.retry.", "batch.unwritten."))}

    start = system.build(facts, frame, 0, -1, False)
    assert start and all(start.values())
    assert not system.build(facts, frame, 3, -1, False)["batch.retry.none_or_one"]
    assert not system.build(facts, frame, 0, -1, True)["batch.unwritten.pairs_lose_their_label"]
