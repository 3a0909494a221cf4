"""Features of `--all-features` that meet in one workload (docs/request-states.md,
"Features together"): each pair no longer excluded meets in generated
workloads, and the traces of vLLM's real scheduler that a pair's campaign
found check-trace wrong on are accepted by both checkers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from flightcheck.verification.traces.check import check_events
from flightcheck.verification.traces.reading import read_trace_file
from flightcheck.verification.traces.stream import check_lines
from flightcheck.vllm.differential import decisions, read_trace, run_reference
from flightcheck.vllm.features import registered
from flightcheck.vllm.generate import campaign_workloads

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

DATA = Path(__file__).parent / "data" / "vllm" / "pairs"

# Pairs that were excluded and now meet, with the release they are drawn on.
MEETING = [("grammar", "priority", "0.34.0"), ("grammar", "priority", "0.33.0"),
           ("reset-pause", "priority", "0.34.0"), ("reset-pause", "priority", "0.33.0"),
           ("reset-pause", "grammar", "0.34.0"), ("reset-pause", "grammar", "0.33.0"),
           ("reset-pause", "spec-decoding", "0.34.0"), ("reset-pause", "spec-decoding", "0.33.0")]


@pytest.mark.parametrize("first,second,version", MEETING)
def test_the_pair_is_no_longer_excluded_and_meets(first: str, second: str, version: str) -> None:
    features = {f.name: f for f in registered()}
    assert second not in features[first].excludes and first not in features[second].excludes
    met = sum({first, second} <= set(w["features"]) for w in campaign_workloads(6, 120, features_of=version))
    assert met >= 3, (first, second, version, met)


# (trace, what the checker said before the fix)
TRACES = [
    # vLLM 0.34.0 async, campaign --all-features --versions 0.34.0 seed 6 index 87: r0's grammar
    # fails before any schedule(); the empty calls before r2 arrives meet it and an empty
    # batch's completion finishes it; r2 (priority 0) ranks ahead of r0, so a catch-up at the
    # finish no longer reaches r0 (was: a false finish_decision)
    "034_async_priority_grammar_failed_before_arrival.jsonl",
    # vLLM 0.34.0 sync and async, seed 5 indexes 42 and 64: a reset of the running requests
    # under the priority policy pushes each on the heap (`prepend_request`), so `waiting` is
    # in priority order after it (was: a false PR1_waiting_in_priority_order)
    "034_priority_reset_order.jsonl",
    "034_async_priority_reset_order.jsonl",
    # vLLM 0.33.0 async, seed 5 index 104 (grammar, pause, priority): an empty batch queued
    # while PAUSED_NEW completes before r1's grammar fails; the checker queued it later, and
    # its drain after batch 1's schedule() finished r1 an update early (was: a false
    # finish_decision, then missing_finish)
    "033_async_grammar_pause_empty_batch_completed.jsonl",
    # vLLM 0.33.0 sync, seed 5 index 94 with its priorities taken out (reset and pause alone):
    # a reset of the running requests lets r0 take a table of 15 blocks again with the pool
    # far from full; the checker's pool, cut to one table per arrival, ran out of never-used
    # blocks a block early (was: a false S9_kv_ownership)
    "033_reset_takes_tables_again.jsonl",
]


@pytest.mark.parametrize("name", TRACES)
@pytest.mark.parametrize("full", [False, True])
def test_check_trace_accepts_vllms_trace_of_the_pair(name: str, full: bool) -> None:
    result = check_events(read_trace_file(DATA / name), None, full=full)
    assert result.ok, (result.property, result.message)


# (workload, vLLM's trace, the reference's profile)
WORKLOADS = [
    # seed 5 index 42 (sync): after the reset r1 (priority 1) is admitted before r0 (priority 2);
    # the reference put the reset requests back at the head of `waiting` in running order
    ("034_priority_reset_order.workload.json", "034_priority_reset_order.jsonl", "vllm-0.34"),
]


@pytest.mark.parametrize("workload,trace,profile", WORKLOADS)
def test_the_reference_decides_as_vllm_did(workload: str, trace: str, profile: str) -> None:
    raw = json.loads((DATA / workload).read_text())
    ours = decisions(run_reference(raw, profile).events, block_offset=1)
    assert ours == decisions(read_trace(DATA / trace))


@pytest.mark.parametrize("name", TRACES)
def test_the_streaming_checker_accepts_it_too(name: str) -> None:
    lines = (DATA / name).read_text().splitlines()
    assert list(check_lines(lines))[-1].result.ok


# The campaign workloads (seed, index) where each pair's fixes were found, on
# the release and with the inputs during waits of that campaign: the pair meets
# in each, and vLLM's real scheduler agrees with the reference and check-trace.
FOUND = {("0.34.0", True): [(6, 87), (5, 42), (5, 64), (5, 8)],
         ("0.33.0", False): [(5, 94), (5, 104)]}
# Those the generator now draws otherwise (the KV connector has met cache-aware order and
# drafts since: tests/test_kv_feature_pairs.py; sessions have met prefix caching and drafts:
# tests/test_vllm_session_cache_pairs.py), kept as that campaign drew them.
AS_DRAWN = {("0.34.0", 5, 42): "034_priority_reset_order.workload.json",
            ("0.34.0", 5, 8): "034_reset_drafts_seed5_8.workload.json",
            ("0.34.0", 6, 87): "034_grammar_priority_seed6_87.workload.json",
            ("0.33.0", 5, 94): "033_reset_tables_seed5_94.workload.json",
            ("0.33.0", 5, 104): "033_grammar_pause_empty_batch_seed5_104.workload.json"}


def _found_workload(version: str, mid_step_inputs: bool, seed: int, index: int) -> dict:
    if (version, seed, index) in AS_DRAWN:
        return json.loads((DATA / AS_DRAWN[(version, seed, index)]).read_text())
    from flightcheck.vllm.lora_workload import without_lora_features   # the workloads as found

    return without_lora_features(campaign_workloads(seed, index + 1, mid_step_inputs=mid_step_inputs,
                                                    features_of=version)[index])


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version,mid_step_inputs", sorted(FOUND))
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_the_pairs_workloads_agree_with_vllm(version: str, mid_step_inputs: bool, async_scheduling: bool) -> None:
    if os.environ.get("FLIGHTCHECK_SKIP_VLLM"):
        pytest.skip("FLIGHTCHECK_SKIP_VLLM")
    from flightcheck.vllm.campaign import DISAGREEMENTS, run_version

    workloads = [_found_workload(version, mid_step_inputs, seed, index)
                 for seed, index in FOUND[(version, mid_step_inputs)]]
    assert all(len(set(w["features"]) & {"priority", "grammar", "reset-pause", "spec-decoding"}) >= 2
               for w in workloads)
    report = run_version(version, workloads, 0, False, lambda line: None, async_scheduling)
    assert report.workloads == len(workloads) and report.unexplained == []
    assert not set(report.verdicts) & DISAGREEMENTS, dict(report.verdict_details)


def test_a_reused_id_arrives_after_its_abort_whatever_moved_the_arrivals() -> None:
    """`--reuse-ids --all-features`: the cache-aware and unchunked families and
    the connector move arrivals, once putting a reuse ahead of the request it
    takes the id from, which the workload reader refuses (seed 32 index 33 of
    0.34.0 with drafts stopped the campaign; 218 of 8,000 workloads of seeds
    0-19 were refused before the fix). Beside a KV connector no id is reused:
    an aborted request held for its transfer is still vLLM's ("duplicate
    request id", seed 33 index 0)."""
    from flightcheck.vllm.workload import workload_from_json

    for version in ("0.34.0", "0.33.0"):
        for workload in campaign_workloads(0, 80, reuse_ids=True, spec_tokens=2, features_of=version):
            workload_from_json(workload)
            by_id = {r["id"]: r for r in workload["requests"]}
            if "kv_connector" in workload["config"]:     # its aborted requests may stay live in vLLM
                assert not any("reuse_id" in r for r in workload["requests"]), workload["name"]
            for request in workload["requests"]:
                if "reuse_id" in request:
                    old = by_id[request["reuse_id"]]
                    assert request["arrival_step"] >= max(old["arrival_step"], old.get("abort_step", 0))
