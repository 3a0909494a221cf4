"""BMC and k-induction of the priority policy's properties on the priority
model (verification/z3/priority_models.py), on the encoding of
z3/encoding/priority.py and priority_state.py.

* PR1 (a state invariant) and the auxiliary invariants: `kv_engines.kv_induction`
  (k-induction, the Houdini way) with `priority_auxiliary(cfg)`: PA1 and the
  encoding's formulas of the spec's S-invariants and strengthening
  invariants as candidates, each kept only when the others make it inductive.
* PR2 and PR3 (properties of a schedule step) as one-step consequences of
  what that proof kept: I(s) AND T(s, s') AND NOT P(s, s') is unsat, I being
  the conjunction of every conjunct proved (`step_consequences`).
* BMC (`priority_bmc`): every state formula on each frame and every step
  formula on each step, to a depth; a violation's trace is decoded into spec
  actions and replayed on the concrete spec (with the model's mutant), which
  must agree state for state and break the same property
  (z3.results.replay), so the encoding cannot report a bug the spec does
  not have.
* Beside the KV connector (`PRIORITY_KV_Z3_MODEL`): PR1 and PR4 by
  k-induction on `priority_kv_auxiliary()` (`priority_kv_induction`) and
  by BMC (`priority_kv_bmc`); `priority_kv_rows` gives PR4's rows. With two
  batches in flight (`PRIORITY_KV_Z3_K2_MODEL`): PR1 and PR4 by k-induction
  on the queues' conjuncts only (`priority_kv_queue_induction`);
  `priority_kv_k2_rows` gives PR4's row.
"""

from __future__ import annotations

import time
from typing import Iterable

import z3
from flightcheck.spec import transition_properties_for
from flightcheck.verification.models import Model
from flightcheck.verification.mutants import applied
from flightcheck.verification.results import PropertyResult, kind_of
from flightcheck.verification.z3.encoding.kv_invariants import KV_AUXILIARY, kv_l2_no_deadlock
from flightcheck.verification.z3.encoding.priority_invariants import PRIORITY_AUXILIARY, PRIORITY_STEP_FORMULAS
from flightcheck.verification.z3.encoding.system import System
from flightcheck.verification.z3.kv_engines import KV_CANDIDATES, WF, _on, _spec_breaks, kv_bmc, kv_induction
from flightcheck.verification.z3.kv_engines import step_consequences as kv_step_consequences
from flightcheck.verification.z3.results import EngineResult, EngineVerdict

STATE_PROPERTIES = ("PR1_waiting_in_priority_order",)
STEP_PROPERTIES = tuple(PRIORITY_STEP_FORMULAS)


def priority_auxiliary(cfg) -> list[str]:
    """PA1-PA3 (encoding/priority_invariants.py). The encoding's formulas of
    the S-invariants and strengthening invariants are left out: as
    candidates of one Houdini loop (kv_engines.CANDIDATE) they fall
    together on this model (the counters' IF0 and IF2 first, under
    `schedule`), and PR1 needs none of them."""
    return list(PRIORITY_AUXILIARY)


def priority_induction(model: Model, k: int = 1, time_budget: float | None = None) -> EngineResult:
    """PR1 and the auxiliary conjuncts by k-induction (kv_engines.kv_induction),
    then PR2 and PR3 as one-step consequences of the conjuncts it proved."""
    started = time.perf_counter()
    res = kv_induction(model, k, STATE_PROPERTIES, priority_auxiliary(model.cfg), time_budget)
    kept = [p.name for p in res.properties if p.status == "proved"]
    steps = step_consequences(model, kept, STEP_PROPERTIES)
    seconds = time.perf_counter() - started
    return EngineResult(model.name, res.method, seconds, k, [*res.properties, *steps])


def step_consequences(model: Model, kept: list[str], names: Iterable[str]) -> list[EngineVerdict]:
    """Each step property P proved when I(s) AND schedule's guard and effect
    from s AND NOT P is unsat (P is true of every other action by its first
    clause); else unknown, with the state the solver found (the one query of
    kv_engines.step_consequences, on the priority policy's step formulas)."""
    return kv_step_consequences(model, kept, {n: PRIORITY_STEP_FORMULAS[n] for n in names}, kind_of)


def priority_bmc(model: Model, depth: int, time_budget: float | None = None) -> EngineResult:
    """WF and PR1 on every frame, PR2 and PR3 on every step, to `depth`
    steps from the initial state, or each violated at its smallest depth
    (kv_engines.kv_bmc with the step properties' goals)."""
    return kv_bmc(model, depth, [*STATE_PROPERTIES, *STEP_PROPERTIES], time_budget, goal=_goal, breaks=_breaks)


def _goal(system: System, name: str, t: int, steps: list) -> z3.BoolRef:
    if name in PRIORITY_STEP_FORMULAS:
        return system.build(PRIORITY_STEP_FORMULAS[name], steps[-1]) if steps else z3.BoolVal(True)
    return _on(system, name, system.frame(t))


def _breaks(model: Model, name: str, states: list, actions: list) -> bool:
    """The spec breaks `name` on the replayed trace: a step property on its last step."""
    if name in PRIORITY_STEP_FORMULAS:
        with applied(model.mutant):
            return any(p.name == name and not p.holds(states[-2], states[-1], actions[-1], model.cfg)
                       for p in transition_properties_for(model.cfg))
    return name == WF or _spec_breaks(model, name, states[-1])


# --- the policy beside the KV connector (PR4) on PRIORITY_KV_Z3_MODEL ----------------

KV_STATE_PROPERTIES = ("PR1_waiting_in_priority_order", "PR4_kv_holding_in_priority_order")


def priority_kv_auxiliary() -> list[str]:
    """PR4's conjuncts beside PR1 and PR4: PA1 (a holder's place is known),
    PA4 (the frame's shape but every block) and the KV proof's own
    (KV_AUXILIARY and kv_engines.KV_CANDIDATES). Fewer do not make it
    inductive: with PA1, PA4 and KV_AUXILIARY alone the counters' KVA7 and
    KVA8 fall under `complete_oldest` (they need the S-candidates), and the
    rest with them (docs/proofs.md, "Beside the KV connector (PR4)")."""
    return ["PA1_arrived_iff_placed", "PA4_well_formed_but_every_block", *KV_AUXILIARY, *KV_CANDIDATES]


def priority_kv_induction(model: Model, k: int = 1, time_budget: float | None = None) -> EngineResult:
    """PR1 and PR4 with the connector (kv_engines.kv_induction, the Houdini
    way) on `priority_kv_auxiliary()`'s candidates."""
    return kv_induction(model, k, KV_STATE_PROPERTIES, priority_kv_auxiliary(), time_budget)


# PR4's conjuncts on the model with two batches in flight (PRIORITY_KV_Z3_K2_MODEL):
# the queues' only. PR4 reads `kv_holding` and the arrival places; only
# `arrive` writes a place (PA1: never a holder's, which is placed; PA5: a
# new one), only the waiting loop writes `kv_holding` (a park inserts a
# request of `waiting`, placed by PR1, at its rank's place; an admission
# removes one), and PA6 with KVA5 keep every queue within its slots, so no
# insert falls off the end. No conjunct reads the block pool, a table, a
# batch or a counter, so the step fence's deferred frees, which make the
# KV proof's pool conjuncts (KVA1 first) slow at K = 2, are not asked about.
PRIORITY_KV_QUEUE_AUXILIARY = ("PA1_arrived_iff_placed", "PA5_places_numbered_once",
                               "PA6_queues_within_their_slots", "KVA5_queues")


def priority_kv_queue_induction(model: Model, k: int = 1, time_budget: float | None = None) -> EngineResult:
    """PR1 and PR4 by k-induction (kv_engines.kv_induction, the Houdini way)
    on PRIORITY_KV_QUEUE_AUXILIARY alone, WF_encoding not offered (it reads
    the pool): the conjuncts are inductive on every frame, well-formed or
    not, so what the loop keeps holds in every reachable state."""
    return kv_induction(model, k, KV_STATE_PROPERTIES, PRIORITY_KV_QUEUE_AUXILIARY, time_budget, with_wf=False)


def priority_kv_bmc(model: Model, depth: int, time_budget: float | None = None) -> EngineResult:
    """WF, PR1 and PR4 on every frame to `depth` steps (kv_engines.kv_bmc;
    a violation's trace replayed on the spec)."""
    return kv_bmc(model, depth, KV_STATE_PROPERTIES, time_budget)


# --- #57841's mutant: L2 with the connector's waits (kv_invariants.kv_l2_no_deadlock) -----

L2 = "L2_no_deadlock"


def priority_kv_l2_bmc(model: Model, depth: int, time_budget: float | None = None) -> EngineResult:
    """WF and L2 with the connector's waits on every frame to `depth` steps
    (kv_engines.kv_bmc; L2 reads the frame's own schedule, whose definitions
    it assumes); a violation's trace is replayed on the spec, whose own L2
    must break on its last state."""
    return kv_bmc(model, depth, [L2], time_budget, goal=_l2_goal)


def _l2_goal(system: System, name: str, t: int, steps: list) -> z3.BoolRef:
    if name != L2:
        return _on(system, name, system.frame(t))
    sch, definitions = system.sched(t)
    return z3.Implies(z3.And(definitions), system.build(kv_l2_no_deadlock, system.frame(t), sch))


# How deep BMC of the priority model goes in `flightcheck verify --priority`
# (the proofs are unbounded; BMC gives each property a second method).
PRIORITY_BMC_DEPTH = 4


def priority_rows(depth: int = PRIORITY_BMC_DEPTH, time_budget: float | None = None) -> list[PropertyResult]:
    """PR1-PR3 of the Z3 priority model by k-induction (PR2, PR3: one step
    from its invariant) and by BMC to `depth`, then PR4 of the models beside
    the connector (`priority_kv_rows`: K = 1; `priority_kv_k2_rows`: K = 2);
    the method names the model."""
    from flightcheck.verification.z3.priority_models import PRIORITY_Z3_MODEL

    where = f" [{PRIORITY_Z3_MODEL.name}@{PRIORITY_Z3_MODEL.cfg.profile}]"
    rows = []
    for result in (priority_induction(PRIORITY_Z3_MODEL, 1, time_budget=time_budget),
                   priority_bmc(PRIORITY_Z3_MODEL, depth, time_budget=time_budget)):
        rows += [PropertyResult(p.name, p.kind, p.status, p.method + where, p.depth, p.seconds)
                 for p in result.properties if p.kind != "auxiliary"]
    return rows + priority_kv_rows(time_budget=time_budget) + priority_kv_k2_rows(time_budget)


# How deep BMC of the model beside the connector goes in `flightcheck verify --priority`.
PRIORITY_KV_BMC_DEPTH = 5


def priority_kv_rows(depth: int = PRIORITY_KV_BMC_DEPTH, time_budget: float | None = None) -> list[PropertyResult]:
    """PR4 of PRIORITY_KV_Z3_MODEL by k-induction and by BMC to `depth`
    (PR1 is proved there too: tests/test_z3_priority_pairs.py)."""
    from flightcheck.verification.z3.priority_models import PRIORITY_KV_Z3_MODEL

    where = f" [{PRIORITY_KV_Z3_MODEL.name}@{PRIORITY_KV_Z3_MODEL.cfg.profile}]"
    rows = []
    for result in (priority_kv_induction(PRIORITY_KV_Z3_MODEL, 1, time_budget=time_budget),
                   priority_kv_bmc(PRIORITY_KV_Z3_MODEL, depth, time_budget=time_budget)):
        rows += [PropertyResult(p.name, p.kind, p.status, p.method + where, p.depth, p.seconds)
                 for p in result.properties if p.name == "PR4_kv_holding_in_priority_order"]
    return rows


def priority_kv_k2_rows(time_budget: float | None = None) -> list[PropertyResult]:
    """PR4 of PRIORITY_KV_Z3_K2_MODEL (K = 2) by k-induction on the queues'
    conjuncts (`priority_kv_queue_induction`; seconds, where the K = 1 proof's
    every conjunct takes minutes); BMC at K = 2 is the slow tests'."""
    from flightcheck.verification.z3.priority_models import PRIORITY_KV_Z3_K2_MODEL

    model = PRIORITY_KV_Z3_K2_MODEL
    where = f" [{model.name}@{model.cfg.profile}]"
    result = priority_kv_queue_induction(model, 1, time_budget=time_budget)
    return [PropertyResult(p.name, p.kind, p.status, p.method + where, p.depth, p.seconds)
            for p in result.properties if p.name == "PR4_kv_holding_in_priority_order"]
