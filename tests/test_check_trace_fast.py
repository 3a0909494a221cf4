"""The fast path (verification/traces/fast.py) gives the incremental
checker's verdict, property, event, line, message and state before the
event: on generated traces of every profile (the fast path engages between
their arrivals and finishes), on the cost benchmark's decode workload, and
on traces damaged where the fast path would take the event (a violation is
reported at the same event with the same property and message). Every other
trace the suite checks goes through both too (conftest.py,
`differential_check_events`), and through the streaming checker, whose
default it is."""

from __future__ import annotations

import io
import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightcheck.verification.traces import check as check_module
from flightcheck.verification.traces.check import FastChecker, MalformedTrace, read_events
from flightcheck.verification.traces.stream import check_lines

from .fixtures import load_benchmark

write_long_trace = load_benchmark("long_traces").write_long_trace
EOS = load_benchmark("long_traces").EOS

PROFILES = [("vllm-0.8.5", True), ("vllm-0.8.5", False), ("vllm-0.8.4", True), ("vllm-0.33", True)]


def long_events(concurrency: int, num_events: int, seed: int, profile: str = "vllm-0.8.5",
                prefix_caching: bool = True, **options) -> list[dict]:
    sink = io.StringIO()
    write_long_trace(sink, concurrency, num_events, seed=seed, continue_prefill=None, profile=profile,
                     prefix_caching=prefix_caching, **options)
    return read_events(sink.getvalue().split("\n"))


def whole_outcome(events: list[dict], fast: bool) -> tuple:
    try:
        r = check_module.check_events([dict(e) for e in events], fast=fast)
    except MalformedTrace as err:
        return ("malformed", str(err))
    return (r.ok, r.events, r.event_index, r.property, r.message, tuple(r.unchecked), r.line, r.event,
            r.state_before, r.profile)


def streamed_outcome(events: list[dict], fast: bool) -> tuple:
    lines = [json.dumps(e) for e in events]
    v = list(check_lines(lines, fast=fast))[-1]
    if v.result is None:
        return ("malformed", v.malformed)
    r = v.result
    return (r.ok, r.event_index, r.property, r.message, tuple(r.unchecked), r.line, r.event, r.state_before)


def assert_fast_agrees(events: list[dict]) -> tuple:
    """The fast checker's outcome is the incremental checker's, whole and streamed."""
    fast, slow = whole_outcome(events, True), whole_outcome(events, False)
    assert fast == slow
    assert streamed_outcome(events, True) == streamed_outcome(events, False)
    return fast


def fast_events_taken(events: list[dict]) -> int:
    checker = FastChecker(events)
    check_module._annotate_finishes(events)
    for event in events[1:]:
        checker.upcoming_finish = event.get("_finishes", {})
        checker.feed(event)
    return checker.fast_events


@pytest.mark.parametrize("profile, prefix_caching", PROFILES)
def test_fast_path_agrees_on_long_traces_of_each_profile(profile, prefix_caching):
    events = long_events(10, 500, seed=2, profile=profile, prefix_caching=prefix_caching,
                         block_size=4, repeated_prompts=0.3, pool_share=0.6)
    assert assert_fast_agrees(events)[0] is True
    taken = fast_events_taken(events)
    if profile == "vllm-0.8.5":
        assert taken > 100                     # it engaged between arrivals and finishes
    else:
        assert taken == 0                      # 0.8.4's gate and preallocation, 0.33's counters: the spec's


def decode_events(num_requests: int, batches: int) -> tuple[list[dict], int]:
    """The cost benchmark's decode workload (benchmarks/workload_traces.py), small."""
    traces = load_benchmark("workload_traces")
    sink = io.StringIO()
    trace = traces.write_workload_trace(f"decode-{num_requests}", batches, sink)
    return read_events(sink.getvalue().split("\n")), trace.warm_up_events


def test_fast_path_takes_the_steady_decode_state_and_agrees():
    events, warm_up = decode_events(24, 12)
    assert assert_fast_agrees(events)[0] is True
    assert fast_events_taken(events) >= len(events) - warm_up      # every timed event on the fast path


def damaged_at_fast_event(events: list[dict], rng: random.Random) -> tuple[list[dict], int]:
    """A copy with one damage at a schedule or complete event past the middle
    (where the fast path would take it): its index."""
    events = [json.loads(json.dumps(e)) for e in events]
    candidates = [i for i, e in enumerate(events) if i > len(events) // 2 and e["ev"] in ("schedule", "complete")
                  and (e.get("entries") or e.get("tokens"))]
    for _ in range(200):
        index = rng.choice(candidates)
        event = events[index]
        if event["ev"] == "schedule":
            entries = event["entries"]
            entry = rng.choice(entries)
            damage = rng.choice(["start", "n", "drop", "blocks", "samples", "preempt", "swap"])
            if damage == "start":
                entry["start"] += rng.choice([-1, 1])
            elif damage == "n":
                entry["n"] += 1
            elif damage == "drop":
                entries.remove(entry)
            elif damage == "blocks" and entry.get("block_ids"):
                entry["block_ids"][-1] = entry["block_ids"][-1] + 100_000
            elif damage == "samples":
                entry["samples"] = not entry.get("samples", True)
            elif damage == "preempt":
                event["preempted"] = [entry["req"]]
            elif damage == "swap" and len(entries) > 1:
                entries.reverse()
            else:
                continue
            return events, index
        tokens = event["tokens"]
        name = rng.choice(sorted(tokens))
        damage = rng.choice(["stop", "extra", "none", "batch"])
        if damage == "stop":
            tokens[name] = [EOS]
        elif damage == "extra":
            tokens[name] = tokens[name] + [1001]
        elif damage == "none":
            del tokens[name]
        elif event.get("batch") is not None:
            event["batch"] += 1
        else:
            continue
        return events, index
    raise AssertionError("no damage applied")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), block_size=st.sampled_from([1, 4, 16]), caching=st.booleans())
def test_fast_path_agrees_on_traces_damaged_where_it_runs(seed, block_size, caching):
    events = long_events(6, 400, seed=seed % 50, prefix_caching=caching, block_size=block_size,
                         repeated_prompts=0.3, pool_share=0.6)
    bad, index = damaged_at_fast_event(events, random.Random(seed))
    verdict = assert_fast_agrees(bad)
    if verdict[0] is False:
        assert verdict[2] >= index              # nothing before the damage is rejected
