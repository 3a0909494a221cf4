"""check-trace on asynchronous-scheduling traces (issue 22, profile
vllm-0.33-async): the config keys that select the profile, hand-made traces
accepted or rejected at the right event with the right property, the full
and the incremental checker agreeing on each, and what a trace without empty
batches or engine steps cannot decide listed under `unchecked`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flightcheck.verification.traces.check import UnknownVersion, check_events, check_trace, config_from_event

DATA = Path(__file__).parent / "data" / "async"

# file -> (ok, event index, property)
EXPECTED = {
    "accepted.jsonl": (True, None, None),
    "accepted_steps.jsonl": (True, None, None),
    "accepted_noted.jsonl": (True, None, None),
    "rejected_stagger_noted.jsonl": (False, 3, "S6p_async_decode_gating"),
    "rejected_stagger.jsonl": (False, 3, "S6p_async_decode_gating"),
    "rejected_max_tokens.jsonl": (False, 5, "IA2_placeholders_within_max_tokens"),
    "rejected_placeholders.jsonl": (False, 2, "IA1_placeholders"),
    "rejected_output_after_stop.jsonl": (False, 6, "S7_output_binding"),
}


def test_every_async_trace_in_the_data_is_listed():
    assert {p.name for p in DATA.glob("*.jsonl")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_async_trace_gets_its_verdict_from_both_checkers(name):
    incremental = check_trace(DATA / name)
    full = check_trace(DATA / name, full=True)
    assert (incremental.ok, incremental.event_index, incremental.property) == EXPECTED[name]
    assert incremental.profile == full.profile == "vllm-0.33-async"
    assert (incremental.to_json() | {"state_before": None}) == (full.to_json() | {"state_before": None})


def _config(**keys) -> dict:
    return {"ev": "config", "num_stages": 2, "max_num_batched_tokens": 4, "block_size": 2, "num_blocks": 8,
            "max_model_len": 16} | keys


def test_async_scheduling_selects_the_async_profile_and_its_keys_override_depth_and_stagger():
    assert config_from_event(_config(vllm_version="0.33.0", async_scheduling=True)).profile == "vllm-0.33-async"
    assert config_from_event(_config(vllm_version="0.33.0", async_scheduling=False)).profile == "vllm-0.33"
    cfg = config_from_event(_config(vllm_version="0.33.0", async_scheduling=True, batch_queue_depth=2,
                                    decode_stagger=1))
    assert (cfg.queue_depth, cfg.stagger) == (2, 1)
    defaults = config_from_event(_config(vllm_version="0.33.0", async_scheduling=True))
    assert (defaults.queue_depth, defaults.stagger) == (3, 2)
    assert config_from_event(_config(), "vllm-0.33-async").profile == "vllm-0.33-async"
    for version in (None, "0.8.5"):
        keys = {"async_scheduling": True} | ({"vllm_version": version} if version else {})
        with pytest.raises(UnknownVersion, match="async"):
            config_from_event(_config(**keys))


def _events(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]


def test_engine_steps_make_the_stagger_exact_and_their_absence_is_listed_as_unchecked():
    with_steps = check_events(_events("accepted_steps.jsonl"))
    without = check_events(_events("accepted.jsonl"))
    note = "the empty schedule() calls between batches"
    assert with_steps.ok and not any(u.startswith(note) for u in with_steps.unchecked)
    assert without.ok and any(u.startswith(note) for u in without.unchecked)
    # the same decode one engine step later than the stagger allows is rejected only with steps
    events = _events("rejected_stagger.jsonl")
    assert check_events(events).property == "S6p_async_decode_gating"
    for e in events:
        e.pop("step", None)
    assert check_events([e for e in events if e["ev"] != "end"]).ok    # (no end: batches stay in flight)


def test_a_sync_profile_rejects_the_async_trace_at_its_first_decode_behind_a_decode():
    result = check_trace(DATA / "accepted.jsonl", profile="vllm-0.33")
    assert not result.ok and result.event_index == 3
