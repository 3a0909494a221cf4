"""The Z3 engines' rows for `flightcheck verify` (verification/suite.py): one
row per spec property, in the suite's `PropertyResult` shape."""

from __future__ import annotations

from flightcheck.verification.models import Model
from flightcheck.verification.results import PropertyResult, kind_of
from flightcheck.verification.z3.bmc.engine import (
    BmcOptions,
    applicable_sometimes,
    bmc,
)
from flightcheck.verification.z3.bmc.cubes import max_parts
from flightcheck.verification.z3.bmc.parallel import bmc_split
from flightcheck.verification.z3.encoding.sometimes import (
    VERIFICATION_SOMETIMES,
    verification_target_applies,
)
from flightcheck.verification.z3.encoding.transitions import spec_properties_for
from flightcheck.verification.z3.induction.kinduction import prove_by_induction
from flightcheck.verification.z3.profiles import DEFERRAL_MODEL, profile_model


def _row(p, method: str | None = None):
    # a verification-only "sometimes" target (z3.encoding.sometimes.VERIFICATION_SOMETIMES)
    # is not among the spec's names kind_of knows: the engine's kind says what it is
    kind = "sometimes" if p.kind == "sometimes" else kind_of(p.name)
    return PropertyResult(p.name, kind, p.status, method or p.method, p.depth, p.seconds)


def induction_rows(model: Model, k: int = 1, time_budget: float | None = None, jobs: int = 1) -> list:
    """Every spec invariant and transition property by k-induction (with the
    auxiliary invariants; their own rows are left out)."""
    res = prove_by_induction(model, k, time_budget=time_budget, jobs=jobs)
    return [_row(p) for p in res.properties if p.name in spec_properties_for(model.cfg)]


def inferred_rows(model: Model, time_budget: float | None = None, jobs: int = 1) -> list:
    """Every spec invariant and transition property by 1-induction with an
    inferred invariant, none hand-written (z3.induction.inferred; the candidates' own rows
    are left out)."""
    from flightcheck.verification.z3.induction.inferred import prove_inferred
    res = prove_inferred(model, time_budget=time_budget, jobs=jobs)
    method = "1-induction, invariant inferred (grammar + Houdini)"
    return [_row(p, method) for p in res.properties if p.name in spec_properties_for(model.cfg)]


# The spec properties the parameterised proof covers in full (verification/z3/param/model.py:
# S10 only in part, S9/L2/L3 and the transition properties not at all).
PARAM_PROPERTIES = ("S1_counter_bounds", "S2_length_cap", "S3_contiguous_coverage",
                    "S5_one_sample_per_prefill", "S6_decode_gating", "S7_output_binding",
                    "S8_spec_accounting", "S11_pipeline_depth", "L1_running_request_unblocked")


def param_rows(K: int) -> list:
    """The properties the parameterised proof covers, proved for any number of
    requests and any configuration with K stages (the KV pool and the policy
    over-approximated), or not, as one row each."""
    from flightcheck.verification.z3.param.proof import prove
    proof = prove(K)
    status = "proved" if proof.ok else "unknown"
    method = f"k-induction, any number of requests (K={K}, pool abstracted)"
    return [PropertyResult(n, kind_of(n), status, method, None, proof.seconds) for n in PARAM_PROPERTIES]


def bmc_rows(model: Model, depth: int, time_budget: float | None = None, jobs: int = 1,
             sometimes: tuple[str, ...] | None = None) -> list:
    """Every spec property bounded (or violated) to `depth`, every applicable
    "sometimes" target (or those named in `sometimes`) reached (or not) within
    it: BMC with the sound reductions (the spec, not a mutant: z3.bmc.reduction),
    its paths shared among `jobs` processes (z3.bmc.parallel.bmc_split)."""
    reduce = model.mutant is None
    jobs = min(jobs, max_parts(model))
    res = bmc_split(model, depth, BmcOptions(time_budget=time_budget, reduce=reduce, sometimes=sometimes),
                    jobs=jobs)
    method = "bmc" + (", reduced" if reduce else "") + (f", {jobs} processes" if jobs > 1 else "")
    return [_row(p, method) for p in res.properties if p.kind != "auxiliary"]


# How deep the cover query for a profile's verification-only targets goes on
# its own small model (DEFERRAL_MODEL: `deferred_resumption` at depth 6).
TARGET_DEPTH = 6


def profile_rows(model: Model, profile: str, depth: int, time_budget: float | None = None,
                 jobs: int = 1) -> list:
    """The Z3 rows of `model` under a version profile (spec/profiles.py):
    every spec property by k-induction, then BMC to `depth` with the
    profile's sometimes targets (a preallocated block, a duplicate cached
    block, where the profile has them). A verification-only target the
    profile has (vLLM 0.33's deferred resumption: 8 steps deep on shared-k3)
    is covered by BMC of the profile's deferral model to TARGET_DEPTH
    instead. The method names the profile."""
    chosen = profile_model(model, profile)
    extra = [t.name for t in VERIFICATION_SOMETIMES if verification_target_applies(t, chosen.cfg)]
    spec_targets = tuple(name for name in applicable_sometimes(chosen) if name not in extra)
    rows = induction_rows(chosen, time_budget=time_budget, jobs=jobs) + \
        bmc_rows(chosen, depth, time_budget=time_budget, jobs=jobs, sometimes=spec_targets)
    if extra:
        cover = profile_model(DEFERRAL_MODEL, profile)
        res = bmc(cover, TARGET_DEPTH, BmcOptions(properties=(), sometimes=tuple(extra), time_budget=time_budget,
                                                  reduce=True))
        rows += [_row(p, f"bmc, reduced, {cover.name}") for p in res.properties]
    return [PropertyResult(r.name, r.kind, r.status, f"{r.method} [{profile}]", r.depth, r.seconds) for r in rows]


# --- the KV connector (`flightcheck verify --kv-connector`) ------------------------

# The profile whose rules the connector models are checked under, for each
# profile with a KV connector: the encoding has no asynchronous scheduling
# with a connector (kv_state.refuse_unencoded_connector), so an async
# profile's rows are its synchronous twin's, and the method says so.
KV_ENCODED_PROFILE = {"vllm-0.33": "vllm-0.33", "vllm-0.33-async": "vllm-0.33",
                      "vllm-0.34": "vllm-0.34", "vllm-0.34-async": "vllm-0.34",
                      "vllm-0.34-invalid-kv-fixed": "vllm-0.34-invalid-kv-fixed"}

# How deep BMC of the connector models goes (the k-induction proof is
# unbounded; BMC gives each invariant a second, independent method).
KV_BMC_DEPTH = 6


def kv_rows(profile: str, depth: int = KV_BMC_DEPTH, time_budget: float | None = None) -> list:
    """The KV invariants of each connector model (z3.kv_models) by 1-induction
    with the connector's auxiliary invariants, and by BMC to `depth`, under
    `profile`'s synchronous rules; the method names the model and profile."""
    from flightcheck.verification.z3.kv_engines import kv_bmc, kv_induction
    from flightcheck.verification.z3.kv_models import KV_MODELS
    encoded = KV_ENCODED_PROFILE[profile]
    note = "" if encoded == profile else f"; {profile}'s async scheduling not encoded"
    rows = []
    for model in KV_MODELS:
        chosen = model if model.cfg.profile == encoded else profile_model(model, encoded)
        where = f" [{chosen.name.split('@')[0]}@{encoded}{note}]"
        for result in (kv_induction(chosen, 1, time_budget=time_budget), kv_bmc(chosen, depth, time_budget=time_budget)):
            rows += [PropertyResult(p.name, p.kind, p.status, p.method + where, p.depth, p.seconds)
                     for p in result.properties if p.kind != "auxiliary"]
    if encoded == "vllm-0.34-invalid-kv-fixed":      # KV7 by k-induction (about a minute)
        from flightcheck.verification.z3.kv_invalid_engines import kv7_rows
        rows += kv7_rows(time_budget)
    return rows


# --- structured output (spec/grammar.py) -----------------------------------------

def grammar_rows(time_budget: float | None = None) -> list:
    """G1-G3 on the grammar model (z3.grammar_models.GRAMMAR_Z3, vLLM 0.34
    sync) by 1-induction with the grammar's auxiliary invariants, and by BMC
    to GRAMMAR_Z3_BMC_DEPTH; the method names the model."""
    from flightcheck.verification.z3.grammar_models import GRAMMAR_Z3, GRAMMAR_Z3_BMC_DEPTH, grammar_z3_auxiliary
    from flightcheck.verification.z3.kv_engines import kv_bmc, kv_induction
    where = f" [{GRAMMAR_Z3.name}]"
    rows = []
    for result in (kv_induction(GRAMMAR_Z3, 1, auxiliary=grammar_z3_auxiliary(), time_budget=time_budget),
                   kv_bmc(GRAMMAR_Z3, GRAMMAR_Z3_BMC_DEPTH, time_budget=time_budget)):
        rows += [PropertyResult(p.name, p.kind, p.status, p.method + where, p.depth, p.seconds)
                 for p in result.properties if p.kind != "auxiliary"]
    return rows
