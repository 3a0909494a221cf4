"""KV8 (spec/kv_unwritten.py) by k-induction and BMC on the Z3 encoding of
its history variable (z3/encoding/unwritten.py), on KV8's model
`prio-unwritten-k3` (verification/priority_models.py `PRIORITY_UNWRITTEN_MODELS`).

* Under finding 1's fix (`vllm-0.34-unwritten-kv-fixed`):
  `KVU1_nothing_unwritten` by k-induction (kv_engines.kv_induction, the
  Houdini way; WF_encoding not offered: KVU1 is inductive without it), then
  KV8 as a one-step consequence of what it kept
  (kv_engines.step_consequences): I(s) AND a schedule step AND NOT KV8 is
  unsat.
* Under vLLM 0.34's rules: BMC (`unwritten_bmc`) finds the violation; its
  trace is decoded into spec actions and replayed on the concrete spec,
  which must break KV8 on its last step (z3.results.replay).
"""

from __future__ import annotations

import time

import z3
from flightcheck.spec import transition_properties_for
from flightcheck.verification.models import Model
from flightcheck.verification.results import PropertyResult, kind_of
from flightcheck.verification.z3.encoding.system import System
from flightcheck.verification.z3.encoding.unwritten import UNWRITTEN_AUXILIARY, UNWRITTEN_STEP_FORMULAS
from flightcheck.verification.z3.kv_engines import _on, kv_bmc, kv_induction
from flightcheck.verification.z3.kv_engines import step_consequences as kv_step_consequences
from flightcheck.verification.z3.results import EngineResult

KV8 = "KV8_no_hit_on_unwritten_kv"


def unwritten_induction(model: Model, k: int = 1, time_budget: float | None = None) -> EngineResult:
    """KVU1 by k-induction, then KV8 in one step from it."""
    started = time.perf_counter()
    res = kv_induction(model, k, [], list(UNWRITTEN_AUXILIARY), time_budget, with_wf=False)
    kept = [p.name for p in res.properties if p.status == "proved"]
    steps = kv_step_consequences(model, kept, UNWRITTEN_STEP_FORMULAS, kind_of)
    return EngineResult(model.name, res.method, time.perf_counter() - started, k, [*res.properties, *steps])


def unwritten_bmc(model: Model, depth: int, time_budget: float | None = None) -> EngineResult:
    """KV8 on every step to `depth` steps from the initial state, or its
    violation at its smallest depth, replayed on the spec."""
    return kv_bmc(model, depth, [KV8], time_budget, goal=_goal, breaks=_breaks, with_wf=False)


def _goal(system: System, name: str, t: int, steps: list) -> z3.BoolRef:
    if name in UNWRITTEN_STEP_FORMULAS:
        return system.build(UNWRITTEN_STEP_FORMULAS[name], steps[-1]) if steps else z3.BoolVal(True)
    return _on(system, name, system.frame(t))


def _breaks(model: Model, name: str, states: list, actions: list) -> bool:
    """The spec breaks KV8 on the replayed trace's last step."""
    return any(p.name == name and not p.holds(states[-2], states[-1], actions[-1], model.cfg)
               for p in transition_properties_for(model.cfg))


def unwritten_rows(model: Model, time_budget: float | None = None) -> list[PropertyResult]:
    """KV8's row (and KVU1's) of the fixed model by k-induction; the method names the model."""
    where = f" [{model.name}]"
    result = unwritten_induction(model, 1, time_budget)
    return [PropertyResult(p.name, p.kind, p.status, p.method + where, p.depth, p.seconds)
            for p in result.properties]
