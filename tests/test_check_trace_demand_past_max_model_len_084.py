"""A false rejection of vLLM 0.8.4's correct run with drafts near
max_model_len (campaign `--versions 0.8.4 --spec-tokens 3 --stages 1
--workloads 120 --seed 305`, workload index 43), kept in
tests/data/vllm/drafts-past-max-model-len so these tests need no vLLM.

vLLM 0.8.4's `Scheduler.schedule` running loop clips `num_tokens_with_spec -
num_computed_tokens` by the long-prefill threshold and the budget only;
0.8.5 added the `max_model_len - num_computed_tokens` clip ("necessary when
using spec decoding"). So 0.8.4's `KVCacheManager.allocate_slots` is asked
for blocks for every held draft: r4, 29 of 30 tokens computed, 3 drafts held,
max_model_len 31, block_size 2, its 16 blocks all the pool has, needs a 17th
for 33 tokens, gets none, and is preempted (then resumed on its prefix hit).
The spec clipped as 0.8.5 does (r4@29+2, one draft, 16 blocks: it fits) and
rejected vLLM's preemption as `schedule_decision`, though the ground truth
finds nothing (no position past max_model_len was scheduled). The spec's
0.8.4 profile now has `demands_blocks_past_max_model_len`
(spec/drafts.py `unclipped_demand_fits`); it still clips the entry when the
blocks can be had, so scheduling past max_model_len (0.8.4's bug) stays a
rejection.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from flightcheck.spec import profiles as spec_profiles
from flightcheck.verification.traces.check import check_events
from flightcheck.verification.traces.reading import read_trace_file

pytestmark = pytest.mark.usefixtures("both_checkers")   # check-trace on vLLM's trace: both checkers compared

TRACE = Path(__file__).parent / "data" / "vllm" / "drafts-past-max-model-len" / "084_demand_past_max_model_len.jsonl"


def _preemption_index(events: list[dict[str, Any]]) -> int:
    """The schedule event where vLLM preempted r4 and scheduled nothing."""
    return next(i for i, event in enumerate(events)
                if event["ev"] == "schedule" and event["preempted"] == ["r4"] and not event["entries"])


def test_the_trace_shows_a_preemption_for_drafts_past_max_model_len() -> None:
    """What the docstring says: the config, and r4 holding 3 drafts at 29 of
    max_model_len 31 computed (its last entry ended at 29) when preempted."""
    events = [json.loads(line) for line in TRACE.read_text().splitlines()]
    config = events[0]
    assert (config["vllm_version"], config["num_spec_tokens"], config["num_stages"]) == ("0.8.4", 3, 1)
    assert (config["max_model_len"], config["block_size"], config["usable_blocks"]) == (31, 2, 16)
    index = _preemption_index(events)
    last = next(e for e in reversed(events[:index]) if e["ev"] == "schedule" and e["entries"])
    entry = last["entries"][0]
    assert entry["req"] == "r4" and entry["start"] + entry["n"] == 29 and entry["drafts"] == 3
    assert events[index - 1]["ev"] == "complete" and events[index - 1]["next_drafts"] == {"r4": 3}


@pytest.mark.parametrize("full", [False, True])
def test_check_trace_accepts_vllm_0_8_4s_preemption(full: bool) -> None:
    result = check_events(read_trace_file(TRACE), None, full=full)
    assert result.ok, (result.property, result.message)


def _scheduled_clipped(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The trace cut where vLLM preempted r4, with that event replaced by
    0.8.5's decision (r4 clipped to max_model_len: 2 tokens, 1 draft), which
    the blocks r4 holds would allow; and that event's index."""
    index = _preemption_index(events)
    event = json.loads(json.dumps(events[index]))
    event.update(batch=12, preempted=[], entries=[{"req": "r4", "start": 29, "n": 2, "cached": 0, "drafts": 1,
                                                   "samples": True, "block_ids": []}])
    return [*events[:index], event], index


@pytest.mark.parametrize("full", [False, True])
def test_the_clipped_schedule_is_rejected_under_0_8_4(full: bool) -> None:
    """The rule can fail: under 0.8.4 the clipped entry is a wrong decision
    (vLLM asks for the blocks of all 3 drafts and cannot have them)."""
    events, index = _scheduled_clipped(read_trace_file(TRACE))
    result = check_events(events, None, full=full)
    assert not result.ok and result.property == "schedule_decision", (result.property, result.message)
    assert result.event_index == index, result.message


@pytest.mark.parametrize("full", [False, True])
def test_without_the_rule_the_verdicts_swap(full: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the tests above see is the rule's doing: with 0.8.5's clip alone
    the clipped entry is accepted and vLLM 0.8.4's preemption rejected, at
    the same event (the false rejection this module was kept for)."""
    name = "vllm-0.8.4"
    monkeypatch.setitem(spec_profiles.PROFILES, name,
                        replace(spec_profiles.PROFILES[name], demands_blocks_past_max_model_len=False))
    events, index = _scheduled_clipped(read_trace_file(TRACE))
    clipped = check_events(events, None, full=full)
    assert clipped.ok, (clipped.property, clipped.message)
    vllms = check_events(read_trace_file(TRACE), None, full=full)
    assert not vllms.ok and vllms.property == "schedule_decision" and vllms.event_index == index, vllms.message
