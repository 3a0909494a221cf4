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

import functools
import io
import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightcheck.verification.traces import check as check_module
from flightcheck.verification.traces.check import FastChecker, MalformedTrace, read_events
from flightcheck.verification.traces.stream import check_lines

from .conftest import _original_check_events
from .fixtures import load_benchmark

# checks traces (its own comparisons call the checker's function directly)
pytestmark = pytest.mark.usefixtures("both_checkers")

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
        r = _original_check_events([dict(e) for e in events], fast=fast)
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
    events = long_events(10, 500 if profile == "vllm-0.8.5" else 250, seed=2, profile=profile,
                         prefix_caching=prefix_caching, block_size=4, repeated_prompts=0.3, pool_share=0.6)
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
    events, warm_up = decode_events(16, 8)
    assert assert_fast_agrees(events)[0] is True
    assert fast_events_taken(events) >= len(events) - warm_up      # every timed event on the fast path


def fast_indices(events: list[dict]) -> list[int]:
    """The events the fast path takes on `events` (legal up to them)."""
    checker, taken = FastChecker(events), []
    check_module._annotate_finishes(events)
    for index, event in enumerate(events[1:], start=1):
        checker.upcoming_finish = event.get("_finishes", {})
        before = checker.fast_events
        checker.feed(event)
        if checker.fast_events > before:
            taken.append(index)
    return taken


SCHEDULE_DAMAGES = ("start_up", "start_down", "n", "drop", "extra", "blocks", "samples", "preempt", "swap")
COMPLETE_DAMAGES = ("stop", "two_tokens", "no_token", "batch", "stray_token")
ARRIVE_DAMAGES = ("arrive_reused", "arrive_too_long")


def damage(event: dict, kind: str, rng: random.Random) -> bool:
    """Apply `kind` to a schedule or complete event; False where it does not apply."""
    if event["ev"] == "schedule" and kind in SCHEDULE_DAMAGES:
        entries = event["entries"]
        entry = rng.choice(entries)
        if kind in ("start_up", "start_down"):
            entry["start"] += 1 if kind == "start_up" else -1
        elif kind == "n":
            entry["n"] += 1
        elif kind == "drop":
            entries.remove(entry)
        elif kind == "extra":
            entries.append(dict(entry, req=entry["req"] + "x"))
        elif kind == "blocks":
            entry["block_ids"] = list(entry.get("block_ids", [])) + [100_000]
        elif kind == "samples":
            entry["samples"] = not entry.get("samples", True)
        elif kind == "preempt":
            event["preempted"] = [entry["req"]]
        elif kind == "swap" and len(entries) > 1:
            entries.reverse()
        else:
            return False
        return True
    if event["ev"] == "arrive" and kind == "arrive_too_long":
        event["prompt_len"] = 10**6                 # past max_model_len: the spec refuses the arrival
        event.pop("prompt_token_ids", None)
        return True
    if event["ev"] == "complete" and kind in COMPLETE_DAMAGES and event.get("tokens"):
        tokens = event["tokens"]
        name = rng.choice(sorted(tokens))
        if kind == "stop":
            tokens[name] = [EOS]
        elif kind == "two_tokens":
            tokens[name] = tokens[name] + [1001]
        elif kind == "no_token":
            del tokens[name]
        elif kind == "batch" and event.get("batch") is not None:
            event["batch"] += 1
        elif kind == "stray_token":
            tokens[name + "x"] = [1001]
        else:
            return False
        return True
    return False


def damaged_where_fast(events: list[dict], kind: str, rng: random.Random) -> tuple[list[dict], int]:
    """A copy with one damage of `kind` at an event the fast path takes on
    the undamaged trace, past the first quarter: the copy and its index."""
    taken = [i for i in fast_indices(events) if i > len(events) // 4]
    assert taken, "the fast path took no event"
    for _ in range(200):
        index = rng.choice(taken)
        copy = [json.loads(json.dumps(e)) for e in events]
        if kind == "arrive_reused" and copy[index]["ev"] == "arrive":
            running = next(e["entries"] for e in reversed(copy[:index]) if e["ev"] == "schedule" and e["entries"])
            copy[index]["req"] = running[-1]["req"]     # an id still active arrives again
            return copy, index
        if damage(copy[index], kind, rng):
            return copy, index
    raise AssertionError(f"no {kind} damage applied")


@functools.lru_cache(maxsize=8)
def base_trace(seed: int, block_size: int, caching: bool) -> tuple[dict, ...]:
    return tuple(long_events(10, 300, seed=seed, prefix_caching=caching, block_size=block_size,
                             repeated_prompts=0.3, pool_share=0.6))


def assert_damage_caught_alike(events: list[dict], index: int) -> tuple:
    verdict = assert_fast_agrees(events)
    if verdict[0] is False:
        assert verdict[2] >= index              # nothing before the damage is rejected
    return verdict


@pytest.mark.parametrize("kind", SCHEDULE_DAMAGES + COMPLETE_DAMAGES + ARRIVE_DAMAGES)
def test_fast_path_reports_a_damage_where_it_runs_as_the_spec_does(kind):
    events = list(base_trace(1, 4, True))
    bad, index = damaged_where_fast(events, kind, random.Random(kind))
    verdict = assert_damage_caught_alike(bad, index)
    if kind not in ("stray_token", "start_down"):
        # caught at the damaged event (a stop token: at the next, which is not its finish)
        assert verdict[:1] == (False,) and verdict[2] == index + (kind == "stop")


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 3), block_size=st.sampled_from([4, 16]), caching=st.booleans(),
       kind=st.sampled_from(SCHEDULE_DAMAGES + COMPLETE_DAMAGES + ARRIVE_DAMAGES), where=st.integers(0, 2**32))
def test_fast_path_agrees_on_traces_damaged_where_it_runs(seed, block_size, caching, kind, where):
    events = list(base_trace(seed, block_size, caching))
    bad, index = damaged_where_fast(events, kind, random.Random(where))
    assert_damage_caught_alike(bad, index)


def assert_same_records(fast: FastChecker, slow, where: int) -> None:
    """The spec state the fast checker hands over, and the incremental
    checker's own records, are the incremental checker's."""
    a, b = slow.state, fast.state
    assert tuple(a.requests) == tuple(b.requests), where
    assert (a.waiting, a.running, a.in_flight, a.scheduled_ids) == (b.waiting, b.running, b.in_flight,
                                                                    b.scheduled_ids), where
    for name in ("ref_counts", "labels", "free_queue", "duplicates"):
        assert getattr(a.pool, name) == getattr(b.pool, name), (where, name)
    assert +slow.holders == +fast.holders, where
    assert slow.output_labels == fast.output_labels, where
    assert (slow.block_map, slow.batch_ids, slow.unchecked) == (fast.block_map, fast.batch_ids, fast.unchecked)


@pytest.mark.parametrize("every", [1, 7])
def test_fast_path_hands_over_the_incremental_checkers_state_and_records(every):
    events = long_events(12, 600, seed=5, block_size=4, repeated_prompts=0.3, pool_share=0.6)
    fast, slow = FastChecker(events), check_module.IncrementalChecker(events)
    check_module._annotate_finishes(events)
    for index, event in enumerate(events[1:], start=1):
        fast.upcoming_finish = slow.upcoming_finish = event.get("_finishes", {})
        slow.feed(event)
        fast.feed(event)
        if index % every == 0 or index == len(events) - 1:     # a hand-over, then the mirror again
            assert_same_records(fast, slow, index)
    assert fast.fast_events > 50 and any(fast.output_labels.values())
