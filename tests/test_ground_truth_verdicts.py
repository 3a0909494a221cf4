"""verification/traces/ground_truth.py's `expected_verdict` (what
scripts/vllm-verdicts.py and scripts/engine-evidence.py compare check-trace
with) against check-trace on every kept vLLM run whose result carries the
whole ground truth: they agree, but for the runs where check-trace rejects
before the event the ground truth names (each kept for that reason)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flightcheck.verification.traces.check import check_trace
from flightcheck.verification.traces.ground_truth import expected_verdict
from flightcheck.verification.traces.reading import read_trace_file

from .vllm_support import DATA

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

# check-trace rejects at an earlier event than the ground truth's record:
EARLIER_THAN_THE_GROUND_TRUTH = {
    # 0.8.4's negative slice: the schedule that caches the unwritten block, before the hit the truth names
    "084_sync_negative_count_caches_the_first_block_seed376_149",
}


def _kept_runs() -> list[Path]:
    runs = []
    for result in sorted(DATA.rglob("*.result.json")):
        trace = result.with_name(result.name.replace(".result.json", ".jsonl"))
        truth = json.loads(result.read_text()).get("ground_truth", {})
        if trace.exists() and "partial_chunk_tokens" in truth:
            runs.append(trace)
    return runs


KEPT = _kept_runs()


def test_the_kept_runs_cover_livelocks_invalid_and_unwritten_kv_and_stalls() -> None:
    names = " ".join(p.name for p in KEPT)
    assert len(KEPT) >= 40
    for kind in ("livelock", "invalid_kv", "priority_preempts_a_scheduled_chunk", "stall"):
        assert kind in names, kind


@pytest.mark.parametrize("trace", KEPT, ids=lambda p: p.stem[:60])
def test_expected_verdict_agrees_with_check_trace(trace: Path) -> None:
    result = json.loads(trace.with_name(trace.stem + ".result.json").read_text())
    expected = expected_verdict(result, read_trace_file(str(trace)))
    verdict = check_trace(trace)
    if trace.stem in EARLIER_THAN_THE_GROUND_TRUTH:
        assert not verdict.ok and expected.kind == "bug" and verdict.event_index < expected.earliest
    else:
        assert expected.agrees(verdict), (expected, verdict.property, verdict.event_index)
