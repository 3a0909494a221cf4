"""The finding "a session stopped while preempted counts a seat it gave up"
(docs/request-states.md) on vLLM's real scheduler: flightcheck/vllm/
session_seat_probe.py drives vLLM 0.33.0's and 0.34.0's `Scheduler` (and
`AsyncScheduler`) through session-seats-k3's SS4 violation at vLLM's sizes,
and the spec's run of the same scenario gives the same record: what each
`schedule()` scheduled and preempted, and at each step the running
requests, `num_waiting_for_streaming_input` and the session's state. After
the stale output's stop, two requests run and one session is parked, three
seats counted of two (SS4 broken in vLLM as in the spec); after the first
request finishes, a fourth request is not admitted."""

from __future__ import annotations

import json
import subprocess

import pytest

from flightcheck.spec import Arrive, CompleteOldest, Config, Prompt, Sample, Schedule, State, Status, initial_state, step
from flightcheck.vllm.replay import venv_python

from .vllm_support import require_venv

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _observe(version: str, async_scheduling: bool) -> dict:
    require_venv(version)
    argv = [str(venv_python(version)), "-m", "flightcheck.vllm.session_seat_probe"] + (["--async"] if async_scheduling else [])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _seats(s: State) -> dict:
    q = s.requests[1]
    return {"running": sorted(f"r{r}" for r in s.running),
            "waiting_for_input": sum(x.status is Status.WAITING_FOR_STREAMING_REQ for x in s.requests),
            "r1": {"status": q.status.name, "num_computed": q.num_computed, "in_flight": q.num_in_flight,
                   "stale": q.num_stale, "drop": q.drop_stale, "blocks": len(q.block_table), "in_waiting": 1 in s.waiting}}


class _SpecRun:
    """The probe's scenario in the spec: vLLM's sizes (its pool keeps a null
    block back), three batches out at most as the probe drives it."""

    def __init__(self, async_scheduling: bool) -> None:
        self.cfg = Config(num_stages=3, max_num_batched_tokens=8, max_num_seqs=2, block_size=4, num_blocks=3,
                          max_model_len=32, prefix_caching=False, streaming_sessions=True,
                          profile="vllm-0.34-async" if async_scheduling else "vllm-0.34")
        self.prompts = (Prompt(4, 2), Prompt(6, 1, session=((1, 1), (0, 0))), Prompt(2, 1), Prompt(2, 1))
        self.state = initial_state(4, self.cfg.num_blocks)
        self.scheduled: list[dict] = []
        for r in range(3):
            self.do(Arrive(r, self.prompts[r]))

    def do(self, action) -> None:
        nxt = step(self.state, self.cfg, action)
        assert nxt is not None, f"{action} is disabled"
        self.state = nxt

    def schedule(self) -> None:
        before, nxt = self.state, step(self.state, self.cfg, Schedule())
        if nxt is None:                     # the spec launches no batch where vLLM's call schedules nothing
            self.scheduled.append({"tokens": {}, "preempted": []})
            return
        self.state = nxt
        batch = nxt.in_flight[-1] if len(nxt.in_flight) > len(before.in_flight) else ()
        self.scheduled.append({"tokens": {f"r{e.req}": e.n for e in batch},
                               "preempted": sorted(f"r{r}" for r, q in enumerate(nxt.requests)
                                                   if q.status is Status.PREEMPTED
                                                   and before.requests[r].status is Status.RUNNING)})

    def complete(self) -> None:
        samples = tuple(Sample() for e in self.state.in_flight[0] if e.samples)
        self.do(CompleteOldest(samples))


def _spec_record(async_scheduling: bool) -> dict:
    run = _SpecRun(async_scheduling)
    seen: dict = {"max_num_seqs": 2}
    run.schedule()
    run.schedule()
    run.complete()
    for _ in range(3):
        run.schedule()
        if run.state.requests[1].status is Status.PREEMPTED:
            break
    seen["preempted"] = _seats(run.state)
    run.schedule()
    seen["admitted_past"] = _seats(run.state)
    run.complete()
    seen["stopped_while_preempted"] = _seats(run.state)
    while run.state.requests[0].status is Status.RUNNING:
        run.complete()
    run.do(Arrive(3, run.prompts[3]))
    run.schedule()
    seen["seat_lost"] = _seats(run.state)
    seen["scheduled"] = run.scheduled
    return seen


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
def test_finding_a_session_stopped_while_preempted_counts_a_seat_it_gave_up(version: str, async_scheduling: bool):
    seen = _observe(version, async_scheduling)
    assert seen == _spec_record(async_scheduling)
    stopped = seen["stopped_while_preempted"]
    assert stopped["r1"]["status"] == "WAITING_FOR_STREAMING_REQ" and stopped["r1"]["blocks"] == 0
    assert len(stopped["running"]) + stopped["waiting_for_input"] == 3 > seen["max_num_seqs"]
    assert seen["seat_lost"]["running"] == ["r2"] and "r3" not in seen["scheduled"][-1]["tokens"]
