"""check-trace's verdicts on vLLM's real scheduler with a KV connector equal
vLLM's ground truth (issue 36): a 30-workload `flightcheck vllm campaign
--kv-connector` per version, sync and async. A run vLLM's own state shows
wrong is rejected, every other run accepted; none is malformed.
docs/kv-connector.md, "Checked against vLLM", has the 300-workload figures.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flightcheck.vllm.campaign import DISAGREEMENTS, run_version
from flightcheck.vllm.generate import campaign_workloads
from flightcheck.vllm.versions import release

from .vllm_support import require_venv

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("both_checkers")]


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_check_trace_verdicts_equal_vllms_ground_truth_with_a_kv_connector(version):
    require_venv(version)
    workloads = campaign_workloads(1, 30, family="kv-connector",
                                   mid_step_inputs=release(version).engine_loop == "0.34")
    for async_scheduling in (False, True):
        report = run_version(version, workloads, 1, False, lambda line: None, async_scheduling)
        assert report.workloads == 30
        disagreements = {k: n for k, n in report.verdicts.items() if k in DISAGREEMENTS}
        assert not disagreements, (version, async_scheduling, dict(report.verdict_details))
        assert report.verdicts["accepted, correct run"] > 0


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_a_sharer_whose_rollback_counts_a_later_batch_is_a_bug_even_when_aborted_before_it_lands(version):
    """`campaign --all-features --versions 0.34.0,0.33.0 --seed 22`, index 7 (sync,
    3 stages): r2 shares r0's failed block through its prefix hit; vLLM sets it
    back to its counter less the failing batch's tokens (15), counting batches 2
    and 3 still in flight; r2 is aborted before batch 3's token would show it.
    vLLM's ground truth now flags the rollback itself, as check-trace does (a
    false KV3 rejection before: the ground truth saw only an appended token)."""
    require_venv(version)
    workload = json.loads((Path(__file__).parent / "data" / "vllm" / "kv" /
                           "sharer-aborted-after-rollback.json").read_text())
    report = run_version(version, [workload], 1, False, lambda line: None, False)
    assert dict(report.verdicts) == {"rejected, real bug": 1}, dict(report.verdict_details)
    (detail,) = report.verdict_details
    assert "sharing the invalid blocks of a failed KV load" in detail and "KV3_rollback" in detail, detail
