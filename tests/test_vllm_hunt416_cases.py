"""What the hunt over fresh seeds 410-416, releases alone, found (campaigns
of `python -m flightcheck.vllm.campaign ... --reuse-ids --jobs 1
--no-mutants`, one seed a campaign; the trace, workload and replay result of
each case kept in tests/data/vllm/hunt416 as 05x_<seed>_...).

* A differential gap, 1 unexplained, 0.8.5 sync: seed 410 index 74
  (`--versions 0.8.5,0.8.4 --spec-tokens 2 --stages 2`). r1 (24 prompt
  tokens) sampled its first token, was preempted and resumed: 25 tokens.
  Its chunk 18-24 of batch 13 is partial for the scheduler (`samples`
  false), but vLLM's model runner samples wherever an entry reaches the
  tokens it was told of (0.8.5 `GPUModelRunner._update_states` and
  `execute_model`; flightcheck/vllm/engine.py), here one short, and
  returns a token. Before batch 13 comes back r1 is preempted again (a
  `schedule` with no batch), so 0.8.5 `Scheduler.update_from_output`, which
  walks `self.running`, drops it: vLLM's completion drops r1's token, the
  reference's, whose entry did not sample, has none. Applied, the same
  runner's token is the named `partial_chunk_token_dropped` (the ground
  truth's `partial_chunk_tokens`; here at batch 17, where check-trace
  rejects S5); dropped, the differential named nothing. It now names it
  when the two completions apply the same tokens and vLLM drops one more
  (differential.py `_dropped_a_token_the_reference_never_sampled`), and the
  conforming reference (`worker_decides_sampling`) makes the same drop.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flightcheck.verification.traces.check import check_events
from flightcheck.verification.traces.ground_truth import expected_verdict
from flightcheck.vllm.differential import classify, compare, read_trace, run_reference

from .vllm_support import DATA, KeptCase, Workers, replay_kept_workload, workers

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

HUNT = DATA / "hunt416"
PARTIAL_DROPPED = KeptCase(HUNT / "050_410_085_sync_partial_chunk_token_dropped_by_a_preemption_seed410_74")

RELEASE_085 = {"vllm_version": "0.8.5", "ground_truth": {}}


def test_the_runner_samples_a_partial_chunk_whose_request_is_preempted_before_it_returns() -> None:
    events = read_trace(PARTIAL_DROPPED.trace)
    assert (events[0]["num_stages"], events[0]["num_spec_tokens"], events[0]["vllm_version"]) == (2, 2, "0.8.5")
    schedule = next(e for e in events if e["ev"] == "schedule" and e["batch"] == 13)
    entry = next(x for x in schedule["entries"] if x["req"] == "r1")
    assert (entry["start"], entry["n"], entry["samples"]) == (18, 6, False)
    completion = next(i for i, e in enumerate(events) if e["ev"] == "complete" and e["batch"] == 13)
    assert events[completion - 1]["batch"] is None and events[completion - 1]["preempted"] == ["r1"]
    assert events[completion]["tokens"]["r1"] and events[completion]["dropped"] == ["r1"]


def test_the_differential_names_the_dropped_partial_chunk_token_and_the_conforming_run_drops_it_too() -> None:
    raw, result = PARTIAL_DROPPED.raw(), PARTIAL_DROPPED.result()
    comparison = compare(raw["name"], result, read_trace(PARTIAL_DROPPED.trace), run_reference(raw, "vllm-0.8.5"),
                         run_reference(raw, "vllm-0.8.5", vllm_outputs=True))
    assert comparison.deviation == "partial_chunk_token_dropped" and comparison.explained, comparison.describe()
    assert comparison.first_difference.startswith("event 27: vLLM ('complete', (('r2', (14588,)),), ('r1',)")


@pytest.mark.parametrize(("ours", "named"), [
    (("complete", (("r2", (7,)),), ()), "partial_chunk_token_dropped"),     # the reference had no token for r1
    (("complete", (("r2", (7,)),), ("r1",)), None),                          # both dropped it: no difference there
    (("complete", (("r2", (7,)),), (), (("r2", 2),)), None),                 # the drafts differ too
    (("complete", (("r1", (5,)), ("r2", (7,))), ()), "orphaned_token_kept"),  # the reference applied it: another rule
])
def test_a_dropped_token_is_the_runners_only_where_the_reference_had_none(ours: tuple, named: str | None) -> None:
    theirs = ("complete", (("r2", (7,)),), ("r1",))
    assert classify(RELEASE_085, [theirs], [ours], 0) == named


def test_check_trace_rejects_the_run_where_the_ground_truth_puts_the_applied_partial_chunk_token() -> None:
    events = read_trace(PARTIAL_DROPPED.trace)
    result = PARTIAL_DROPPED.result()
    assert [(p["batch"], p["req"]) for p in result["ground_truth"]["partial_chunk_tokens"]] == [(17, "r1")]
    verdict = check_events(events)
    expected = expected_verdict(result, events)
    assert not verdict.ok and verdict.property == "S5_one_sample_per_prefill"
    rejected = events[verdict.event_index]
    assert (rejected["ev"], rejected["batch"]) == ("complete", 17)
    assert expected.agrees(verdict), (expected, verdict.to_json())


# --- on vLLM itself (slow): the kept workload, the differential and check-trace together


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_drops_the_partial_chunks_token_again_and_the_differential_names_it(running: Workers) -> None:
    replayed = replay_kept_workload(running["0.8.5"], PARTIAL_DROPPED, "0.8.5")
    assert replayed.result["batches"] == PARTIAL_DROPPED.result()["batches"]
    assert replayed.comparison.deviation == "partial_chunk_token_dropped" and replayed.comparison.explained, \
        replayed.comparison.describe()
    assert replayed.category == "rejected, real bug", replayed.detail
