"""What the hunt over fresh seeds 364-395 found (campaigns of
`python -m flightcheck.vllm.campaign ... --reuse-ids --jobs 2 --no-mutants`,
the trace, workload and replay result of each case kept in
tests/data/vllm/hunt395).

* A ground-truth gap, 0.34.0 sync: seed 372 index 85 (`--versions
  0.34.0,0.33.0 --all-features --spec-tokens 3 --lookahead --stages 1`; a
  KV connector, unchunked). r4 is preempted at engine step 1 for r3's
  recompute after r3's failed load; r3's turn ends at step 3 and it parks
  holding 8 of the 16 blocks. r4's 13 tokens hit 12 in the prefix cache,
  so the waiting loop pads its one token left to 1 + k = 4 (`Scheduler.
  schedule`, "Pad new decode requests to uniform spec decoding size",
  0.33.0/0.34.0) and `allocate_slots` asks 12 + 4 + 3 lookahead slots = 10
  blocks of the 8 free: vLLM admits nobody until r3's next input, and
  admits r4 only at the session's end. So the idle is r3's client's, as
  check-trace's L2 read it (accepted); the ground truth read r4's need as
  its 13 tokens from nothing plus the slots, 8 blocks, the 8 free enough,
  and called the idle a stall (a miss). session_idles.py `blocks_to_admit`
  now starts past the hit (`_prefix_hit`, the coordinator's
  `find_longest_cache_hit`) and pads as vLLM does (`_padded_chunk`).
* A differential gap (the classifier), 0.34.0 and 0.33.0 sync: seed 375
  index 41 (`--all-features --spec-tokens 3`, 3 stages), unexplained on
  both. vLLM's sync engine hands r2's drafts over at submission
  (`drafts_handed_over_at_submission`, named), so the next `schedule()`
  asks blocks for r2's 1 + 3 tokens while the entry sampling its token is
  still in flight and preempts r2 (decision 14), where the reference,
  whose drafts come with the completion, completes an empty batch first;
  the classifier knew the deviation only by a double sample or two
  completions differing in drafts, read the empty completion as 0.8.x's
  `engine_blocked_in_flight`, which 0.3x cannot name, and left it
  unexplained. The conforming run (drafts at submission, then the padding's
  assertion, `padded_admission_cut_by_threshold`'s) equals vLLM's to its
  end. decision_rules.py `_drafts_preempt_a_sampler_in_flight` now names it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from flightcheck.verification.traces.check import check_trace
from flightcheck.verification.traces.reading import read_trace_file
from flightcheck.vllm.campaign import compare_workload
from flightcheck.vllm.differential import classify, decisions, profile_for, read_trace

from .vllm_support import DATA, KeptCase, Workers, replay_kept_workload, workers

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

HUNT = DATA / "hunt395"
PADDED_BEHIND_PARKED = KeptCase(HUNT / "034_sync_padded_admission_past_a_hit_behind_parked_blocks_seed372_85")
DRAFTS_PREEMPT = {version: KeptCase(HUNT / f"{tag}_sync_drafts_at_submission_preempt_a_sampler_in_flight_seed375_41")
                  for version, tag in (("0.34.0", "034"), ("0.33.0", "033"))}


def _index(events: list[dict[str, Any]], ev: str, req: str, **fields: object) -> int:
    return next(i for i, e in enumerate(events) if e["ev"] == ev and e.get("req") == req
                and all(e.get(k) == v for k, v in fields.items()))


def test_check_trace_accepts_the_padded_admission_the_parked_blocks_keep_out() -> None:
    events = read_trace_file(str(PADDED_BEHIND_PARKED.trace))
    assert (events[0]["num_spec_tokens"], events[0]["num_lookahead_tokens"], events[0]["usable_blocks"]) == (3, 3, 16)
    preempted = next(i for i, e in enumerate(events) if e["ev"] == "schedule" and e.get("preempted") == ["r4"])
    session_end = _index(events, "input", "r3", end_of_session=True)
    admitted = next(i for i, e in enumerate(events) if e["ev"] == "schedule" and e.get("batch")
                    and [entry["req"] for entry in e["entries"]] == ["r4"])
    assert preempted < session_end < admitted        # r4 waits for r3's end, r3's turns run meanwhile
    assert events[admitted]["entries"][0]["cached"] == 8
    result = check_trace(PADDED_BEHIND_PARKED.trace)
    assert result.ok, result


def test_the_kept_result_has_no_stall_and_leaves_nothing_to_the_client() -> None:
    result = PADDED_BEHIND_PARKED.result()
    assert (result["ending"], result["stalls"], result["left_to_clients"]) == ("done", [], [])
    assert result["ground_truth"]["double_samples"] == []


@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
def test_drafts_handed_over_at_submission_that_preempt_a_sampler_in_flight_are_named(version: str) -> None:
    case = DRAFTS_PREEMPT[version]
    result, events = case.result(), read_trace(case.trace)
    assert result["ending"] == "exception" and "1 + self.num_spec_tokens" in result["exception"]
    comparison, ours = compare_workload(case.raw(), result, events, profile_for(version, False))
    theirs = decisions(events)
    assert (theirs[14], ours[14]) == (("schedule", (), ("r2",)), ("complete", (), ()))
    assert theirs[12][1][0][:4] == ("r2", 21, 2, True)               # r2's sampling entry, still in flight
    assert comparison.explained and comparison.deviation == "drafts_handed_over_at_submission", \
        comparison.describe()


def test_the_same_decisions_async_or_with_the_token_back_are_not_named_so() -> None:
    case = DRAFTS_PREEMPT["0.34.0"]
    result, theirs = case.result(), decisions(read_trace(case.trace))
    ours = [*theirs[:14], ("complete", (), ())]
    assert classify(result, theirs, ours, 14) == "drafts_handed_over_at_submission"
    assert classify({**result, "async_scheduling": True}, theirs, ours, 14) != "drafts_handed_over_at_submission"
    given_back = [*theirs[:14], ("complete", (("r2", (1,)),), ())]     # r2's token came back before
    assert classify(result, [*given_back, theirs[14]], [*given_back, ("complete", (), ())], 15) \
        != "drafts_handed_over_at_submission"


# --- on vLLM itself (slow): the kept workload, the ground truth and check-trace together


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_keeps_the_padded_admission_out_until_the_sessions_end_and_no_stall_is_called(running: Workers) -> None:
    replayed = replay_kept_workload(running["0.34.0"], PADDED_BEHIND_PARKED, "0.34.0")
    assert replayed.result["batches"] == PADDED_BEHIND_PARKED.result()["batches"]
    assert replayed.result["stalls"] == [] and replayed.result["ending"] == "done"
    assert replayed.category == "accepted, correct run", replayed.detail


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
def test_vllm_preempts_the_sampler_its_early_drafts_grow_and_the_differential_names_it(running: Workers,
                                                                                       version: str) -> None:
    replayed = replay_kept_workload(running[version], DRAFTS_PREEMPT[version], version)
    assert replayed.comparison is not None and replayed.comparison.explained, replayed.comparison.describe()
    assert replayed.comparison.deviation == "drafts_handed_over_at_submission"
