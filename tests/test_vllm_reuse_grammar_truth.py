"""The ground truth reads the counters of the request an output was bound
to even when vLLM finishes and drops that request in the same update
(ground_truth.py `_fc_check_counters`, `bound`).

Campaign `--versions 0.34.0 --all-features --async --reuse-ids
--spec-tokens 1 --workloads 30 --seed 62`, index 13, minimised to
the workload kept in tests/data/vllm/reuse-ids/ (vLLM 0.34.0, async, 4
stages): r1's three prefill chunks are in flight when it is aborted; a new
request arrives under the id r1 and its grammar fails to compile. The
oldest chunk's output is looked up by id (`Scheduler.update_from_output`:
`self.requests.get(req_id)`) and takes the new r1's `num_in_flight_tokens`
to -4, the id-reuse bug; later in that same update vLLM finishes the new r1
for its grammar (`grammar_compile_error_reqs` -> `finish_requests(...,
FINISHED_ERROR)`) and drops it from `requests`. The recorder read only the
requests still there, so the ground truth saw nothing and check-trace's
IF1 (right) counted as a false rejection."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from flightcheck.vllm.campaign import ReplayJob, check_verdict, replay_workload
from flightcheck.vllm.ground_truth import GroundTruthMixin, Observations

from .vllm_support import Workers, workers

pytestmark = pytest.mark.usefixtures("both_checkers")   # judges check-trace's verdicts

STEM = Path(__file__).parent / "data" / "vllm" / "reuse-ids" / "034-async-reused-id-bound-then-failed-by-grammar"


class _Counters(GroundTruthMixin):
    """vLLM's scheduler as far as the counter check reads it."""

    def __init__(self, requests: dict[str, object]) -> None:
        self.flightcheck_step = 6
        self.flightcheck_observations = Observations()
        self._fc_negative_seen: set = set()
        self._fc_mismatch_seen: dict = {}
        self._fc_in_flight: dict = {}
        self.requests = requests


def _request(req_id: str, in_flight: int) -> SimpleNamespace:
    return SimpleNamespace(request_id=req_id, num_in_flight_tokens=in_flight, num_stale_output_tokens=0,
                           is_finished=lambda: True)


def test_a_bound_request_dropped_in_the_same_update_has_its_counters_read() -> None:
    bound = _request("r1", -4)
    counters = _Counters({})
    counters._fc_check_counters()
    assert counters.flightcheck_observations.negative_counters == []        # gone from `requests`
    counters._fc_check_counters([bound, None])
    assert counters.flightcheck_observations.negative_counters == [
        {"step": 6, "req": "r1", "counter": "num_in_flight_tokens", "value": -4}]
    live = _Counters({"r1": bound})
    live._fc_check_counters([bound])                                        # read once, not twice
    assert len(live.flightcheck_observations.negative_counters) == 1


def test_vllms_trace_is_rejected_for_the_binding() -> None:
    events = [json.loads(line) for line in STEM.with_suffix(".jsonl").read_text().splitlines() if line.strip()]
    assert [e["ev"] for e in events[8:11]] == ["grammar_failed", "complete", "finish"]
    check = check_verdict(STEM.with_suffix(".jsonl"))
    assert (check["ok"], check["property"]) == (False, "IF1_in_flight_counter")


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_0_34_async_binds_the_old_chunk_to_the_new_request_a_real_bug(running: Workers) -> None:
    raw = json.loads(STEM.with_suffix(".workload.json").read_text())
    replayed = replay_workload(running["0.34.0"], ReplayJob("0.34.0", True, 0, raw, 0))
    negative = replayed.result["ground_truth"]["negative_counters"]
    assert [(n["req"], n["value"]) for n in negative] == [("r1", -4)]
    assert replayed.category == "rejected, real bug", replayed.detail
