"""What the hunt over fresh seeds 396-402 (releases alone) found: campaigns
of `python -m flightcheck.vllm.campaign ... --jobs 1 --no-mutants`, the
trace, workload and replay result of each case kept in tests/data/vllm/hunt402.

* A ground-truth gap, 0.8.5 sync: seed 396 index 76 (`--versions
  0.8.5,0.8.4 --reuse-ids`; four pipeline stages, blocks of 4, 8 usable).
  r2 decodes holding six blocks; each time r0 is admitted (its prefix hit
  and one chunk, blocks 1 and 8), the next `schedule()` finds no block for
  r2's next token and preempts r0 (0.8.5 `Scheduler.schedule`, the running
  loop's "preempt the lowest-priority request"), and r0 is admitted again:
  a batch every engine step, two of three of them r0's chunk alone, whose
  completions drop its tokens. r2's sampling entries are in flight all the
  while and append a token every third preemption, so the run moves on and
  ends `done`: check-trace accepted it, rightly. The ground truth's
  livelock check (ground_truth.py `_fc_check_livelock`) compares only the
  requests' state, which repeats over three preemptions while r2's token is
  on its way, and names a livelock: a miss that is none. The kept result is
  the replay's with that state holding what each batch in flight schedules
  (a change to the ground truth, not here: its owner's). A check-trace rule
  for livelocks must accept this run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from flightcheck.verification.traces.check import check_trace
from flightcheck.verification.traces.reading import read_trace_file

from flightcheck.vllm.campaign import ReplayJob, replay_workload

from .vllm_support import DATA, KeptCase, Workers, workers

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

HUNT = DATA / "hunt402"
ROTATION = KeptCase(HUNT / "085_sync_preempted_from_one_state_while_a_token_is_in_flight_seed396_76")
REPEATS = 3            # the ground truth's LIVELOCK_REPEATS: preemptions in a row from one state


def _appended(event: dict[str, Any]) -> bool:
    """A completion that appends a token to some request (not one it drops)."""
    dropped = set(event.get("dropped", []))
    return any(tokens and req not in dropped for req, tokens in event["tokens"].items())


def test_the_kept_trace_preempts_r0_from_one_state_while_r2s_token_is_in_flight() -> None:
    events = read_trace_file(str(ROTATION.trace))
    assert (events[0]["num_stages"], events[0]["usable_blocks"], events[-1]["ev"]) == (4, 8, "end")
    in_flight: dict[int, list[str]] = {}
    quiet, repeats_with_r2_pending = 0, []
    for event in events:
        if event["ev"] == "schedule" and event["batch"] is not None:
            in_flight[event["batch"]] = [entry["req"] for entry in event["entries"] if entry["samples"]]
        elif event["ev"] == "complete":
            del in_flight[event["batch"]]
            quiet = 0 if _appended(event) else quiet
        if event["ev"] == "schedule" and event["preempted"] == ["r0"]:
            quiet += 1
            if quiet >= REPEATS:            # three preemptions with no token appended between
                repeats_with_r2_pending.append(any("r2" in samplers for samplers in in_flight.values()))
    assert repeats_with_r2_pending and all(repeats_with_r2_pending)   # each time, r2's token on its way
    assert [e["req"] for e in events if e["ev"] == "finish"] == ["r1", "r2", "r0"]


def test_check_trace_accepts_the_run_vllm_ended_done() -> None:
    result = check_trace(ROTATION.trace)
    assert result.ok and result.unchecked == [], result
    kept = ROTATION.result()
    assert kept["ending"] == "done" and kept["unfinished"] == [] and kept["stalls"] == []


# --- on vLLM itself (slow): the kept workload


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_rotates_r0_through_the_pipeline_to_the_end(running: Workers) -> None:
    raw = ROTATION.raw()
    replayed = replay_workload(running["0.8.5"], ReplayJob("0.8.5", False, 0, raw, raw.get("seed", 0)))
    assert replayed.result["batches"] == ROTATION.result()["batches"]
    assert replayed.result["ending"] == "done" and replayed.result["unfinished"] == []
    assert replayed.comparison is None or replayed.comparison.explained, replayed.comparison.describe()
