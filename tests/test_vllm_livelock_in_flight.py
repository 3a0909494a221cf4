"""The ground truth's livelock check (ground_truth.py `_fc_check_livelock`)
with batches in flight: the repeated state is the requests' and what each
batch in flight schedules, oldest first (`_fc_request_states`). Seed 396
index 76 (0.8.5, four stages; tests/test_vllm_hunt402_releases.py): r0
admitted and preempted for r2's decode blocks from one request state three
times while r2's sampling entry was in flight; the run ends `done`, and the
requests' state alone named a livelock. The lookahead livelocks of seed 379
(tests/test_vllm_hunt395_livelock.py), whose batches in flight repeat with
the requests, are still named."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from flightcheck.vllm.ground_truth import LIVELOCK_REPEATS, BatchRecord, EntrySnapshot, GroundTruthMixin, \
    Observations

from .test_vllm_hunt402_releases import ROTATION
from .vllm_support import Workers, replay_kept_workload, workers

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared


class _Scheduler(GroundTruthMixin):
    """GroundTruthMixin's livelock check on a stand-in of vLLM's state: r0
    preempted from one state of the requests, batches in flight beside it."""

    def __init__(self) -> None:
        self.flightcheck_step = 0
        self.flightcheck_observations = Observations()
        self._fc_preempted_from = {}
        self._fc_in_flight: dict[int, BatchRecord] = {}
        self.cache_config = SimpleNamespace(block_size=4)
        self.kv_cache_manager = SimpleNamespace(block_pool=SimpleNamespace(get_num_free_blocks=lambda: 0))
        self.requests = {"r0": _request(16, "PREEMPTED"), "r2": _request(24, "RUNNING")}
        self.waiting, self.running = [self.requests["r0"]], [self.requests["r2"]]   # read by request_id
        self.batch = 0

    def schedule(self, *reqs: str) -> None:
        self.batch += 1
        entries = [EntrySnapshot(req, self.requests[req], 1, 4, 3, req == "r2") for req in reqs]
        self._fc_in_flight[self.batch] = BatchRecord(self.batch, object(), entries)

    def complete_oldest(self) -> None:
        """The oldest batch comes back; a sampling entry appends its token."""
        for entry in self._fc_in_flight.pop(min(self._fc_in_flight)).entries:
            entry.request.num_tokens += entry.samples

    def preempt(self, req_id: str) -> None:
        self.flightcheck_step += 3
        self._fc_check_livelock(req_id)


def _request(num_tokens: int, status: str) -> SimpleNamespace:
    return SimpleNamespace(request_id=f"{num_tokens} tokens", num_tokens=num_tokens, num_computed_tokens=0,
                           status=SimpleNamespace(name=status), is_finished=lambda: status.startswith("FINISHED"))


def test_batches_in_flight_that_rotate_are_no_repeat_of_the_state() -> None:
    """The kept run's rotation: four stages, three batches in flight, r2's
    sampling entry in one of them; r0 preempted at every schedule."""
    scheduler = _Scheduler()
    for reqs in (("r0",), ("r0",), ("r2", "r0")):
        scheduler.schedule(*reqs)
    request_states = []
    for turn in range(3 * LIVELOCK_REPEATS):
        scheduler.preempt("r0")
        request_states.append(scheduler._fc_request_states()[0])
        scheduler.complete_oldest()
        scheduler.schedule(*(("r2", "r0") if turn % 3 == 2 else ("r0",)))
    assert request_states[0] == request_states[1] == request_states[2] != request_states[3]
    assert scheduler.flightcheck_observations.admission_livelocks == []


def test_the_same_batches_in_flight_at_each_preemption_are_a_livelock() -> None:
    scheduler = _Scheduler()
    scheduler.schedule("r0")
    for _ in range(LIVELOCK_REPEATS):
        scheduler.preempt("r0")
        scheduler.complete_oldest()
        scheduler.schedule("r0")                       # the same chunk again, in a batch of a new number
    [loop] = scheduler.flightcheck_observations.admission_livelocks
    assert (loop["req"], loop["repeats"], loop["step"]) == ("r0", LIVELOCK_REPEATS, 3 * LIVELOCK_REPEATS)


def test_the_kept_result_names_no_livelock() -> None:
    kept = ROTATION.result()
    assert kept["ending"] == "done" and "admission_livelocks" not in kept["ground_truth"]
    assert kept["findings"] == []


# --- on vLLM itself (slow): the kept workload's ground truth


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_rotates_r0_to_the_end_and_the_ground_truth_names_no_livelock(running: Workers) -> None:
    replayed = replay_kept_workload(running["0.8.5"], ROTATION, "0.8.5")
    assert replayed.result["ending"] == "done"
    assert "admission_livelocks" not in replayed.result["ground_truth"]
    assert replayed.category == "accepted, correct run", replayed.detail
