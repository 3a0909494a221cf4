"""check-trace on vLLM 0.34's drafts under synchronous scheduling with one
stage (verification/traces/drafts.py), where the drafts `EngineCore.post_step`
hands over come after the completion, so no event shows them until a batch
schedules them. Two traces of vLLM 0.34.0, each with its workload:

1. `session-drafts-replaced-after-completion`: they replace what a request
   held when the output was applied, which is what the trace's
   `next_drafts` shows (`_drafts_after_completion`);
2. `one-stage-preempted-for-its-unseen-drafts`: a request preempted because
   its unseen drafts need a block the pool no longer has
   (`_hand_over_unseen_drafts`).

Both were found on adversarial workloads beside the campaign's generator
(one stage, which the generator never draws, with drafts), each a false
`schedule_decision` before the fix.

Trace 1. With one batch in flight at most, the engine step that completes a batch
also submitted it, and `EngineCore.post_step` then hands the scheduler that
batch's drafts (`Scheduler.update_draft_token_ids`), after
`update_from_output`: they replace what each request held when the output
was applied, which is what the recorder writes as `next_drafts`. Such a
leftover arises for a streaming session: its turn's last token parks it
(`_handle_stopped_request` clears its drafts), and the same step's
`post_step` gives the parked request that batch's drafts (only finished
requests are skipped). The waiting loop admits its next turn without
reading them, so they are still held when that turn's first batch completes.

The trace is vLLM 0.34.0's own (`flightcheck vllm replay --vllm-version
0.34.0` on the workload beside it): k = 2, a session of two turns. Batch 3
(the second turn's prompt) completes with the parked turn's 2 drafts left
over; post_step then gives 1, which batch 4 schedules. The checker rejected
this trace (`schedule_decision`: the spec scheduled the 2 leftover drafts)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from flightcheck.verification.traces.check import check_events
from flightcheck.vllm.campaign import ReplayJob, replay_workload

from .vllm_support import Workers, workers

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

TRACES = Path(__file__).parent / "data" / "vllm" / "traces-0.34"
STEM = TRACES / "session-drafts-replaced-after-completion"
PREEMPTED = TRACES / "one-stage-preempted-for-its-unseen-drafts"


def _events(stem: Path = STEM) -> list[dict]:
    return [json.loads(line) for line in stem.with_suffix(".jsonl").read_text().splitlines() if line.strip()]


def _event(events: list[dict], ev: str, batch: int) -> dict:
    return next(e for e in events if e["ev"] == ev and e.get("batch") == batch)


def test_drafts_post_step_gives_after_a_one_stage_completion_replace_its_leftovers() -> None:
    events = _events()
    assert events[0]["vllm_version"] == "0.34.0" and events[0]["num_stages"] == 1
    assert events[0]["num_spec_tokens"] == 2
    assert _event(events, "complete", 3)["next_drafts"] == {"a": 2}        # the parked turn's leftovers
    assert [(x["req"], x["start"], x["n"], x["drafts"]) for x in _event(events, "schedule", 4)["entries"]] == [
        ("a", 7, 2, 1)]                                                     # post_step's one draft
    result = check_events(events)
    assert result.ok, result.message


def test_post_steps_drafts_may_be_more_than_the_leftovers_but_never_more_than_k() -> None:
    events = _events()
    batch = _event(events, "schedule", 4)
    upto = events[:events.index(batch) + 1]                                 # the trace up to batch 4
    batch["entries"][0].update(n=3, drafts=2)                               # post_step gave k = 2
    result = check_events(upto)
    assert result.ok, result.message
    batch["entries"][0].update(n=4, drafts=3)                               # 3 > k
    result = check_events(upto)
    assert not result.ok and result.property == "S8_spec_accounting"
    assert upto[result.event_index] is batch


def test_a_request_preempted_for_drafts_no_event_showed_is_legal() -> None:
    """Trace 2: k = 1, 3 usable blocks of 4 tokens. After the prompts (a: 4
    tokens, b: 3), post_step gives b one draft; a takes the last free block
    for its token 4, and b's token 3 plus its draft reach position 4, a
    block the pool no longer has: vLLM preempts b (the running list's tail,
    `Scheduler.schedule`). Without the draft b's token fits its block."""
    events = _events(PREEMPTED)
    assert events[0]["vllm_version"] == "0.34.0" and events[0]["num_stages"] == 1
    second = _event(events, "schedule", 2)
    assert [(x["req"], x["start"], x["n"]) for x in second["entries"]] == [("a", 4, 1)]
    assert second["preempted"] == ["b"]
    result = check_events(events)
    assert result.ok, result.message


def test_a_preemption_no_count_of_drafts_explains_is_rejected() -> None:
    """The same trace with one more block in the pool: b's token and any
    count of drafts (k = 1) fit, so nothing explains its preemption."""
    events = _events(PREEMPTED)
    events[0].update(num_blocks=5, usable_blocks=4)
    result = check_events(events)
    assert not result.ok and result.property in ("schedule_decision", "preemption_decision")
    assert events[result.event_index] is _event(events, "schedule", 2)


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_0_34_replays_the_workloads_to_accepted_traces_of_correct_runs(running: Workers) -> None:
    for stem in (STEM, PREEMPTED):
        raw = json.loads(stem.with_suffix(".workload.json").read_text())
        replayed = replay_workload(running["0.34.0"], ReplayJob("0.34.0", False, 0, raw, 0))
        assert replayed.category == "accepted, correct run", (stem.name, replayed.detail)
        assert replayed.comparison is not None and replayed.comparison.explained, stem.name
