"""check-trace on asynchronous-scheduling traces (issue 22, profile
vllm-0.33-async): the config keys that select the profile, hand-made traces
accepted or rejected at the right event with the right property, the full
and the incremental checker agreeing on each, and what a trace without empty
batches or engine steps cannot decide listed under `unchecked`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flightcheck.spec import Config, Prompt, Sample, initial_state
from flightcheck.spec.actions import complete_oldest
from flightcheck.spec.schedule import schedule
from flightcheck.verification.traces.check import (
    UnknownVersion,
    check_events,
    check_trace,
    config_from_event,
)

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

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
    assert incremental.to_json() == full.to_json()         # state_before too: both name requests alike


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


# -- the spec's own async runs, written as traces with engine steps, are accepted ------

def _spec_run_as_trace(seed: int, num_stages: int, num_blocks: int) -> list[dict]:
    """A random run of the async spec written as a trace: every schedule()
    call is an engine step; calls that queue an empty batch are not written
    (their steps are the gaps), nor are the completions of empty batches."""
    import random

    from flightcheck.spec import Abort, Arrive, step
    from flightcheck.spec.actions import sampling_entries

    rng = random.Random(seed)
    cfg = Config(num_stages=num_stages, max_num_batched_tokens=3, max_num_seqs=2, block_size=2,
                 num_blocks=num_blocks, max_model_len=10, prefix_caching=False, profile="vllm-0.33-async")
    prompts = [Prompt(rng.randint(1, 4), rng.randint(1, 4)) for _ in range(4)]
    events: list[dict] = [{"ev": "config", "num_stages": num_stages, "max_num_batched_tokens": 3,
                           "max_num_seqs": 2, "block_size": 2, "num_blocks": num_blocks, "max_model_len": 10,
                           "eos_token_id": 0, "vllm_version": "0.33.0", "async_scheduling": True}]
    state, calls, batch = initial_state(len(prompts), num_blocks), 0, 0
    arrived = 0
    for _ in range(200):
        choice = rng.random()
        if choice < 0.15 and arrived < len(prompts):
            p = prompts[arrived]
            state = step(state, cfg, Arrive(arrived, p))
            events.append({"ev": "arrive", "req": f"r{arrived}", "prompt_len": p.prompt_len,
                           "max_tokens": p.max_tokens})
            arrived += 1
        elif choice < 0.6:
            scheduled = schedule(state, cfg)
            if scheduled is None:
                continue
            calls += 1
            state = scheduled.state
            if scheduled.entries or scheduled.preempted:
                batch += 1
                events.append({"ev": "schedule", "batch": batch, "step": calls, "preempted":
                               [f"r{r}" for r in scheduled.preempted],
                               "entries": [{"req": f"r{e.req}", "start": e.start, "n": e.n, "cached": e.cached,
                                            "samples": e.samples,
                                            "placeholders": state.requests[e.req].placeholders}
                                           for e in scheduled.entries]})
        elif choice < 0.95 and state.in_flight:
            head = state.in_flight[0]
            sampling = sampling_entries(state, cfg)
            samples = tuple(Sample(stop_at=0 if rng.random() < 0.2 else None) for _ in sampling)
            before = state
            state = complete_oldest(state, cfg, samples)
            if head:
                events.append({"ev": "complete", "batch": None, "tokens": {
                    f"r{e.req}": [0 if s.stop_at == 0 else 5] for e, s in zip(sampling, samples)},
                    "dropped": [f"r{e.req}" for e in head if e.samples and e not in sampling]})
            for r, (b, a) in enumerate(zip(before.requests, state.requests)):
                if a.status.is_finished and not b.status.is_finished:
                    events.append({"ev": "finish", "req": f"r{r}",
                                   "reason": "stop" if a.status.value == "FINISHED_STOPPED" else "length"})
        elif choice >= 0.95:
            active = [r for r, q in enumerate(state.requests) if q.status.is_active]
            if active:
                r = rng.choice(active)
                state = step(state, cfg, Abort(r))
                events.append({"ev": "abort", "req": f"r{r}"})
    return events


@pytest.mark.parametrize("seed", range(12))
def test_the_async_specs_own_runs_are_accepted_by_both_checkers(seed):
    events = _spec_run_as_trace(seed, num_stages=2 + seed % 2, num_blocks=3 + seed % 3)
    assert sum(e["ev"] == "schedule" for e in events) >= 3
    incremental = check_events([dict(e) for e in events])
    full = check_events([dict(e) for e in events], full=True)
    assert incremental.ok, (incremental.event_index, incremental.property, incremental.message)
    assert incremental.to_json() == full.to_json()         # state_before too: both name requests alike


def test_the_same_runs_with_the_empty_calls_erased_from_their_steps_are_rejected_by_the_stagger():
    rejected = 0
    for seed in range(12):
        events = _spec_run_as_trace(seed, num_stages=2 + seed % 2, num_blocks=3 + seed % 3)
        schedules = [e for e in events if e["ev"] == "schedule"]
        if [e["step"] for e in schedules] == list(range(1, len(schedules) + 1)):
            continue                     # no empty call to erase
        for i, e in enumerate(schedules):
            e["step"] = i + 1
        result = check_events(events)
        assert not result.ok and result.property == "S6p_async_decode_gating"
        rejected += 1
    assert rejected >= 10


VLLM_034 = Path(__file__).parent / "data" / "vllm" / "traces-0.34"
NOTED_BEFORE_COMPLETION = VLLM_034 / "async-noted-empty-call-replayed-after-completion.jsonl"


def _noted_before_completion() -> list[dict]:
    """vLLM 0.34.0's own async run (campaign `--versions 0.34.0 --all-features
    --spec-tokens 1 --async`, seed 64, index 15; a correct run): its empty
    schedule() call at recorder step 48 ran while r1's last chunk was in
    flight, before batch 14's completion (step 49) in the same engine step;
    the next call (step 50) preempted r1."""
    return [json.loads(line) for line in NOTED_BEFORE_COMPLETION.read_text().splitlines() if line.strip()]


def test_an_empty_call_noted_on_a_completion_is_replayed_before_that_completion():
    events = _noted_before_completion()
    assert events[0]["vllm_version"] == "0.34.0"
    result = check_events(events)
    assert result.ok, (result.event_index, result.property, result.message)


def test_the_same_empty_call_noted_after_the_completion_is_rejected_by_the_running_loop_rule():
    # moved onto the next event, the call runs after batch 14 completed: r1 is then
    # running with nothing in flight and needs a block, so a call that formed nothing
    # left it out (PR3): the checker reads where the trace notes the call
    events = _noted_before_completion()
    i = next(i for i, e in enumerate(events) if e["ev"] == "complete" and e.get("batch") == 14)
    events[i + 1]["empty_batches_before"] = events[i].pop("empty_batches_before")
    result = check_events(events)
    assert not result.ok and result.property == "PR3_running_loop_skips_nothing", (result.property, result.message)
