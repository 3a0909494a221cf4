"""Streaming sessions beside prefix caching, the cache-aware admission order
and drafts, against vLLM 0.33.0 and 0.34.0 (docs/request-states.md,
"Streaming sessions" and "Features together"): the campaign's feature no
longer keeps sessions apart from them, and the workloads that showed what
that needed replay alike on vLLM and the reference, with every check-trace
verdict equal to vLLM's ground truth."""

from __future__ import annotations

import os

import pytest

from flightcheck.vllm.features import registered
from flightcheck.vllm.generate import campaign_workloads

pytestmark = pytest.mark.usefixtures("both_checkers")   # a campaign's verdicts: both checkers compared

# `--all-features --versions 0.34.0,0.33.0` (no inputs during waits), seed 5:
# index 22 carries sessions beside drafts under synchronous pipeline
# parallelism: vLLM's known double sampling (drafts handed over at
# submission) lets a deliver-mode stale output stop a preempted session,
# which the recorder wrote as dropped (an unexplained differential before
# its fix); vLLM then fails its own `_update_request_as_session` assertion
# (the double sampling's num_computed_tokens past the kept tokens: S5, the
# ground truth's bug).
FOUND = {"0.34.0": [(5, 22)], "0.33.0": [(5, 22)]}


def test_sessions_are_kept_apart_from_nothing():
    features = {f.name: f for f in registered()}
    assert features["streaming-sessions"].excludes == ()     # the connector too: tests/test_session_kv.py
    for other in ("cache-aware", "spec-decoding"):
        assert "streaming-sessions" not in features[other].excludes
    met = {name: 0 for name in ("cache-aware", "spec-decoding")}
    prefix_caching = 0
    for w in campaign_workloads(5, 40, features_of="0.34.0"):
        if "streaming-sessions" in w["features"]:
            prefix_caching += w["config"].get("prefix_caching", True)
            for name in met:
                met[name] += name in w["features"]
    assert prefix_caching >= 5 and all(n >= 2 for n in met.values()), (prefix_caching, met)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version", sorted(FOUND))
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_the_session_cache_pairs_workloads_agree_with_vllm(version: str, async_scheduling: bool) -> None:
    if os.environ.get("FLIGHTCHECK_SKIP_VLLM"):
        pytest.skip("FLIGHTCHECK_SKIP_VLLM")
    from flightcheck.vllm.campaign import DISAGREEMENTS, run_version

    workloads = [campaign_workloads(seed, index + 1, features_of=version)[index] for seed, index in FOUND[version]]
    assert all({"spec-decoding", "streaming-sessions"} <= set(w["features"]) for w in workloads)
    report = run_version(version, workloads, 0, False, lambda line: None, async_scheduling)
    assert report.workloads == len(workloads) and report.unexplained == []
    assert not set(report.verdicts) & DISAGREEMENTS, dict(report.verdict_details)
