"""The Z3 encoding of finding 1's fix of the unwritten-KV findings
(`vllm-0.34-unwritten-kv-fixed`, `Profile.hand_back_uncaches_unwritten`;
verification/z3/encoding/priority.py `_uncache_handed_back`) against the
spec: on the states of KV8's model (verification/priority_models.py
`prio-unwritten-k3`) whose schedule hands a victim back, every Z3 successor
is a spec successor and every spec successor a Z3 one, under the fix and
under vLLM 0.34's rules (where nothing is uncached)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from flightcheck.spec import schedule
from flightcheck.verification.priority_models import PRIORITY_UNWRITTEN_MODELS
from flightcheck.verification.z3.encoding.crosscheck import CrossChecker, CrossReport, reachable


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
