"""The differential names vLLM's padding crash (tests/test_vllm_hunt34_cases.py,
`prefix-hit-padded-past-long-prefill-threshold`): vLLM 0.33 and 0.34's
`Scheduler.schedule` pads an admission with one token left to 1 + k tokens,
`long_prefill_token_threshold` then cuts it, and the waiting loop's `assert
num_new_tokens == 1 + self.num_spec_tokens` fails (0.34.0 scheduler.py:1643,
0.33.0 :1579). The reference schedules the cut admission with the drafts that
fit; as released (reference/profiles.py `padding_asserted_whole`) it fails
the same assertion at the same schedule.

Both cases were recorded on vLLM by `flightcheck vllm campaign --versions
0.34.0,0.33.0 --all-features --spec-tokens 3 --stages 1 --workloads 80 --seed
103` (the differential's unexplained runs before): index 76 on 0.34.0 async
(the plain waiting loop) and index 33 on 0.33.0 sync (a KV connector's sync
load leaves one token: reference/kv_waiting.py). No vLLM is needed here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flightcheck.vllm.differential import compare, decisions, profile_for, read_trace, run_reference

pytestmark = pytest.mark.usefixtures("both_checkers")   # (its prose names the campaign; no trace is checked)

DATA = Path(__file__).parent / "data" / "vllm" / "hunt34"
CASES = [("034_async_padded_admission_cut_by_threshold_seed103_76", "0.34.0", True, 1643),
         ("033_sync_kv_padded_admission_cut_by_threshold_seed103_33", "0.33.0", False, 1579)]


def _vllm_result(version: str, async_scheduling: bool, exception: str) -> dict[str, Any]:
    """What the replay said of the recorded run, as far as the comparison reads it."""
    return {"vllm_version": version, "async_scheduling": async_scheduling, "ending": "exception",
            "exception": exception, "ground_truth": {}}


def _padding_assertion(line: int) -> str:
    return (f"AssertionError at vllm/v1/core/sched/scheduler.py:{line} in schedule: "
            "assert num_new_tokens == 1 + self.num_spec_tokens")


@pytest.mark.parametrize("stem,version,async_scheduling,line", CASES)
def test_the_released_reference_fails_the_padding_assertion_where_vllm_does(stem, version, async_scheduling, line):
    raw = json.loads((DATA / f"{stem}.workload.json").read_text())
    theirs = decisions(read_trace(DATA / f"{stem}.jsonl"))
    conforming = run_reference(raw, profile_for(version, async_scheduling), vllm_outputs=True)
    assert conforming.ending == "exception"
    assert "assert num_new_tokens == 1 + self.num_spec_tokens" in str(conforming.exception)
    assert decisions(conforming.events, block_offset=1) == theirs
    # the reference itself schedules the cut admission (3 tokens: 1 + 2 drafts) and runs on
    ours = run_reference(raw, profile_for(version, async_scheduling))
    assert ours.ending == "done"
    cut = decisions(ours.events, block_offset=1)[len(theirs)]
    assert cut[0] == "schedule" and any(entry[2] == 3 and entry[7] == 2 for entry in cut[1])


@pytest.mark.parametrize("stem,version,async_scheduling,line", CASES)
def test_vllms_padding_crash_is_a_named_deviation(stem, version, async_scheduling, line):
    raw = json.loads((DATA / f"{stem}.workload.json").read_text())
    events = read_trace(DATA / f"{stem}.jsonl")
    profile = profile_for(version, async_scheduling)
    ours, released = run_reference(raw, profile), run_reference(raw, profile, vllm_outputs=True)
    result = _vllm_result(version, async_scheduling, _padding_assertion(line))
    comparison = compare(raw["name"], result, events, ours, released)
    assert (comparison.deviation, comparison.explained) == ("padded_admission_cut_by_threshold", True), \
        comparison.describe()
    # a conforming run that does not raise there explains nothing
    comparison = compare(raw["name"], result, events, ours, ours)
    assert (comparison.deviation, comparison.explained) == ("padded_admission_cut_by_threshold", False)
    assert "did not fail the padding's assertion" in comparison.describe()
    # nor does a crash of vLLM's elsewhere
    other = _vllm_result(version, async_scheduling, "AssertionError at vllm/v1/core/sched/scheduler.py:1 in schedule")
    assert not compare(raw["name"], other, events, ours, released).explained
