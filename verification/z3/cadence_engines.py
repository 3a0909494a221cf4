"""CAD1-CAD3 (spec/cadence_properties.py) on the Z3 encoding
(encoding/cadence.py, cadence_state.py): proved by k-induction on
cadence-z3-k2 (z3/cadence_models.py, 87 states), bounded by BMC on the
explicit model cadence-k2 (verification/cadence_models.py: 1,334 states),
where BMC finds both cadence mutants; every state of both cross-checked.

CAD1-CAD3 are properties of a schedule step, so they are proved as
one-step consequences of an inductive invariant I:

    I(s) AND guard_schedule(s) AND s' = schedule(s) AND not P(s, s')      unsat

I is what kv_engines.kv_induction (k-induction, k = 1, the Houdini loop)
keeps of WF_encoding, the cadence's auxiliary invariants CADA1-CADA3
(encoding/cadence_invariants.py) and the encoding's own formulas of the
spec's invariants and strengthening invariants (kv_engines' candidates):
each kept conjunct holds in every reachable state, so every schedule step
from a reachable state satisfies P (and every other step does, by P's
first clause). BMC bounds each P on the steps of every path up to a depth;
a violation (a mutant's) is decoded into spec actions, replayed on the
concrete spec state for state, and must break the spec's own predicate on
its last step (z3.results.replay).
"""

from __future__ import annotations

import time
from typing import Iterable

import z3
from flightcheck.spec import transition_properties_for
from flightcheck.verification.models import Model
from flightcheck.verification.mutants import applied
from flightcheck.verification.z3.encoding.cadence_invariants import CAD_AUXILIARY, CAD_TRANSITION_FORMULAS
from flightcheck.verification.z3.encoding.system import System
from flightcheck.verification.z3.kv_engines import WF, candidate_names, kv_bmc, kv_induction, step_consequences
from flightcheck.verification.z3.results import EngineResult

CAD_PROPERTIES: tuple[str, ...] = tuple(CAD_TRANSITION_FORMULAS)


def cad_auxiliary(model: Model) -> list[str]:
    """The conjuncts offered to the Houdini loop: CADA1-CADA3, then the
    encoding's formulas of the spec's invariants and strengthening
    invariants. All of them, not a chosen few: on cadence-z3-k2 the loop
    keeps every one in a single round, and a smaller set (without S3,
    S5-S8, L1, L3, IF3, A6, A7 and A11) is not inductive (S9 falls under
    schedule, then WF): docs/proofs.md, "Prefill cadence"."""
    return [*CAD_AUXILIARY, *candidate_names(model.cfg)]


def cad_induction(model: Model, time_budget: float | None = None) -> EngineResult:
    """The inductive invariant (k-induction, k = 1, Houdini over WF,
    CADA1-CADA3 and the candidates), then CAD1-CAD3 as one-step consequences of
    it. The rows: CAD1-CAD3 (proved, or unknown with the state that breaks
    them under I), then every conjunct offered (proved: kept; unknown: dropped)."""
    started = time.perf_counter()
    invariant = kv_induction(model, 1, properties=[], auxiliary=cad_auxiliary(model), time_budget=time_budget)
    kept = [p.name for p in invariant.properties if p.status == "proved"]
    rows = step_consequences(model, kept, CAD_TRANSITION_FORMULAS)
    seconds = time.perf_counter() - started
    return EngineResult(model.name, "k-induction (k=1), one step", seconds, 1, rows + invariant.properties,
                        notes=[f"inductive invariant: {len(kept)} conjuncts kept ({WF} and "
                               f"{', '.join(n for n in kept if n in CAD_AUXILIARY) or 'no CADA'} among them)"])


def cad_bmc(model: Model, depth: int, properties: Iterable[str] = CAD_PROPERTIES,
            time_budget: float | None = None) -> EngineResult:
    """Each of CAD1-CAD3 holds on every step of every path of up to `depth`
    steps from the initial state, or is violated at the shortest such step,
    its trace replayed on the spec (kv_engines.kv_bmc with the steps' goals)."""
    return kv_bmc(model, depth, list(properties), time_budget, goal=_goal, breaks=_spec_breaks,
                  kind=lambda name: "transition", with_wf=False)


def _goal(system: System, name: str, t: int, steps: list) -> z3.BoolRef:
    return system.build(CAD_TRANSITION_FORMULAS[name], steps[-1]) if steps else z3.BoolVal(True)


def _spec_breaks(model: Model, name: str, states: list, actions: list) -> bool:
    """The spec's own transition property `name` fails on the trace's last step."""
    with applied(model.mutant):
        return any(p.name == name and not p.holds(states[-2], states[-1], actions[-1], model.cfg)
                   for p in transition_properties_for(model.cfg))


# --- the rows of `flightcheck verify --prefill-cadence`

# The profile whose rules the Z3 model is checked under, for each profile
# `--prefill-cadence` takes: cadence-k2 under vLLM 0.34's (1,334 states) or
# 0.33's rules; an async profile's rows are its synchronous twin's (the
# proof is not run under async scheduling; the cross-check is), and the
# method says so.
CAD_ENCODED_PROFILE = {"vllm-0.33": "vllm-0.33", "vllm-0.33-async": "vllm-0.33",
                       "vllm-0.34": "vllm-0.34", "vllm-0.34-async": "vllm-0.34"}

# How deep BMC of the model goes (the proof is unbounded; BMC gives each of
# CAD1-CAD3 a second, independent method): the longer of the cadence
# mutants' kills (verification/mutants/cadence.py: 4 and 2 steps).
CAD_BMC_DEPTH = 4


def cad_model(profile: str, proof: bool = True) -> Model:
    """The model of the proof (cadence-z3-k2), or of BMC (cadence-k2), under
    `profile`'s synchronous rules (CAD_ENCODED_PROFILE)."""
    from flightcheck.verification.cadence_models import CADENCE_K2
    from flightcheck.verification.z3.cadence_models import CADENCE_Z3
    model, encoded = CADENCE_Z3 if proof else CADENCE_K2, CAD_ENCODED_PROFILE[profile]
    return model if model.cfg.profile == encoded else model.under_profile(encoded)


def cadence_rows(profile: str, depth: int = CAD_BMC_DEPTH, time_budget: float | None = None) -> list:
    """CAD1-CAD3 by k-induction and one step on cadence-z3-k2, and by BMC to
    `depth` on cadence-k2, under `profile`'s synchronous rules; each method
    names its model and the profile."""
    from flightcheck.verification.results import PropertyResult, kind_of
    encoded = CAD_ENCODED_PROFILE[profile]
    note = "" if encoded == profile else f"; {profile}'s synchronous twin"
    proof, bounded = cad_model(profile), cad_model(profile, proof=False)
    rows = []
    for model, result in ((proof, cad_induction(proof, time_budget)),
                          (bounded, cad_bmc(bounded, depth, time_budget=time_budget))):
        where = f" [{model.name.split('@')[0]}@{encoded}{note}]"
        rows += [PropertyResult(p.name, kind_of(p.name), p.status, p.method + where, p.depth, p.seconds)
                 for p in result.properties if p.name in CAD_PROPERTIES]
    return rows
