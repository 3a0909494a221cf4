"""SD1's second half and vLLM's padded admissions: the drafts a request's
entry schedules right after a batch marked `skip_drafts` are the waiting
loop's padding, not the drafts that batch skipped, when the entry admits
the request (verification/traces/skip_drafts.py).

The minimal workload (tests/data/vllm/lookahead/session-padded-turn.workload.json,
hand-written): one streaming session, k = 2 drafts with 2 lookahead slots,
a first turn of max_tokens 1 and a second turn of one token. Batch 1
samples the first turn's only token, so vLLM marks it `skip_drafts`
(`Scheduler._drafts_unused`: max_tokens reached). The turn stops, the
session takes its next input (`_handle_stopped_request`: drafts and
placeholders dropped; `_update_request_as_session`: the sampled token
dropped, the input's token appended, WAITING) and is admitted with one
token left past its computed ones: `Scheduler.schedule`'s waiting loop pads
it to 1 + k tokens with k placeholder drafts (`pad_spec_decode`, vLLM PR
#55126), which the V2 runner fills from the row it re-adds
(`GPUModelRunner.add_requests`, `RequestState.add_request`: zeroed). The
same on 0.34.0 sync and async and on 0.33.0 async (0.33.0 sync marks
nothing: its `can_skip_drafts` needs the V2 runner). vLLM is right, its
ground truth empty, and check-trace accepts the run because of that rule
alone (the first test below turns it off).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from flightcheck.spec import Config
from flightcheck.spec.state import Request, State
from flightcheck.verification.traces.check import check_events
from flightcheck.verification.traces.skip_drafts import SkipDrafts
from flightcheck.vllm.differential import decisions, profile_for, read_trace, run_reference

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

KEPT = Path(__file__).resolve().parent / "data" / "vllm" / "lookahead"
WORKLOAD = KEPT / "session-padded-turn.workload.json"
RUNS = [("0.34.0", False), ("0.34.0", True), ("0.33.0", True)]
SD1 = "SD1_skip_drafts_only_when_unused"


def _trace(version: str, async_scheduling: bool) -> Path:
    return KEPT / f"session-padded-turn-{version}-{'async' if async_scheduling else 'sync'}.jsonl"


def _raw(async_scheduling: bool) -> dict[str, Any]:
    raw = json.loads(WORKLOAD.read_text())
    raw["config"]["async_scheduling"] = async_scheduling
    return raw


def _marked_then_padded(events: list[dict[str, Any]]) -> int:
    """The index of the schedule event right after the marked one: s0's
    admission, padded (start = cached = its computed tokens, 1 + k tokens, k drafts)."""
    schedules = [i for i, e in enumerate(events) if e["ev"] == "schedule"]
    assert events[schedules[0]].get("skip_drafts")
    padded = events[schedules[1]]["entries"][0]
    assert (padded["start"], padded["cached"], padded["n"], padded["drafts"]) == (6, 6, 3, 2)
    return schedules[1]


@pytest.mark.parametrize("version, async_scheduling", RUNS)
def test_vllm_pads_the_sessions_next_turn_right_after_a_marked_turn_and_check_trace_accepts_it(
        version: str, async_scheduling: bool, monkeypatch: pytest.MonkeyPatch):
    events = read_trace(_trace(version, async_scheduling))
    padded = _marked_then_padded(events)
    assert check_events(events, None).ok
    monkeypatch.setattr(SkipDrafts, "_padded_admission", lambda self, e: False)
    result = check_events(events, None)
    assert not result.ok and result.property == SD1 and result.event_index == padded


def _schedules(decided: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [d for d in decided if d[0] == "schedule"]


@pytest.mark.parametrize("version, async_scheduling", RUNS)
def test_the_reference_schedules_as_vllm_did_the_padded_admission_included(version: str, async_scheduling: bool):
    """Every batch alike (0.34 sync's completions differ by the named
    deviation drafts_handed_over_at_submission, which the slow test's
    comparison explains)."""
    ours = run_reference(_raw(async_scheduling), profile_for(version, async_scheduling)).events
    vllm = read_trace(_trace(version, async_scheduling))
    assert _schedules(decisions(ours, block_offset=1)) == _schedules(decisions(vllm))
    if async_scheduling:
        assert decisions(ours, block_offset=1) == decisions(vllm)


class _Checker(SkipDrafts):
    """SD1's mixin on a spec state of its own: k = 2, `running` the running requests."""

    def __init__(self, request: Request, running: tuple[int, ...]) -> None:
        self.state = State(requests=(request,), running=running)
        self.cfg = Config(num_spec_tokens=2)

    @staticmethod
    def _violation(prop: str, message: str) -> Exception:
        return AssertionError(prop, message)

    def _name(self, r: int) -> str:
        return f"r{r}"


def _entry(start: int, n: int, drafts: int) -> SimpleNamespace:
    return SimpleNamespace(req=0, start=start, n=n, drafts=drafts)


def _marked(request: Request, start: int, n: int) -> _Checker:
    """A checker that has just seen request 0's entry marked skip_drafts, and the request since left running."""
    checker = _Checker(request, running=(0,))
    checker._check_skip_drafts({"skip_drafts": True}, [_entry(start, n, 0)])
    checker.state = State(requests=(request,), running=())
    return checker


@pytest.mark.parametrize("resumable", [True, False], ids=["session", "preempted"])
def test_an_admission_padded_with_k_drafts_after_a_marked_entry_is_accepted(resumable: bool):
    """A session's next turn, or a request preempted after a marked non-final
    chunk and re-admitted with one token left: the waiting loop's k
    placeholder drafts; any other count of drafts on an admission is not
    that padding and is rejected."""
    request = Request(prompt_len=8, num_output=0, max_tokens=1, resumable=resumable)
    _marked(request, 0, 8 if resumable else 6)._check_skip_drafts({}, [_entry(8 if resumable else 7, 3, 2)])
    with pytest.raises(AssertionError, match=SD1):
        _marked(request, 0, 8 if resumable else 6)._check_skip_drafts({}, [_entry(7, 2, 1)])


def test_a_sessions_running_entry_with_drafts_after_a_marked_one_is_rejected():
    """The blanket exemption of sessions is gone: a session still running
    whose entry after a marked one schedules drafts used drafts the runner
    did not propose."""
    checker = _Checker(Request(prompt_len=4, num_output=4, max_tokens=5, resumable=True), running=(0,))
    checker._check_skip_drafts({"skip_drafts": True}, [_entry(8, 1, 0)])
    with pytest.raises(AssertionError, match=SD1):
        checker._check_skip_drafts({}, [_entry(9, 3, 2)])


# -- against vLLM ----------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("version, async_scheduling", RUNS)
def test_the_minimal_workload_replays_on_vllm_to_an_accepted_correct_run(version: str, async_scheduling: bool,
                                                                        tmp_path: Path):
    """vLLM makes the kept decisions again (the marked batch, then the padded
    admission), its ground truth finds nothing, the reference is identical
    (0.34 sync: but for a named deviation), and check-trace accepts:
    'accepted, correct run'."""
    from flightcheck.vllm import ASYNC_RECORDER
    from flightcheck.vllm.campaign import check_verdict, compare_workload, verdict
    from flightcheck.vllm.replay import ReplayWorker

    from .vllm_support import require_venv
    require_venv(version)
    worker = ReplayWorker(version)
    try:
        trace = tmp_path / "trace.jsonl"
        raw = _raw(async_scheduling)
        result = worker.replay(raw, trace=str(trace), scheduler_cls=ASYNC_RECORDER if async_scheduling else None)
    finally:
        worker.close()
    events = read_trace(trace)
    assert decisions(events) == decisions(read_trace(_trace(version, async_scheduling)))
    _marked_then_padded(events)
    comparison, _ = compare_workload(raw, result, events, profile_for(version, async_scheduling))
    # 0.34 sync: the drafts of batch 2 come at submission (the named deviation), not with its completion
    expected_deviation = None if async_scheduling else "drafts_handed_over_at_submission"
    assert comparison.explained and comparison.deviation == expected_deviation, comparison.describe()
    assert verdict(result, check_verdict(trace)) == ("accepted, correct run", "accepted")
