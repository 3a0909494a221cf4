"""The ground truth names the finding "a session stopped while preempted
counts a seat it gave up" (docs/request-states.md) wherever vLLM shows it:
after each `schedule()` and `update_from_output`, running requests plus
sessions waiting for input (`num_waiting_for_streaming_input`, which
`Scheduler.schedule`'s waiting loop counts as holding model-runner slots)
above `max_num_running_reqs` (ground_truth.py `_fc_check_session_seats`).

Campaign `--versions 0.34.0 --all-features --async --spec-tokens 2
--no-mid-step-inputs --workloads 30 --seed 58`, index 22 (the workload kept in
tests/data/vllm/sessions-findings/): a reset of the running requests
preempts the session r3 with deliver-mode stale output in flight (three
batches in flight under async scheduling), r4 is admitted into its seat,
and r3's stale output ends its turn and parks it: two running and one
parked, of two seats. check-trace rejects the trace for SS4, and the ground
truth called the run correct: a false rejection by the campaign's count
until the ground truth read vLLM's seats."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from flightcheck.vllm.campaign import ReplayJob, replay_workload
from flightcheck.vllm.ground_truth import GroundTruthMixin, Observations
from flightcheck.vllm.replay import findings

from .vllm_support import Workers, workers

pytestmark = pytest.mark.usefixtures("both_checkers")   # judges check-trace's verdicts

WORKLOAD = (Path(__file__).parent / "data" / "vllm" / "sessions-findings"
            / "session-stopped-while-preempted-overcounts-seats.json")


class _Seats(GroundTruthMixin):
    """vLLM's scheduler as far as the seat check reads it."""

    def __init__(self) -> None:
        self.flightcheck_step = 0
        self.flightcheck_observations = Observations()
        self._fc_seats_over = False
        self.max_num_running_reqs = 2
        self.running: list[object] = []
        self.num_waiting_for_streaming_input = 0

    def at(self, step: int, running: int, parked: int) -> None:
        self.flightcheck_step, self.running = step, [SimpleNamespace()] * running
        self.num_waiting_for_streaming_input = parked
        self._fc_check_session_seats()


def test_seats_over_max_num_seqs_are_recorded_once_each_time_they_go_over() -> None:
    seats = _Seats()
    seats.at(1, 2, 0)                  # full, not over
    seats.at(2, 1, 1)                  # a parked session holds its seat
    seats.at(3, 2, 1)                  # over: the finding
    seats.at(4, 2, 1)                  # still over: the same episode
    seats.at(5, 1, 1)
    seats.at(6, 1, 2)                  # over again
    observed = seats.flightcheck_observations.to_json()["session_seats_overcounted"]
    assert [(o["step"], o["running"], o["parked"], o["max_num_seqs"]) for o in observed] == [
        (3, 2, 1, 2), (6, 1, 2, 2)]
    (found,) = findings({"ending": "done", "ground_truth": {"session_seats_overcounted": observed[:1]}})
    assert "2 running requests and 1 sessions waiting for input" in found and "max_num_seqs = 2" in found
    assert "session_seats_overcounted" not in _Seats().flightcheck_observations.to_json()


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_0_34_async_overcounts_the_seats_and_check_trace_rejects_it_as_a_real_bug(running: Workers) -> None:
    raw = json.loads(WORKLOAD.read_text())
    assert raw["config"]["async_scheduling"] and raw["config"]["max_num_seqs"] == 2
    replayed = replay_workload(running["0.34.0"], ReplayJob("0.34.0", True, 22, raw, 58))
    (seats,) = replayed.result["ground_truth"]["session_seats_overcounted"]
    assert (seats["running"], seats["parked"]) == (2, 1)
    assert replayed.category == "rejected, real bug", replayed.detail
    assert replayed.detail.endswith("SS4_waiting_session_keeps_seat"), replayed.detail
