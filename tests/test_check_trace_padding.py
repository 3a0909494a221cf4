"""check-trace on vLLM 0.34's padding of admitted decodes with drafts
(spec/drafts.py `padded_admission`): the running loop's `prefill_scheduled
|= request.is_prefill_chunk` (`Scheduler.schedule`) reads the flag the
request's previous schedule left (`Scheduler._update_after_schedule`), which
the spec keeps (`keeps_prefill_chunk_flag`).

The trace is vLLM 0.34.0's own (`flightcheck vllm replay --vllm-version
0.34.0` on the workload beside it): budget 3, k = 2, a 7-token prompt taken
in chunks of 3, then a 1-token prompt arrives. a's second chunk stopped one
token short of its prompt, so it is still a prefill chunk when its last
prompt token is scheduled, and vLLM admits b beside it unpadded. The checker
rejected this trace while the spec derived the flag from the counters (no
entry in flight: one token short read as a decode, so it padded b to 1 + k,
found that over the budget left and admitted nothing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flightcheck.verification.traces.check import check_events

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

TRACE = (Path(__file__).parent / "data" / "vllm" / "traces-0.34"
         / "drafts-unpadded-beside-a-prompts-last-token.jsonl")


def _events() -> list[dict]:
    return [json.loads(line) for line in TRACE.read_text().splitlines() if line.strip()]


def _batch(events: list[dict], number: int) -> dict:
    return next(e for e in events if e["ev"] == "schedule" and e.get("batch") == number)


def test_vllm_admits_a_one_token_prompt_unpadded_beside_a_prompts_last_token() -> None:
    events = _events()
    assert events[0]["vllm_version"] == "0.34.0" and events[0]["num_spec_tokens"] == 2
    assert [(x["req"], x["start"], x["n"]) for x in _batch(events, 2)["entries"]] == [("a", 3, 3)]
    assert [(x["req"], x["start"], x["n"], x["drafts"]) for x in _batch(events, 3)["entries"]] == [
        ("a", 6, 1, 0), ("b", 0, 1, 0)]                   # b unpadded: a was still a prefill chunk
    result = check_events(events)
    assert result.ok, result.message


def test_leaving_the_one_token_prompt_out_is_rejected() -> None:
    """The same trace with b left out of the third batch (what the spec's old
    padding rule scheduled): the checker now says b would be admitted."""
    events = _events()
    third = _batch(events, 3)
    third["entries"] = [x for x in third["entries"] if x["req"] == "a"]
    result = check_events(events)
    assert not result.ok and result.property == "schedule_decision"
    assert events[result.event_index] is third
