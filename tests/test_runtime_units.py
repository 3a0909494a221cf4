"""Small pieces of the runtime: drafter, sampler, transport packing, traces."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from flightcheck.runtime.drafter import propose_ngram
from flightcheck.runtime.sampler import accept_drafts, sample_tokens
from flightcheck.runtime.trace import chrome_trace, hop_times, pipeline_stats, transfer_times
from flightcheck.runtime.transport import pack_activations, unpack_activations


def test_prompt_lookup_proposes_what_followed_the_latest_match():
    assert propose_ngram([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], 2) == [7, 1]
    assert propose_ngram([5, 6, 7], 3) == []
    assert propose_ngram([4, 4, 4], 2) == [4]
    assert propose_ngram([1, 2, 1, 2], 0) == []


def test_greedy_rejection_accepts_while_equal_then_adds_the_targets_token():
    assert accept_drafts([5, 6, 7], [5, 6, 7, 8]) == [5, 6, 7, 8]
    assert accept_drafts([5, 6, 7], [5, 9, 7, 8]) == [5, 9]
    assert accept_drafts([], [3]) == [3]


def test_sampling_is_greedy_at_temperature_zero_and_seeded_otherwise():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert sample_tokens(logits, [1, 2, 3, 4], 0.0, 0) == logits.argmax(-1).tolist()
    a = sample_tokens(logits, [1, 2, 3, 4], 1.0, 7, top_p=0.9)
    assert a == sample_tokens(logits, [1, 2, 3, 4], 1.0, 7, top_p=0.9)
    tiny_p = sample_tokens(logits, [1, 2, 3, 4], 1.0, 7, top_p=1e-9)
    assert tiny_p == logits.argmax(-1).tolist()             # top-p keeps only the mode


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_stage_timings_ride_on_the_activation_message_exactly(dtype):
    hidden = torch.randn(5, 32).to(dtype)
    times = [(1700000000.123456, 1700000000.5, 1700000000.1),
             (1700000001.25, 1700000002.0, 1700000000.75)]
    packed = pack_activations(hidden, times)
    assert packed.shape == (6, 32)
    back, got = unpack_activations(packed, 2)
    assert torch.equal(back, hidden) and got == times


def test_pipeline_stats_and_chrome_export_from_stage_events():
    events = [
        {"ev": "config"},
        {"ev": "schedule", "batch": 1, "t": 0.0, "entries": [{"req": "a", "n": 4}], "preempted": []},
        {"ev": "stage", "batch": 1, "stage": 0, "t0": 0.0, "t1": 1.0},
        {"ev": "stage", "batch": 1, "stage": 1, "t0": 1.5, "t1": 2.0, "recv": 1.25},
        {"ev": "complete", "batch": 1, "t": 2.1, "tokens": {"a": [1]}},
    ]
    stats = pipeline_stats(events)
    assert stats["busy_s"] == [1.0, 0.5] and stats["bubble_fraction"] == pytest.approx(0.625)
    assert hop_times(events) == [0.5]
    assert transfer_times(events) == [0.25]     # from the later of recv posted (1.25) and stage 0 end
    chrome = chrome_trace(events)["traceEvents"]
    slices = [e for e in chrome if e["ph"] == "X"]
    assert [(e["tid"], e["ts"], e["dur"]) for e in slices] == [(1, 0.0, 1e6), (2, 1.5e6, 0.5e6)]
    json.dumps(chrome)
