"""KV7 (no compute on invalid KV; spec/kv_invalid.py, docs/proofs.md "KV7")
by k-induction and BMC on KV7's models (verification/kv_models.py
`kv-invalid-k2`), on the encoding of z3/encoding/kv_sync.py and kv_invalid.py.

* The state conjuncts (WF, the connector's invariants, their auxiliary ones
  and candidates, and KVA10: `kv_invalid.quarantined`) by
  `kv_engines.kv_induction`, the Houdini way.
* KV7, a property of a `schedule` step, as a one-step consequence of what
  that proof kept (`kv_engines.step_consequences`): I(s) AND schedule's guard
  and effect AND NOT KV7 unsat.
* BMC (`kv7_bmc`): every state conjunct on each frame and KV7 on each step;
  a violation's trace is replayed on the spec, which must break KV7 on its
  last step too (z3.results.replay).
"""

from __future__ import annotations

import time
from typing import Iterable

import z3
from flightcheck.spec import transition_properties_for
from flightcheck.verification.models import Model
from flightcheck.verification.mutants import applied
from flightcheck.verification.z3.encoding.kv_invalid_formulas import KV7_AUXILIARY, KV7_STEP_FORMULAS
from flightcheck.verification.z3.encoding.kv_invariants import KV_AUXILIARY
from flightcheck.verification.z3.encoding.system import System
from flightcheck.verification.z3.kv_engines import KV_CANDIDATES, WF, _on, _spec_breaks, kv_bmc, kv_induction
from flightcheck.verification.z3.kv_engines import step_consequences
from flightcheck.verification.z3.results import EngineResult

KV7 = "KV7_no_compute_on_invalid_kv"
FIXED = "vllm-0.34-invalid-kv-fixed"


def kv7_auxiliary() -> list[str]:
    """KV7's conjuncts beside the connector's invariants: the connector proof's
    own (KV_AUXILIARY, KV_CANDIDATES) but A7, no invariant under the fix (a
    failure uncaches a block two holders share), and KVA10 (`quarantined`)
    with KVA11 (S9's caching clauses with shared blocks, kv_invalid.py)."""
    return [*KV_AUXILIARY, *(n for n in KV_CANDIDATES if n != "candidate:A7_unlabelled_blocks_are_private"),
            *KV7_AUXILIARY]


def kv7_rows(time_budget: float | None = None) -> list:
    """KV7 and the connector's invariants of KV_INVALID_K1 under finding 7's fix
    by 1-induction (KV7 one step from it), for `flightcheck verify
    --kv-connector --profile vllm-0.34-invalid-kv-fixed`; the method names the model."""
    from flightcheck.verification.results import PropertyResult
    from flightcheck.verification.z3.kv_models import KV_INVALID_K1
    from flightcheck.verification.z3.profiles import profile_model
    model = profile_model(KV_INVALID_K1, FIXED)
    where = f" [{KV_INVALID_K1.name}@{FIXED}]"
    return [PropertyResult(p.name, p.kind, p.status, p.method + where, p.depth, p.seconds)
            for p in kv7_induction(model, 1, time_budget=time_budget).properties if p.kind != "auxiliary"]


def kv7_induction(model: Model, k: int = 1, auxiliary: Iterable[str] | None = None,
                  time_budget: float | None = None) -> EngineResult:
    """The state conjuncts by k-induction (kv_engines.kv_induction), then KV7 as
    a one-step consequence of those it proved."""
    started = time.perf_counter()
    res = kv_induction(model, k, None, kv7_auxiliary() if auxiliary is None else auxiliary, time_budget)
    kept = [p.name for p in res.properties if p.status == "proved"]
    steps = step_consequences(model, kept, KV7_STEP_FORMULAS)
    return EngineResult(model.name, res.method, time.perf_counter() - started, k, [*res.properties, *steps])


def kv7_bmc(model: Model, depth: int, time_budget: float | None = None) -> EngineResult:
    """WF, the connector's invariants and KVA10 on every frame, KV7 on every
    step, to `depth` steps (kv_engines.kv_bmc with KV7's goal)."""
    from flightcheck.verification.z3.kv_engines import kv_properties
    names = [*kv_properties(model), *KV7_AUXILIARY, KV7]
    return kv_bmc(model, depth, names, time_budget, goal=_goal, breaks=_breaks)


def _goal(system: System, name: str, t: int, steps: list) -> z3.BoolRef:
    if name in KV7_STEP_FORMULAS:
        return system.build(KV7_STEP_FORMULAS[name], steps[-1]) if steps else z3.BoolVal(True)
    return _on(system, name, system.frame(t))


def _breaks(model: Model, name: str, states: list, actions: list) -> bool:
    """The spec breaks `name` on the replayed trace: KV7 on its last step,
    KVA10 (`quarantined`) on its last state."""
    if name in KV7_STEP_FORMULAS:
        with applied(model.mutant):
            return any(p.name == name and not p.holds(states[-2], states[-1], actions[-1], model.cfg)
                       for p in transition_properties_for(model.cfg))
    if name in KV7_AUXILIARY:
        from flightcheck.spec.kv_invalid import quarantined
        return not quarantined(states[-1], model.cfg)
    return name == WF or _spec_breaks(model, name, states[-1])
