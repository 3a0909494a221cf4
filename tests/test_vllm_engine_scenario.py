"""vLLM's own engine test, replayed through `flightcheck vllm replay` on the
real vLLM 0.8.5 scheduler, matches it event for event.

The expected events are vLLM's, written here as data: vLLM 0.8.5,
`tests/v1/engine/test_engine_core.py`, `test_engine_core_concurrent_batches`.
Its setup: `max_num_seqs=2`, `max_num_batched_tokens=10`, no prefix caching,
a batch queue of 2 (`DummyExecutor.max_concurrent_batches`), two requests of
12 prompt tokens with `max_tokens=5`, added in a row. Each
`step_with_batch_queue()` call there either schedules a batch (asserting its
`num_scheduled_tokens`) or completes the oldest (asserting how many requests
got a token and the request's `num_tokens` after it). Its closing loop
alternates completion and scheduling until request 0 finishes; it is unrolled
below.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flightcheck.cli import main
from flightcheck.verification.traces.check import check_trace

from .vllm_support import require_venv

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("both_checkers")]

PROMPT_LEN = 12
WORKLOAD = {
    "name": "test_engine_core_concurrent_batches",
    "config": {"num_stages": 2, "max_num_batched_tokens": 10, "max_num_seqs": 2, "block_size": 16,
               "num_blocks": 1000, "max_model_len": 2048, "prefix_caching": False},
    "requests": [{"id": "0", "prompt_len": PROMPT_LEN, "max_tokens": 5},
                 {"id": "1", "prompt_len": PROMPT_LEN, "max_tokens": 5}],
}

# ("schedule", {request: num_scheduled_tokens}) or
# ("complete", {request that got a token: its num_tokens afterwards}).
EXPECTED_STEPS = [
    ("schedule", {"0": 10}),            # Batch 1: (10, req0)
    ("schedule", {"0": 2, "1": 8}),     # Batch 2: (2, req0), (8, req1)
    ("complete", {}),                   # queue full: finish Batch 1 (a partial prefill: no token)
    ("schedule", {"1": 4}),             # Batch 3: (4, req1); req0 waits for its first token
    ("complete", {"0": 13}),            # finish Batch 2: first token of req0
    ("schedule", {"0": 1}),             # Batch 4: (1, req0)
    ("complete", {"1": 13}),            # finish Batch 3: first token of req1
    ("schedule", {"1": 1}),             # Batch 5: (1, req1)
    # The loop "until req0 is finished": even steps consume one output,
    # alternating req0 and req1; odd steps schedule a new batch.
    ("complete", {"0": 14}), ("schedule", {"0": 1}),
    ("complete", {"1": 14}), ("schedule", {"1": 1}),
    ("complete", {"0": 15}), ("schedule", {"0": 1}),
    ("complete", {"1": 15}), ("schedule", {"1": 1}),
    ("complete", {"0": 16}), ("schedule", {"0": 1}),
    ("complete", {"1": 16}), ("schedule", {"1": 1}),
    ("complete", {"0": 17}),            # req0's fifth token: it finishes (max_tokens), the loop ends
]


def replayed_steps(trace: Path) -> tuple[list[tuple[str, dict[str, int]]], list[dict]]:
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    num_tokens = {e["req"]: e["prompt_len"] for e in events if e["ev"] == "arrive"}
    steps: list[tuple[str, dict[str, int]]] = []
    for event in events:
        if event["ev"] == "schedule":
            steps.append(("schedule", {x["req"]: x["n"] for x in event["entries"]}))
        elif event["ev"] == "complete":
            got = {}
            for req, tokens in event["tokens"].items():
                if tokens:
                    num_tokens[req] += len(tokens)
                    got[req] = num_tokens[req]
            steps.append(("complete", got))
    return steps, events


def test_vllm_engine_test_scenario_replays_event_for_event(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    require_venv("0.8.5")
    workload, trace = tmp_path / "workload.json", tmp_path / "trace.jsonl"
    workload.write_text(json.dumps(WORKLOAD))
    code = main(["vllm", "replay", str(workload), "--vllm-version", "0.8.5", "--trace", str(trace), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    (result,) = report["workloads"]
    assert result["vllm_version"] == "0.8.5" and result["ending"] == "done" and not result["findings"]
    assert result["scheduler_cls"] == "flightcheck.vllm.recorder.RecordingScheduler"

    steps, events = replayed_steps(trace)
    assert steps[:len(EXPECTED_STEPS)] == EXPECTED_STEPS
    # Where vLLM's test stops, request 0 has finished by length, in that completion.
    last = [i for i, e in enumerate(events) if e["ev"] == "complete"][len(
        [s for s in EXPECTED_STEPS if s[0] == "complete"]) - 1]
    assert events[last + 1] == {**events[last + 1], "ev": "finish", "req": "0", "reason": "length"}
    assert events[0]["vllm_version"] == "0.8.5" and events[0]["policy"] == "continue-prefill"
    assert events[-1] == {"ev": "end"}
    assert check_trace(trace).ok
