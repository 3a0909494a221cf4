"""KV7 in the Z3 encoding of the connector (verification/z3/encoding/kv_sync.py,
kv_invalid.py; docs/proofs.md, "KV7: no compute on invalid KV"): synchronous
loads and prefix caching beside the connector, and `invalid_kv` in the frame,
on `kv-invalid-k2` (verification/kv_models.py) under vLLM 0.34 and under
finding 7's fix:

* the transition relation is spec.step's (every successor both ways, with
  every report the connector could make): on a sample here, on every
  reachable state in the slow tests;
* the sample holds what KV7 turns on (a sync load's entry, an invalid block,
  a failure of a running and of a finished loader), so it is no vacuous check;
* what the encoding still leaves out is refused, never checked by a partial relation.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from flightcheck.spec import Status
from flightcheck.spec.transitions import FailKvLoad
from flightcheck.verification.kv_models import KV_INVALID_K2
from flightcheck.verification.z3.encoding.crosscheck import CrossChecker, CrossReport, concrete_successors
from flightcheck.verification.z3.encoding.kv_state import refuse_unencoded_connector
from flightcheck.verification.z3.profiles import profile_model
from tests.test_z3_kv import _reachable

FIXED = profile_model(KV_INVALID_K2, "vllm-0.34-invalid-kv-fixed")
MODELS = (KV_INVALID_K2, FIXED)


def _name(model) -> str:
    return model.name if "@" in model.name else f"{model.name}@{model.cfg.profile}"


def _kv7_states(model, count: int, seed: int = 0) -> list:
    """`count` reachable states where KV7's parts act: an invalid block, or a
    sync load's entry in flight (its failure enabled)."""
    states = [s for s in _reachable(model) if s.invalid_kv or any(e.external for b in s.in_flight for e in b)]
    return random.Random(seed).sample(states, min(count, len(states)))


def _cross_check(model, states) -> CrossReport:
    checker, report = CrossChecker(model), CrossReport()
    for s in states:
        checker.check(s, report)
    return report


@pytest.mark.parametrize("model", MODELS, ids=_name)
def test_the_relation_is_spec_step_on_sampled_kv7_states(model):
    report = _cross_check(model, _kv7_states(model, 6))
    assert report.problems == []
    assert report.edges > report.states


@pytest.mark.parametrize("model", MODELS, ids=_name)
def test_the_relation_is_spec_step_on_every_reachable_kv7_state(model):
    states = _reachable(model)
    report = _cross_check(model, states)
    assert report.problems == []
    assert report.states == len(states) > 300


@pytest.mark.parametrize("model", MODELS, ids=_name)
def test_the_model_reaches_every_part_the_encoding_adds(model):
    seen = set()
    for s in _reachable(model):
        seen.add("invalid block") if s.invalid_kv else None
        for action, nxt in concrete_successors(model, s):
            if isinstance(action, FailKvLoad):
                status = s.requests[action.req].status
                seen.add("running loader fails" if status is Status.RUNNING else "finished loader fails")
                if nxt.pool.labels != s.pool.labels:
                    seen.add("failure evicts")
            if any(e.external for e in (nxt.in_flight[-1] if nxt.in_flight else ())):
                seen.add("sync load scheduled")
            if s.invalid_kv and len(nxt.invalid_kv) < len(s.invalid_kv):
                seen.add("invalid block forgotten")
    want = {"invalid block", "running loader fails", "finished loader fails", "sync load scheduled",
            "invalid block forgotten"}
    assert seen >= want | ({"failure evicts"} if model is FIXED else set()), seen
    assert ("failure evicts" in seen) == (model is FIXED)       # vLLM's rule leaves the blocks cached


def test_what_the_encoding_leaves_out_is_still_refused():
    refuse_unencoded_connector(KV_INVALID_K2)
    fail_policy = dataclasses.replace(KV_INVALID_K2.cfg.kv_connector, load_failure_policy="fail")
    model = dataclasses.replace(KV_INVALID_K2, cfg=dataclasses.replace(KV_INVALID_K2.cfg, kv_connector=fail_policy,
                                                                       check_invalid_kv=False))
    with pytest.raises(ValueError, match="synchronous loads under the fail policy"):
        refuse_unencoded_connector(model)
    prompts = (dataclasses.replace(KV_INVALID_K2.prompts[0], load_async=True), KV_INVALID_K2.prompts[1])
    with pytest.raises(ValueError, match="asynchronous loads or a producer beside"):
        refuse_unencoded_connector(dataclasses.replace(KV_INVALID_K2, prompts=prompts))
