"""The micro-step chains of `schedule` and `complete_oldest` (z3.induction.microsteps):
they prove what the one-query step proves, much faster, and never more. A
chain that claimed a conjunct the one-query method refutes would be an
unsound proof, so every claim is cross-checked against it here, on the
correct spec and on mutants whose damage is in those two actions."""

from __future__ import annotations

import time

import pytest
import z3

from flightcheck.verification import models
from flightcheck.verification.z3.encoding.actions import COMPLETE, SCHEDULE
from flightcheck.verification.z3.induction.kinduction import prove_by_induction
from flightcheck.verification.z3.induction.step import chains, k_induction
from flightcheck.verification.z3.encoding.invariants import INVARIANT_FORMULAS, NEEDS_SCHEDULE
from flightcheck.verification.z3.induction.strengthening import AUXILIARY, ASYNC_ONLY_AUXILIARY
from flightcheck.verification.z3.encoding.system import System

# the sync profiles' auxiliary set (strengthening.auxiliary_for): the models here are sync
NAMES = ["WF_encoding", *INVARIANT_FORMULAS, *(name for name in AUXILIARY if name not in ASYNC_ONLY_AUXILIARY)]


def claims(model: models.Model) -> tuple[dict, dict, list]:
    """Per chained action, the conjuncts its chain proves and those it does not."""
    system = System(model)
    step = k_induction(system, 1, NAMES)
    assume, queries = step.assume, step.queries
    by_chain = chains(system, 0, NAMES)
    proved, not_proved = {}, {}
    for a, chain in by_chain.items():
        goals = [n for n in NAMES if n not in NEEDS_SCHEDULE]
        proved[a] = [n for n in goals if chain.proves(queries[a].goal[n], NAMES)]
        not_proved[a] = [n for n in goals if n not in proved[a]]
    return proved, not_proved, (assume, queries)


def refuted_in_one_query(ctx, action: int, name: str) -> bool:
    assume, queries = ctx
    q = queries[action]
    return q.check(name, [assume[x] for x in NAMES]) == z3.sat


def test_the_chains_prove_every_step_conjunct_of_the_correct_spec():
    proved, not_proved, _ = claims(models.SINGLE_SEQ)
    assert not_proved[SCHEDULE] == []
    # complete_oldest removes the oldest batch before it applies the entries,
    # so conjuncts about in-flight entries are left to the one-query method.
    assert "S9_kv_ownership" in proved[COMPLETE] and "WF_encoding" in proved[COMPLETE]


@pytest.mark.parametrize("mutant, action, broken", [
    ("no_block_for_last_token", SCHEDULE, "S9_kv_ownership"),
    ("advance_at_completion", SCHEDULE, "S3_contiguous_coverage"),
])
def test_a_chain_never_proves_what_a_mutant_breaks(mutant, action, broken):
    proved, not_proved, ctx = claims(models.SINGLE_SEQ.with_mutant(mutant))
    assert broken in not_proved[action]
    assert refuted_in_one_query(ctx, action, broken)


@pytest.mark.slow
@pytest.mark.parametrize("mutant", [None, "no_block_for_last_token", "advance_at_completion",
                                    "rejections_not_subtracted", "shared_snapshot",
                                    "snapshot_omits_prefix_hit", "final_chunk_from_live_counter",
                                    "decode_while_token_in_flight", "budget_ignored"])
def test_every_chain_claim_agrees_with_the_one_query_method(mutant):
    model = models.PRESSURE_K2.with_mutant(mutant)
    proved, _, ctx = claims(model)
    for action, names in proved.items():
        for n in names:
            assert not refuted_in_one_query(ctx, action, n), (mutant, action, n)


def test_the_chains_under_0_33_prove_every_schedule_conjunct_and_agree_with_one_query():
    """vLLM 0.33's waiting loop (a position that passes over deferred
    resumptions, the full-sequence gate) and its threshold (only with
    company) on the deferral model: the schedule chain proves every step
    conjunct, and no claim of either chain is refuted by the one-query method."""
    from flightcheck.verification.z3.profiles import DEFERRAL_MODEL
    proved, not_proved, ctx = claims(DEFERRAL_MODEL)
    assert not_proved[SCHEDULE] == []
    for action, names in proved.items():
        for n in names:
            assert not refuted_in_one_query(ctx, action, n), (action, n)


def test_k_induction_with_chains_proves_a_small_model_fast():
    t0 = time.perf_counter()
    res = prove_by_induction(models.SINGLE_SEQ)
    assert {p.name for p in res.properties if p.status != "proved"} == set()
    assert time.perf_counter() - t0 < 120
