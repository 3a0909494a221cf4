"""What the hunt over fresh seeds 389-402 found (campaigns of
`python -m flightcheck.vllm.campaign ... --reuse-ids --jobs 1 --no-mutants`,
the trace, workload and replay result of each case kept in
tests/data/vllm/hunt402; seeds 389-395 kept as 03x_<seed>_...).

* A check-trace error, 0.34.0 sync: seed 392 index 47 (`--versions
  0.34.0,0.33.0 --kv-connector --spec-tokens 3 --lookahead --stages 2`).
  vLLM's sync engine hands the scheduler the drafts proposed for a batch
  as soon as it submits it (0.34.0 `EngineCore.post_step`:
  `take_draft_token_ids` -> `Scheduler.update_draft_token_ids`). With two
  stages the next `schedule()` runs while r1's sampling entry is in flight,
  counts r1's 3 handed-over drafts (`num_tokens_with_spec -
  num_computed_tokens`) and their lookahead slots, finds no block
  (a producer holds r0's blocks for its send) and preempts r1 itself
  (`_preempt_request`); the in-flight token comes back stale and is
  dropped. check-trace took the hand-over from a preemption only for a
  request with nothing in flight (verification/traces/drafts.py
  `_hand_over_to_preempted`), so it saw r1 with nothing to schedule and
  rejected the preemption as `illegal_schedule` at step 6, before the
  double sample the ground truth names at step 10: a false rejection,
  masked by that later bug. Rerun with another model seed (the workload's
  `seed` + 7919 * 25: only the drafts and their acceptance change) vLLM
  preempts r1 alike at step 14 and no bug follows: check-trace rejected a
  correct run. The spec's `hand_over_drafts` allows a request whose newest
  live entry samples; the checker now tries the hand-over for those too.
  The root, of the double sample too, is vLLM #52071 (open; PR #52179):
  `Scheduler.schedule` keeps a request's decodes `pp_size` steps apart by
  `next_decode_eligible_step`, which only `AsyncScheduler` sets.
* A ground-truth gap, 0.34.0 sync and async: seed 390 index 161
  (`--versions 0.34.0 --all-features --spec-tokens 1 --lookahead --stages
  1`; a KV connector, 3 usable blocks of 8). r0, a streaming session,
  parks after its turn holding 2 blocks; r3 (2 tokens, both offered as an
  async load: 1 block) heads the waiting loop with 1 block free, but
  `allocate_slots(reserved_blocks=...)` admits an async load only into the
  free blocks less `_inflight_prefill_reserved_blocks()` and
  `_spec_decode_step_blocks` (cdiv(1 + 1 + 1, 8) = 1; 0.33.0/0.34.0
  `Scheduler.schedule`, `load_kv_async`): r3 waits until the session's end
  frees r0's blocks. check-trace's L2 read the idle as the session's
  client's (spec/kv_loads.py `fits_beside_reservations`), the ground truth
  (session_idles.py `blocks_to_admit`) counted r3's block without the margin
  and called it a stall: a miss. It now reads the connector's async offer
  and the reservation (`_async_load`).
* A check-trace false rejection, 0.34.0 sync: seed 391 index 14
  (`--versions 0.34.0,0.33.0 --all-features --spec-tokens 3 --lookahead
  --stages 1`; the priority policy, prefix caching off, blocks of 2). r2
  (priority 2) decodes after its prefill; the sync engine handed it 3
  drafts at the prefill's submission (`EngineCore.post_step`), which no
  event shows. The running loop schedules r2 first: 1 + 3 tokens and 3
  lookahead slots take 2 new blocks (14, 15); r3 (priority 0) then finds
  too few and the priority branch preempts r2, scheduled earlier in the
  call: its entry is taken back and `KVCacheManager.free` returns its
  table, last block first, to the head of the free queue (0.34.0
  `BlockPool.free_blocks`: unhashed blocks `prepend_n`), so r3 gets
  15, 14, 1. The checker tried the unseen hand-over only where the spec's
  entries and preemptions differ from the trace's; here they agree and
  only the blocks differ (without the drafts r2 takes 1 block and r3
  gets 14, 1, 2): S9 at line 19, though the ground truth names nothing.
  The search over unseen counts (verification/traces/drafts.py
  `_schedules_as`) now compares the blocks too; every other kept trace
  keeps its verdict.
* A ground-truth gap, 0.33.0 sync and async: seed 391 index 51 (same
  campaign; a KV connector, the priority policy, 4 tokens a step). r1 (13
  tokens, offered 12 by a sync load) arrives at step 0 and heads the
  waiting loop: its one token left is padded to 1 + 3 and the loop breaks,
  since that exceeds `input_budget - draft_slots` = 4 - 1 (0.33.0
  `Scheduler.schedule`, "Prefer to not schedule than schedule
  un-padded"), so schedule() forms nothing, every call. A connector reset
  at step 1 makes the connector offer nothing and r1 is admitted from 0.
  check-trace rejects L2 after step 0's inputs (line 5; at r1's arrival,
  line 2, before the hunt over seeds 417-423); the ground truth named nothing,
  since its busy loop counted the arrival's step as new work, leaving a
  zero-step idle for the short-idle replay. That step's schedule() had
  read the arrival: the idle now begins there (run_endings.py
  `IdleCount.quiet`), and vLLM replayed with the inputs from step 1 cut
  ends stuck with no batch formed: a stall, vLLM's, from step 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from flightcheck.verification.traces.check import check_trace
from flightcheck.verification.traces.reading import read_trace_file
from flightcheck.vllm.replay import findings

from .vllm_support import DATA, KeptCase, Workers, replay_kept_workload, workers

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

HUNT = DATA / "hunt402"
_STEM = "034_392_sync_drafts_handed_over_preempt_their_sampler_in_flight_seed392_47"
MASKED = KeptCase(HUNT / _STEM)                              # the campaign's run: a double sample follows
UNMASKED = KeptCase(HUNT / f"{_STEM}_model_seed_v24")        # another model seed: nothing follows


VICTIM_DRAFTS = KeptCase(HUNT / "034_391_sync_priority_victim_drafts_took_two_blocks_seed391_14")

PADDED_STALL = {mode: KeptCase(HUNT / f"035_391_{mode}_padded_admission_stall_ended_by_a_connector_reset_seed391_51")
                for mode in ("sync", "async")}

MARGIN = {mode: KeptCase(HUNT / f"034_390_{mode}_async_load_behind_the_spec_margin_beside_a_parked_session_seed390_161")
          for mode in ("sync", "async")}


def _self_preemption(events: list[dict[str, Any]], req: str) -> tuple[int, int]:
    """The line of the `schedule` that preempts `req` and forms no batch, and
    the batch of `req`'s sampling entry in flight then."""
    at = next(i for i, e in enumerate(events) if e["ev"] == "schedule" and e.get("preempted") == [req]
              and e["batch"] is None)
    in_flight = {e["batch"] for e in events[:at] if e["ev"] == "schedule" and e["batch"] is not None
                 and any(x["req"] == req and x["samples"] for x in e["entries"])}
    in_flight -= {e["batch"] for e in events[:at] if e["ev"] == "complete"}
    assert len(in_flight) == 1
    return at, in_flight.pop()


@pytest.mark.parametrize("case", [MASKED, UNMASKED], ids=["campaign", "model-seed-v24"])
def test_vllm_preempts_a_sampler_in_flight_for_its_handed_over_drafts(case: KeptCase) -> None:
    events = read_trace_file(str(case.trace))
    config = events[0]
    assert (config["num_stages"], config["num_spec_tokens"], config["num_lookahead_tokens"]) == (2, 3, 3)
    at, batch = _self_preemption(events, "r1")
    completion = next(e for e in events[at:] if e["ev"] == "complete" and e["batch"] == batch)
    assert completion["stale"] == ["r1"] and completion["dropped"] == ["r1"]


def test_check_trace_accepts_the_self_preemption_when_no_bug_follows() -> None:
    assert findings(UNMASKED.result()) == [] and UNMASKED.result()["ending"] == "done"
    result = check_trace(UNMASKED.trace)
    assert result.ok, result


def test_check_trace_rejects_the_campaign_run_at_the_double_sample_the_ground_truth_names() -> None:
    events = read_trace_file(str(MASKED.trace))
    double = MASKED.result()["ground_truth"]["double_samples"]
    assert [(d["req"], d["batch"], d["in_flight"], d["step"]) for d in double] == [("r1", 5, 4, 10)]
    result = check_trace(MASKED.trace)
    assert not result.ok and result.property == "S5_one_sample_per_prefill", result
    rejected = events[result.line - 1]
    assert (rejected["ev"], rejected["batch"], rejected["step"]) == ("schedule", 5, 10)
    assert result.line - 1 > _self_preemption(events, "r1")[0]     # past the preemption, not at it


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_check_trace_accepts_an_async_load_the_margin_keeps_behind_a_parked_session(mode: str) -> None:
    case = MARGIN[mode]
    events = read_trace_file(str(case.trace))
    assert (events[0]["num_spec_tokens"], events[0]["num_lookahead_tokens"], events[0]["usable_blocks"],
            events[0]["block_size"]) == (1, 1, 3, 8)
    arrived = next(i for i, e in enumerate(events) if e["ev"] == "arrive" and e["req"] == "r3")
    assert events[arrived]["prompt_len"] == 2 and events[arrived]["load_async"]
    session_end = next(i for i, e in enumerate(events) if e["ev"] == "input" and e.get("end_of_session"))
    load = next(i for i, e in enumerate(events) if e["ev"] == "schedule"
                and any(x["req"] == "r3" for x in e.get("kv_loads", ())))
    assert session_end < load                  # r3's load starts only once the session has ended
    result = case.result()
    assert (result["ending"], result["stalls"], findings(result)) == ("done", [], [])
    assert check_trace(case.trace).ok


def test_check_trace_accepts_the_blocks_a_priority_victims_unseen_drafts_took() -> None:
    events = read_trace_file(str(VICTIM_DRAFTS.trace))
    config = events[0]
    assert (config["scheduling_policy"], config["num_spec_tokens"], config["num_lookahead_tokens"],
            config["prefix_caching"]) == ("priority", 3, 3, False)
    victim = events[18]                                          # line 19
    assert victim["preempted"] == ["r2"] and [(x["req"], x["block_ids"]) for x in victim["entries"]] \
        == [("r3", [15, 14, 1])]
    assert not any(e.get("next_drafts") for e in events[:18] if e["ev"] == "complete")   # no drafts shown
    result = VICTIM_DRAFTS.result()
    assert findings(result) == [] and result["ending"] == "stuck"   # the ground truth names nothing
    assert check_trace(VICTIM_DRAFTS.trace).ok


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_stall_from_the_arrivals_own_step_is_named_beside_check_traces_l2(mode: str) -> None:
    case = PADDED_STALL[mode]
    events = read_trace_file(str(case.trace))
    config = events[0]
    assert (config["max_num_batched_tokens"], config["num_spec_tokens"], config["draft_input_slots"]) == (4, 3, 1)
    arrival = events[1]
    assert (arrival["ev"], arrival["req"], arrival["prompt_len"], arrival["external_hit"], arrival["load_async"],
            arrival["engine_step"]) == ("arrive", "r1", 13, 16, False, 0)
    # engine step 0 formed nothing; the connector's reset at step 1 comes before r1's first entry
    empty = next(e["empty_batches_before"] for e in events if "empty_batches_before" in e)
    assert empty[0]["ev"] == "schedule" and empty[0]["step"] == 1
    reset = next(i for i, e in enumerate(events) if e["ev"] == "reset")
    first = next(i for i, e in enumerate(events) if e["ev"] == "schedule" and e["entries"])
    assert events[reset]["connector"] and events[reset]["engine_step"] == 1 and reset < first
    assert events[first]["entries"][0]["req"] == "r1" and events[first]["entries"][0]["start"] == 0
    result = case.result()
    assert result["stalls"] == [{"step": 0, "until": 1, "unfinished": ["r1", "r3"]}] and findings(result)
    verdict = check_trace(case.trace)
    # after the last input of engine step 0 (r4's abort, line 5): the state the first schedule() call
    # meets (verification/traces/step_inputs.py; r1's arrival at line 2 stalls it already)
    assert [e["ev"] for e in events[1:5]] == ["arrive"] * 3 + ["abort"] and {e["step"] for e in events[1:5]} == {0}
    assert (verdict.ok, verdict.property, verdict.line) == (False, "L2_no_deadlock", 5)


# --- on vLLM itself (slow): the kept workload, the ground truth and check-trace together


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_makes_the_kept_self_preemption_again_and_check_trace_accepts_it(running: Workers) -> None:
    replayed = replay_kept_workload(running["0.34.0"], UNMASKED, "0.34.0")
    assert replayed.result["batches"] == UNMASKED.result()["batches"]
    assert findings(replayed.result) == []
    assert replayed.category == "accepted, correct run", replayed.detail


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_vllm_keeps_the_async_load_behind_the_margin_and_no_stall_is_called(running: Workers, mode: str) -> None:
    replayed = replay_kept_workload(running["0.34.0"], MARGIN[mode], "0.34.0", mode == "async")
    assert replayed.result["batches"] == MARGIN[mode].result()["batches"]
    assert replayed.result["stalls"] == [] and replayed.category == "accepted, correct run", replayed.detail


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_gives_the_victims_blocks_first_and_check_trace_accepts_it(running: Workers) -> None:
    replayed = replay_kept_workload(running["0.34.0"], VICTIM_DRAFTS, "0.34.0")
    assert replayed.result["batches"] == VICTIM_DRAFTS.result()["batches"]
    assert findings(replayed.result) == [] and replayed.category == "accepted, correct run", replayed.detail


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_vllm_stays_idle_from_the_padded_arrival_without_the_reset_a_real_bug(running: Workers, mode: str) -> None:
    replayed = replay_kept_workload(running["0.33.0"], PADDED_STALL[mode], "0.33.0", mode == "async")
    assert replayed.result["batches"] == PADDED_STALL[mode].result()["batches"]
    # the short idle's replay with the inputs from step 1 cut ended stuck, no batch formed
    assert replayed.result["stalls"] == [{"step": 0, "until": 1, "unfinished": ["r1", "r3"]}]
    assert replayed.category == "rejected, real bug" and replayed.detail.endswith("L2_no_deadlock"), replayed.detail
