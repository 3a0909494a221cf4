"""The known false rejection of vLLM 0.8.x's held drafts (flightcheck/vllm/README.md,
"Speculative decoding"; tests/test_vllm_spec_decode.py replays it), at its smallest.

vLLM 0.8.x keeps a request's unscheduled drafts, through preemption too
(`Scheduler.schedule` trims `spec_token_ids` only when some were scheduled;
the preemption resets only the status and `num_computed_tokens`), and its
`KVCacheManager.allocate_slots` caches `num_computed_tokens + num_tokens -
len(request.spec_token_ids)` tokens: every draft the request holds is left
out, scheduled or not. A resumed request that holds drafts thus caches one
block fewer than its known tokens fill; preempted again, it hits fewer
blocks on its next resumption. The reference models this (its 0.8.x
profile's `drafts_kept_through_preemption` and `held_drafts_left_uncached`,
the differential's named `unscheduled_drafts_dropped`), and so does the spec
now (its 0.8.x profiles' `held_drafts_left_uncached`, spec/drafts.py). Before,
it cleared a preempted request's drafts and left only the scheduled drafts
uncached, so check-trace rejected vLLM's correct run (schedule_decision at
the second resumption: the spec hit 8 tokens, vLLM 6).

Reached again at a deployment's scale (tests/test_vllm_realistic_scale.py,
vLLM 0.8.4, one draft, a tight pool) and by the campaign's own generator
(`campaign_workloads(5, 60, spec_tokens=2)` index 57 on 0.8.4), that one cut
to three requests and 43 events; its trace and workload are kept in
tests/data/vllm/held-drafts, so these tests need no vLLM.
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

DATA = Path(__file__).parent / "data" / "vllm" / "held-drafts"
TRACE = DATA / "084_held_drafts_uncached.jsonl"
WORKLOAD = DATA / "084_held_drafts_uncached.workload.json"


def test_the_trace_shows_a_resumption_that_holds_drafts() -> None:
    """The trace is what the docstring says: r2 gets 2 drafts with a
    completion, is preempted before they are scheduled, and resumes with no
    drafts scheduled."""
    events = [json.loads(line) for line in TRACE.read_text().splitlines()]
    assert events[0]["vllm_version"] == "0.8.4" and events[0]["num_spec_tokens"] == 2
    held = False
    resumed_holding = 0
    for event in events:
        if event["ev"] == "complete":
            held = event.get("next_drafts", {}).get("r2", 0) > 0 or (held and "r2" not in event["tokens"])
        if event["ev"] == "schedule":
            for entry in event["entries"]:
                if entry["req"] == "r2" and entry["cached"] > 0 and held and entry["drafts"] == 0:
                    resumed_holding += 1
    assert resumed_holding >= 1


@pytest.mark.parametrize("full", [False, True])
def test_check_trace_accepts_vllm_0_8_4s_resumption_with_held_drafts(full: bool) -> None:
    result = check_events(read_trace_file(TRACE), None, full=full)
    assert result.ok, (result.property, result.message)


def _with_held_draft_cached(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The trace as a vLLM that cached r2's held drafts' block would have
    written it: r2's second resumption hits 8 tokens (the spec's old count),
    not 6, and schedules the one token left; and that event's index."""
    resumptions = [i for i, event in enumerate(events) if event["ev"] == "schedule"
                   and any(x["req"] == "r2" and x["cached"] > 0 for x in event["entries"])]
    index = resumptions[-1]
    event = json.loads(json.dumps(events[index]))
    entry = next(x for x in event["entries"] if x["req"] == "r2")
    assert (entry["start"], entry["n"], entry["cached"]) == (6, 3, 6)
    entry.update(start=8, n=1, cached=8)
    return [*events[:index], event, *events[index + 1:]], index


def _without_the_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM 0.8.4's profile with 0.33's caching rule: drafts cleared at a
    preemption, only the scheduled ones left uncached."""
    name = "vllm-0.8.4"
    monkeypatch.setitem(spec_profiles.PROFILES, name,
                        replace(spec_profiles.PROFILES[name], held_drafts_left_uncached=False))


@pytest.mark.parametrize("full", [False, True])
def test_a_held_draft_cached_is_rejected_at_the_resumption_that_hits_it(full: bool) -> None:
    """The rule can fail: a resumption that hits the block of drafts its
    request held at its last allocation is not vLLM 0.8.4's."""
    events, index = _with_held_draft_cached(read_trace_file(TRACE))
    result = check_events(events, None, full=full)
    assert not result.ok and result.property == "schedule_decision", (result.property, result.message)
    assert result.event_index == index, result.message


@pytest.mark.parametrize("full", [False, True])
def test_without_the_rule_the_verdicts_swap(full: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the two tests above see is the rule's doing: under 0.33's rule
    the held draft cached is accepted and vLLM 0.8.4's run rejected, at the
    same resumption (the false rejection this module was kept for)."""
    _without_the_rule(monkeypatch)
    events, index = _with_held_draft_cached(read_trace_file(TRACE))
    cached = check_events(events, None, full=full)
    assert cached.ok, (cached.property, cached.message)
    vllms = check_events(read_trace_file(TRACE), None, full=full)
    assert not vllms.ok and vllms.property == "schedule_decision" and vllms.event_index == index, vllms.message


@pytest.mark.vllm
@pytest.mark.slow
def test_the_workload_is_accepted_on_vllm_0_8_4() -> None:
    """The replay of the kept workload: vLLM's ground truth finds no bug,
    r2 is admitted holding drafts, check-trace accepts (it rejected before
    the spec modelled held drafts), and the reference, whose 0.8.x profiles
    leave held drafts uncached too, differs from vLLM at most by a named
    deviation."""
    from flightcheck.vllm.campaign import ReplayJob, replay_workload
    from flightcheck.vllm.replay import ReplayWorker

    from .vllm_support import require_venv
    require_venv("0.8.4")
    workload = json.loads(WORKLOAD.read_text())
    with ReplayWorker("0.8.4") as worker:
        replayed = replay_workload(worker, ReplayJob("0.8.4", False, 0, workload, 5))
    assert replayed.category == "accepted, correct run", replayed.detail
    held = {item["req"] for item in replayed.result["ground_truth"].get("drafts_held_at_admission", ())}
    assert "r2" in held, replayed.result["ground_truth"]
    comparison = replayed.comparison
    assert comparison is not None and (comparison.equal or comparison.explained), comparison.describe()
