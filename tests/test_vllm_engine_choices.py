"""The engine's choices on vLLM's real scheduler (spec/engine.py's E-a and
E-b): campaign workloads replayed with our copy of each version's engine
loop, whose traces number engine steps, are rejected exactly where the
engine's own record puts the bug (verification/traces/ground_truth.py):
0.8.5's busy loop waiting for input while an aborted request's batch is in
flight, at the first event after the wait (E-a); 0.8.4's stale id in
`scheduled_req_ids` closing the engine's gate, at the completion where
vLLM's own `schedule()`, without the stale id, forms a batch (E-b). The
same traces without `engine_step` keep the verdict they had before."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from flightcheck.spec.engine import E_A, E_B
from flightcheck.verification.traces.check import check_events, read_trace_file
from flightcheck.verification.traces.engine_steps import NO_STEPS
from flightcheck.verification.traces.ground_truth import expected_verdict
from flightcheck.vllm.generate import RandomPicker, generate_workload, hash_seed

from .vllm_support import Workers, workers

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("both_checkers")]

# vLLM version -> (the property its loop breaks, campaign seed, workload
# indices); found by scripts/engine-evidence.py VERSION --seed 2 --workloads 1000
CASES = {"0.8.5": (E_A, 2, (279, 974)), "0.8.4": (E_B, 2, (179, 128))}


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


def campaign_workload(seed: int, index: int) -> dict:
    return generate_workload(RandomPicker(hash_seed(seed, index)), f"diff-{seed}-{index}", hash_seed(seed, index))


@pytest.mark.parametrize("version", sorted(CASES))
def test_the_engine_loops_bug_is_rejected_at_its_event(running: Workers, tmp_path: Path, version: str):
    prop, seed, indices = CASES[version]
    for index in indices:
        check_one(running, tmp_path / f"{index}.jsonl", version, campaign_workload(seed, index), prop)


def check_one(running: Workers, trace: Path, version: str, workload: dict, prop: str) -> None:
    result = running[version].replay(workload, trace=str(trace))
    events = read_trace_file(trace)
    expected = expected_verdict(result, events)
    verdict = check_events(events)
    assert expected.kind == "bug" and expected.agrees(verdict), (expected, verdict)
    assert verdict.property == prop
    if prop == E_A:
        assert result["waits_in_flight"]
    else:
        assert any(g["would_schedule"] for g in result["gated_completions"])
    unnumbered = [{k: v for k, v in e.items() if k != "engine_step"} for e in events]
    before = check_events(unnumbered)
    assert before.property != prop and (before.ok or before.event_index > verdict.event_index)
    if before.ok:
        assert NO_STEPS in before.unchecked
