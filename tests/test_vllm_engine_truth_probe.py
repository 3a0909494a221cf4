"""The ground truth's probe of vLLM 0.8.4's gate (engine_truth.py:
`_would_schedule_without` runs `schedule()` on a deep copy of the scheduler)
must not touch vLLM's own scheduler. With drafts the recorder wraps the
KV cache manager's `allocate_slots` on the instance (ground_truth.py); a
deep copy shares that function, whose closure calls the original manager,
so the probe's `schedule()` allocated blocks in vLLM's real manager: a
preempted request the probe admitted later showed no new blocks when vLLM
admitted it for real, and the differential called the run unexplained
(an adversarial 0.8.4 workload at k=2: two stages, block size 16, 5
usable blocks, threshold 2; kept in tests/data/vllm/engine-truth)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from flightcheck.vllm.engine_truth import _would_schedule_without

from .vllm_support import DATA, Workers, workers

pytestmark = pytest.mark.usefixtures("both_checkers")       # the slow test runs a campaign's check-trace


class _Manager:
    def __init__(self) -> None:
        self.tables: dict[str, list[int]] = {}

    def allocate_slots(self, req_id: str) -> list[int]:
        self.tables.setdefault(req_id, []).append(len(self.tables))
        return self.tables[req_id]


class _Scheduler:
    def __init__(self) -> None:
        self.kv_cache_manager = _Manager()
        self.scheduled_req_ids = {"r1"}
        self.waiting = ["r1"]
        self._fc_trace: Any = "trace"
        self.noted: list[str] = []
        manager, allocate = self.kv_cache_manager, self.kv_cache_manager.allocate_slots

        def allocate_slots(req_id: str) -> list[int]:      # the recorder's watch, on the instance
            self.noted.append(req_id)
            return allocate(req_id)

        manager.allocate_slots = allocate_slots             # type: ignore[method-assign]

    def schedule(self) -> SimpleNamespace:
        admitted = [r for r in self.waiting if r not in self.scheduled_req_ids]
        for req_id in admitted:
            self.kv_cache_manager.allocate_slots(req_id)
        return SimpleNamespace(total_num_scheduled_tokens=len(admitted))


def test_the_probe_schedules_on_its_copy_and_leaves_vllms_scheduler_as_it_was():
    scheduler = _Scheduler()
    engine = SimpleNamespace(scheduler=scheduler, copy_errors=[])
    assert _would_schedule_without(engine, ["r1"]) is True
    assert scheduler.kv_cache_manager.tables == {} and scheduler.noted == []
    assert scheduler.scheduled_req_ids == {"r1"} and scheduler._fc_trace == "trace"


class _Request:
    def __init__(self, req_id: str) -> None:
        self.request_id, self.status = req_id, SimpleNamespace(name="RUNNING")


class _PreemptingScheduler:
    """0.8.4's `schedule()` where r0, running with no batch in flight, finds
    no block: it preempts from the tail of `running` down to r0 itself and
    forms nothing (the waiting loop does not run after a preemption)."""

    def __init__(self) -> None:
        self.kv_cache_manager = SimpleNamespace()
        self.running = [_Request("r0"), _Request("r1")]
        self.waiting: list[_Request] = []
        self.scheduled_req_ids = {"r1", "r9"}            # r1 in flight; r9 stale (aborted while waiting)
        self._fc_trace: Any = "trace"

    def schedule(self) -> SimpleNamespace:
        while self.running:
            preempted = self.running.pop()
            preempted.status = SimpleNamespace(name="PREEMPTED")
            self.waiting.insert(0, preempted)
            if preempted.request_id == "r0":
                break
        return SimpleNamespace(total_num_scheduled_tokens=0)


def test_a_gated_step_whose_schedule_would_only_preempt_is_noted_and_no_finding():
    """The gate closed by r9 (2 queued, 2 marked) where, without r9, vLLM
    0.8.4's `schedule()` would preempt r1 and r0 and form nothing: the step
    completes the oldest batch either way (E-b's `may_complete`), so the
    ground truth notes the preemptions and finds nothing (ground_truth.py)."""
    from flightcheck.verification.traces.ground_truth import expected_verdict
    from flightcheck.vllm.engine_truth import note_gated_completion
    from flightcheck.vllm.replay import findings

    scheduler = _PreemptingScheduler()
    in_flight = SimpleNamespace(num_scheduled_tokens={"r1": 1})
    engine = SimpleNamespace(scheduler=scheduler, copy_errors=[], batch_queue=[(in_flight, None)],
                             current_step=4, gated_completions=[])
    note_gated_completion(engine)
    assert engine.gated_completions == [{"step": 4, "stale": ["r9"], "would_schedule": False,
                                         "would_preempt": ["r0", "r1"]}]
    assert [r.request_id for r in scheduler.running] == ["r0", "r1"] and scheduler.waiting == []   # vLLM's own
    result = {"vllm_version": "0.8.4", "ending": "done", "batches_in_flight": 0, "stalls": [],
              "ground_truth": {"stale_tokens": [], "partial_chunk_tokens": [], "in_flight_set_mismatches": []},
              "waits_in_flight": [], "gated_completions": engine.gated_completions}
    events = [{"ev": "complete", "batch": 1, "tokens": {"r1": [7]}, "engine_step": 4}]
    assert findings(result) == [] and expected_verdict(result, events).kind == "legal"
    formed = [{**engine.gated_completions[0], "would_schedule": True}]
    assert findings({**result, "gated_completions": formed}) != []       # one that forms a batch is one
    assert expected_verdict({**result, "gated_completions": formed}, events).kind != "legal"


HERE = DATA / "engine-truth"


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


@pytest.mark.slow
@pytest.mark.vllm
def test_a_0_8_4_run_with_a_probed_gate_equals_the_conforming_reference(running: Workers, tmp_path: Path):
    from flightcheck.vllm.campaign import ReplayJob, replay_workload

    raw = json.loads((HERE / "084_gate_probe_with_drafts.workload.json").read_text())
    replayed = replay_workload(running["0.8.4"], ReplayJob("0.8.4", False, 0, raw, 0))
    assert replayed.result["gated_completions"]            # the probe ran
    comparison = replayed.comparison
    assert comparison is not None and comparison.explained, comparison.describe()
    assert comparison.deviation == "inflight_mark_cleared_on_preemption"
