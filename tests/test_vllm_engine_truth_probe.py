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
