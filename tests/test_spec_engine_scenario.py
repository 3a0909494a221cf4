"""The vLLM engine test `test_engine_core_concurrent_batches` (docs/vllm-semantics.md §"vLLM's own tests the project replays"),
replayed in the spec with the engine's loop: schedule while the queue has
room, otherwise (or when nothing is schedulable) complete the oldest batch."""

from __future__ import annotations

from flightcheck.spec import (Arrive, CompleteOldest, Sample, initial_state,
                              sampling_entries, schedule, step, violated)
from flightcheck.verification.models import ENGINE_TEST


def run_engine(max_events: int = 40):
    cfg = ENGINE_TEST.cfg
    s = initial_state(2, cfg.num_blocks)
    for r, prompt in enumerate(ENGINE_TEST.prompts):
        s = step(s, cfg, Arrive(r, prompt))
    events = []
    for _ in range(max_events):
        scheduled = schedule(s, cfg)
        if scheduled is not None:
            s = scheduled.state
            events.append(("batch", {e.req: e.n for e in scheduled.entries},
                           tuple(q.num_computed for q in s.requests), len(s.in_flight)))
        elif s.in_flight:
            s = step(s, cfg, CompleteOldest(tuple(Sample() for _ in sampling_entries(s, cfg))))
            events.append(("complete", tuple(q.num_tokens for q in s.requests)))
        else:
            break
        assert not violated(s, cfg)
    return events, s


def test_engine_test_batches_b1_to_b5_match_vllm():
    events, _ = run_engine()
    # B1 = {r0: 10}, r0's counter is 10 immediately.
    assert events[0] == ("batch", {0: 10}, (10, 0), 1)
    # B2 = {r0: 2, r1: 8}: r0 has two prefill chunks in flight, the queue is full.
    assert events[1] == ("batch", {0: 2, 1: 8}, (12, 8), 2)
    # Completing B1 gives no output.
    assert events[2] == ("complete", (12, 12))
    # B3 = {r1: 4}; r0 is decoding and not schedulable.
    assert events[3] == ("batch", {1: 4}, (12, 12), 2)
    # Completing B2 gives r0's first token.
    assert events[4] == ("complete", (13, 12))
    # B4 = {r0: 1}.
    assert events[5] == ("batch", {0: 1}, (13, 12), 2)
    # Completing B3 gives r1's first token, then B5 = {r1: 1}.
    assert events[6] == ("complete", (13, 13))
    assert events[7] == ("batch", {1: 1}, (13, 13), 2)


def test_engine_test_then_alternates_one_output_per_completion():
    events, final = run_engine()
    rest = events[8:]
    kinds = [e[0] for e in rest]
    # completions and batches alternate until the requests finish
    for a, b in zip(kinds[:-2], kinds[1:-1]):
        assert a != b
    totals = [sum(e[1]) for e in events if e[0] == "complete"]
    assert all(b - a in (0, 1) for a, b in zip(totals, totals[1:]))
    assert all(q.status.is_finished and q.num_output == 5 for q in final.requests)
