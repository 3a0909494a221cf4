"""KV8 (spec/kv_unwritten.py) by k-induction on the Z3 encoding of its
history variable (z3/encoding/unwritten.py), on KV8's model
`prio-unwritten-k3` (verification/priority_models.py
`PRIORITY_UNWRITTEN_MODELS`), under finding 1's fix
(`vllm-0.34-unwritten-kv-fixed`).

`unwritten_microstep_induction` proves it: the base proof's engine
(z3.induction, `schedule` micro-step by micro-step) with the base
conjuncts, PR1, PA1, PA3, KVU1 and KVU2, then KV8 in one step
(docs/proofs.md, "KV8 by k-induction"; about 10 minutes on k3 at load 10).

`unwritten_induction` (the one-query step of kv_engines, kept as the record
of its gap): PR1, PA1-PA3 (the priority proof's conjuncts),
`KVU1_nothing_unwritten` and `KVU2_cached_blocks_computed` by k-induction
(kv_engines.kv_induction, the Houdini way, WF_encoding not offered), then
KV8 as a one-step consequence of what it kept
(kv_engines.step_consequences). Today it keeps PR1 and PA1-PA3 only: KVU1
and KVU2 are not inductive without the block part of the state's
well-formedness, which this model's proof does not have (docs/proofs.md,
"KV8"), so KV8 stays unknown; the encoding of the history and of the fix
is cross-checked against the spec (tests/test_z3_unwritten.py).
"""

from __future__ import annotations

import time

from flightcheck.verification.models import Model
from flightcheck.verification.results import kind_of
from flightcheck.verification.z3.encoding.feature_formulas import AUXILIARY as FEATURE_AUXILIARY
from flightcheck.verification.z3.encoding.feature_formulas import FORMULAS as FEATURE_FORMULAS
from flightcheck.verification.z3.encoding.priority_invariants import PRIORITY_AUXILIARY
from flightcheck.verification.z3.encoding.unwritten_formulas import UNWRITTEN_AUXILIARY, UNWRITTEN_STEP_FORMULAS
from flightcheck.verification.z3.kv_engines import CANDIDATE, kv_induction
from flightcheck.verification.z3.kv_engines import step_consequences as kv_step_consequences
from flightcheck.verification.z3.results import EngineResult

KV8 = "KV8_no_hit_on_unwritten_kv"


# The block strengthening tried on top (docs/proofs.md, "KV8"): WF_encoding
# with the base encoding's S-invariants and strengthening invariants that
# bound the counters and own the pool (kv_engines.CANDIDATE names them).
# With all of them the first query is not answered in 1,200 s; with fewer,
# WF_encoding and S9 fall on `schedule` from frames whose counters no run
# reaches, and KVU1/KVU2 with them.
BLOCK_CANDIDATES: tuple[str, ...] = tuple(CANDIDATE + n for n in (
    "S1_counter_bounds", "S2_length_cap", "S8_spec_accounting", "S9_kv_ownership", "S11_pipeline_depth",
    "IF0_in_flight_never_negative", "IF1_in_flight_counter", "IF2_stale_counter", "A1_new_is_pristine",
    "A2_waiting_never_ran", "A3_finished_is_released", "A4_counts_nonnegative", "A5_snapshots_well_formed",
    "A9_held_blocks_are_not_free", "A10_inactive_has_no_counters"))


def unwritten_induction(model: Model, k: int = 1, time_budget: float | None = None,
                        strengthening: tuple[str, ...] = (), with_wf: bool = False) -> EngineResult:
    """PR1, PA1-PA3, KVU1, KVU2 and `strengthening` (WF_encoding too with
    `with_wf`) by k-induction, then KV8 in one step from what it kept."""
    started = time.perf_counter()
    res = kv_induction(model, k, ["PR1_waiting_in_priority_order"],
                       [*PRIORITY_AUXILIARY, *UNWRITTEN_AUXILIARY, *strengthening], time_budget, with_wf=with_wf)
    kept = [p.name for p in res.properties if p.status == "proved"]
    steps = kv_step_consequences(model, kept, UNWRITTEN_STEP_FORMULAS, kind_of)
    return EngineResult(model.name, res.method, time.perf_counter() - started, k, [*res.properties, *steps])


# --- the base proof's micro-step split (z3.induction), where KV8 is proved ----------

# The priority proof's conjuncts the base proof does not have (PA2 is WF_encoding
# less the blocks: WF_encoding itself is offered).
PRIORITY_CONJUNCTS = ("PR1_waiting_in_priority_order", "PA1_arrived_iff_placed", "PA3_queues_match_statuses")


def microstep_conjuncts(cfg) -> tuple[list[str], list[str]]:
    """(the spec's state invariants, the auxiliary ones) `unwritten_microstep_induction`
    offers: the base proof's (z3.induction.kinduction: S1-S11, L1, L3, IF0-IF3,
    A1-A11) less L2 (it calls `schedule` on the next state, a second
    circuit; KV8 does not need it), PR1, PA1, PA3, KVU1 and KVU2."""
    from flightcheck.verification.z3.encoding.invariants import NEEDS_SCHEDULE, invariant_formulas_for
    from flightcheck.verification.z3.induction.strengthening import auxiliary_for
    invariants = [n for n in invariant_formulas_for(cfg) if n not in NEEDS_SCHEDULE]
    return invariants, [*auxiliary_for(cfg), *PRIORITY_CONJUNCTS, *UNWRITTEN_AUXILIARY]


def unwritten_microstep_induction(model: Model, k: int = 1, time_budget: float | None = None,
                                  progress=None) -> EngineResult:
    """KVU1, KVU2 with the base proof's conjuncts and the priority ones
    (`microstep_conjuncts`) by the base k-induction engine
    (z3.induction.kinduction.prove_by_induction: `schedule` and
    `complete_oldest` micro-step by micro-step, where the in-flight sums of
    IF1/IF2 are cheap; the chain tracks KVU1 and KVU2 inside a call by
    `unwritten_formulas.unwritten_batch_facts`), then KV8 in one step from
    what it kept (kv_engines.step_consequences, each kept name as the
    encoding's formula of it)."""
    from flightcheck.verification.z3.induction.kinduction import prove_by_induction
    started = time.perf_counter()
    invariants, auxiliary = microstep_conjuncts(model.cfg)
    res = prove_by_induction(model, k, invariants, auxiliary, time_budget, progress=progress)
    offered = {"WF_encoding", *invariants, *auxiliary}
    kept = [p.name for p in res.properties if p.status == "proved" and p.name in offered]
    as_formulas = [n if n == "WF_encoding" or n in FEATURE_FORMULAS or n in FEATURE_AUXILIARY else CANDIDATE + n
                   for n in kept]
    steps = kv_step_consequences(model, as_formulas, UNWRITTEN_STEP_FORMULAS, kind_of)
    return EngineResult(model.name, res.method, time.perf_counter() - started, k, [*res.properties, *steps])
