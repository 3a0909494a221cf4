"""Spec decoding under asynchronous scheduling, for real (`vllm-0.33-async`
with `num_spec_tokens` > 0 over the runtime with sampled-token feedback).

The scheduler places a request's next decode, with its draft slots, before
the previous decode's tokens and drafts exist, counting the previous drafts
as accepted. The last stage sends every stage before it the tokens it
sampled, each entry's rejected-draft count and the drafts it proposed next;
every stage runs the decode at its own count of computed positions (behind
the plan's `start` by the drafts rejected meanwhile, whose positions are
written again) and stage 0 fills the draft slots with the fresh drafts
(runtime/worker.py, as vLLM's V2 runner does on the device).

Float64 greedy outputs: async + drafts equal sync + drafts, async without
drafts, PP = 1 and a dense full-recompute decode, token for token, PP = 2
and 3, in-process and in real stage processes (gloo), with an EOS the model
emits, aborts landing while a batch is in flight and a pool that preempts;
every trace passes check-trace under its profile. The tests also show that
the case in question happens: decodes placed on a predecessor in flight
whose drafts were then rejected, stages running behind the plan's start,
and draft slots filled with drafts the snapshot did not have. Plans made by
hand show the rewrite itself at the logits (a decode placed on two rejected
drafts), and seeded sampling draws the same tokens async and sync.
"""

from __future__ import annotations

import collections
import dataclasses
import json

import pytest

torch = pytest.importorskip("torch")

from flightcheck.reference import SchedulerConfig
from flightcheck.runtime import (LocalExecutor, PipelineExecutor, RuntimeTraceWriter, StageSpec,
                                 WeightSource, build_model, generate)
from flightcheck.runtime.dense import dense_logits
from flightcheck.runtime.drafter import propose_ngram
from flightcheck.runtime.feedback import (EntryFeedback, FeedbackError, LocalFeedback,
                                          SampledTokens, TokenInbox, pack, unpack)
from flightcheck.runtime.plan import BatchPlan, EntryPlan
from flightcheck.runtime.worker import (EMPTY_DRAFT_SLOT, LogitsRecord, RequestState, StageWorker,
                                        draft_slots)
from flightcheck.runtime.workload import mixed_workload
from flightcheck.verification.traces.check import check_trace

from .test_runtime_async import assert_matches, assert_same_outputs

from .fixtures import dense_oracle

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

torch.set_num_threads(1)

# Seed and lengths chosen so the tiny model repeats itself often enough for
# the n-gram drafter to propose, and some drafts are accepted, most rejected.
SOURCE = WeightSource(seed=2)
WORKLOAD = mixed_workload(2, 8, abort_fraction=0.25, max_tokens=(12, 24))
POOL = dict(max_num_batched_tokens=24, max_num_seqs=6, max_model_len=96, block_size=4,
            num_blocks=28)
SYNC, ASYNC = "vllm-0.33", "vllm-0.33-async"
NUM_SPEC = 2


@pytest.fixture(scope="module")
def oracle() -> tuple[int, dict[str, list[int]]]:
    """An EOS id the model emits (so some requests stop) and the dense greedy outputs."""
    return dense_oracle(SOURCE, WORKLOAD, POOL["max_model_len"])


def run(executor, tmp_path, k: int, profile: str, num_spec_tokens: int, eos: int):
    cfg = SchedulerConfig(num_pipeline_stages=k, profile=profile,
                          num_spec_tokens=num_spec_tokens, **POOL)
    path = tmp_path / f"{profile}-pp{k}-spec{num_spec_tokens}.jsonl"
    executor.reset()
    with open(path, "w") as sink:
        result = generate(executor, cfg, WORKLOAD, eos_token_id=eos,
                          trace=RuntimeTraceWriter(sink, eos_token_id=eos))
    check = check_trace(path)
    assert check.ok and check.profile == profile, (check.profile, check.property, check.message)
    full = check_trace(path, full=True)
    assert full.ok == check.ok, (full.property, full.message)
    return result, [json.loads(line) for line in open(path)]


def features(events: list[dict]) -> dict[str, int]:
    """What the trace shows: decodes placed while the request's previous
    sampling entry was in flight, those of them whose predecessor had drafts
    that were then rejected (the plan's start counted them as accepted),
    entries whose drafts were accepted, preemptions, stops and in-flight
    drops."""
    scheduled_at: dict[int, int] = {}
    completed: dict[int, tuple[int, dict]] = {}
    sampling: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for i, e in enumerate(events):
        if e["ev"] == "schedule" and e["batch"] is not None:
            scheduled_at[e["batch"]] = i
            for entry in e["entries"]:
                if entry["samples"]:
                    sampling[entry["req"]].append((e["batch"], entry["drafts"]))
        elif e["ev"] == "complete":
            completed[e["batch"]] = (i, e)
    overlapping = optimistic = accepted = 0
    for req, batches in sampling.items():
        for (first, drafts), (second, _) in zip(batches, batches[1:]):
            done_at, complete = completed.get(first, (len(events), {}))
            if scheduled_at[second] >= done_at:
                continue
            overlapping += 1
            returned = complete.get("tokens", {}).get(req)
            if drafts and returned and req not in complete.get("dropped", []):
                optimistic += len(returned) < drafts + 1
    for _, complete in completed.values():
        accepted += sum(len(t) > 1 for t in complete.get("tokens", {}).values())
    return {"overlapping_decodes": overlapping, "optimistic_starts": optimistic,
            "accepted_drafts": accepted,
            "preemptions": sum(len(e["preempted"]) for e in events if e["ev"] == "schedule"),
            "stops": sum(1 for e in events if e["ev"] == "finish" and e["reason"] == "stop"),
            "dropped": sum(len(e.get("dropped", [])) for e in events if e["ev"] == "complete")}


# -- the message and the inbox -----------------------------------------------------


def test_a_message_with_entry_records_round_trips_through_int64_rows():
    message = SampledTokens(4, ((3, 12, 250), (3, 13, 9)),
                            (EntryFeedback(3, 1, (7, 8)), EntryFeedback(5, 0, ()),
                             EntryFeedback(6, 2, (1,))))
    header, rows = pack(message)
    assert header.tolist() == [4, 2 + 3 + 1 + 2] and rows.shape == (8, 3)
    assert unpack(header, rows) == message


def test_a_stage_waits_for_the_record_of_the_batch_it_needs_and_refuses_a_missing_one():
    channel = LocalFeedback()
    inbox = TokenInbox(channel, keeps_tokens=False)
    inbox.open(1)
    channel.send(SampledTokens(3, ((1, 9, 40),), (EntryFeedback(1, 0, (5,)),)))
    # After a reset batch ids start again; the records go by message index.
    channel.send(SampledTokens(1, ((1, 10, 41), (1, 11, 42)), (EntryFeedback(1, 1, (6, 6)),)))
    assert inbox.settle(1, 1, num_expected=2) == EntryFeedback(1, 1, (6, 6))   # reads past #0
    assert inbox.settle(1, 0, num_expected=2) == EntryFeedback(1, 0, (5,))
    with pytest.raises(FeedbackError, match="batch #2"):
        inbox.settle(1, 2, num_expected=2)                  # never sent: no wait
    with pytest.raises(FeedbackError, match="no record"):
        inbox.settle(1, 1, num_expected=2)                  # taken already
    with pytest.raises(FeedbackError):
        inbox.take(1, 10, num_expected=2)                   # a middle stage keeps no tokens


def test_draft_slots_take_the_proposed_drafts_and_mark_the_empty_ones():
    assert draft_slots((4, 5, 6), 2) == [4, 5]
    assert draft_slots((4,), 3) == [4, 0, 0]
    assert draft_slots((), 0) == []


# -- end to end ----------------------------------------------------------------------


def record_stage0_drafts(executor: LocalExecutor) -> list[tuple[list[int], list[int]]]:
    """(the true token prefix up to an entry's known tokens, the draft slots
    stage 0 embedded) for every entry with draft slots."""
    seen: list[tuple[list[int], list[int]]] = []
    worker = executor.workers[0]
    entry_token_ids = worker.entry_token_ids

    def recording(e: EntryPlan, state: RequestState, start: int) -> list[int]:
        tokens = entry_token_ids(e, state, start)
        if e.num_drafts:
            seen.append((list(state.history[:start + e.num_known]), tokens[e.num_known:]))
        return tokens

    worker.entry_token_ids = recording
    return seen


@pytest.mark.parametrize("k", [1, 2, 3])
def test_in_process_async_drafts_equal_sync_drafts_async_and_the_dense_decode(
        oracle, tmp_path, k):
    """All stages in this process. Stage 0's draft slots hold the drafts the
    n-gram drafter proposes from the true token prefix (what sync scheduling
    would have put in the plan), not the plan's older ones."""
    eos, expected = oracle
    executor = LocalExecutor(SOURCE, k, POOL["num_blocks"], POOL["block_size"],
                             dtype=torch.float64, num_spec_tokens=NUM_SPEC, feedback=True)
    sync, sync_events = run(executor, tmp_path, k, SYNC, NUM_SPEC, eos)
    assert all(w.num_behind_plan == 0 for w in executor.workers)   # sync: the plan is right
    plain, _ = run(executor, tmp_path, k, ASYNC, 0, eos)
    counts = [(w.num_behind_plan, w.num_drafts_not_in_plan) for w in executor.workers]
    assert counts == [(0, 0)] * k                                   # no drafts: nothing to do
    slots = record_stage0_drafts(executor)
    asynchronous, events = run(executor, tmp_path, k, ASYNC, NUM_SPEC, eos)
    assert_same_outputs(asynchronous, sync, plain)
    assert_matches(asynchronous, expected)
    f = features(events)
    assert f["overlapping_decodes"] > 0 and f["optimistic_starts"] > 0, f
    assert f["accepted_drafts"] > 0 and f["stops"] > 0 and f["dropped"] > 0, f
    assert any(r.finish_reason == "abort" for r in asynchronous.requests)
    assert features(sync_events)["overlapping_decodes"] == 0
    # Every stage ran some decode behind the plan's start, and stage 0 and
    # the last stage (which checks them) filled draft slots the plan had wrong.
    assert all(w.num_behind_plan > 0 for w in executor.workers), counts
    assert executor.workers[0].num_drafts_not_in_plan > 0
    assert executor.workers[-1].num_drafts_not_in_plan == executor.workers[0].num_drafts_not_in_plan
    assert slots and all(drafts == draft_slots(tuple(propose_ngram(prefix, NUM_SPEC)),
                                               len(drafts)) for prefix, drafts in slots)
    if k > 1:
        assert f["preemptions"] > 0, f


def test_running_a_decode_at_the_plans_start_is_caught(oracle, tmp_path, monkeypatch):
    """The differential can fail: stages that ran a decode at the scheduler's
    start (counting rejected drafts as accepted) leave holes in stage 0's
    tokens, and the run stops with a FeedbackError instead of a wrong output."""
    eos, _ = oracle
    true_start = StageWorker._true_start

    def at_plan_start(self: StageWorker, e: EntryPlan, state: RequestState) -> int:
        true_start(self, e, state)
        state.num_computed = e.start
        return e.start

    monkeypatch.setattr(StageWorker, "_true_start", at_plan_start)
    executor = LocalExecutor(SOURCE, 2, POOL["num_blocks"], POOL["block_size"],
                             dtype=torch.float64, num_spec_tokens=NUM_SPEC, feedback=True)
    cfg = SchedulerConfig(num_pipeline_stages=2, profile=ASYNC, num_spec_tokens=NUM_SPEC, **POOL)
    with pytest.raises(FeedbackError):
        generate(executor, cfg, WORKLOAD, eos_token_id=eos)


@pytest.mark.parametrize("k", [2, 3])
def test_async_drafts_in_stage_processes_equal_sync_drafts_async_and_pp1(oracle, tmp_path, k):
    """Real stage processes: the records travel from the last stage's process
    to every other stage's over gloo."""
    eos, expected = oracle
    single = LocalExecutor(SOURCE, 1, POOL["num_blocks"], POOL["block_size"],
                           dtype=torch.float64, num_spec_tokens=NUM_SPEC, feedback=True)
    pp1, _ = run(single, tmp_path, 1, ASYNC, NUM_SPEC, eos)
    with PipelineExecutor.spawn(StageSpec(SOURCE, k, POOL["num_blocks"], POOL["block_size"],
                                          "float64", feedback=True),
                                num_spec_tokens=NUM_SPEC) as executor:
        sync, sync_events = run(executor, tmp_path, k, SYNC, NUM_SPEC, eos)
        plain, _ = run(executor, tmp_path, k, ASYNC, 0, eos)
        asynchronous, events = run(executor, tmp_path, k, ASYNC, NUM_SPEC, eos)
    assert_same_outputs(asynchronous, sync, plain, pp1)
    assert_matches(asynchronous, expected)
    f = features(events)
    assert f["overlapping_decodes"] > 0 and f["optimistic_starts"] > 0, f
    assert f["accepted_drafts"] > 0 and f["preemptions"] > 0 and f["stops"] > 0, f
    assert f["dropped"] > 0 and any(r.finish_reason == "abort" for r in asynchronous.requests), f
    assert features(sync_events)["overlapping_decodes"] == 0


def test_seeded_sampling_with_drafts_gives_the_same_tokens_async_and_sync(tmp_path):
    """Temperature 0.8, a seed per request: a token is drawn from a generator
    seeded by (request seed, position), so it depends on the true position
    only; async + drafts (decodes run behind the plan's start) draws the
    same tokens as sync + drafts and async without drafts, PP = 2."""
    workload = [dataclasses.replace(g, temperature=0.8, seed=i) for i, g in enumerate(WORKLOAD)]
    results = []
    for profile, num_spec_tokens in ((SYNC, NUM_SPEC), (ASYNC, 0), (ASYNC, NUM_SPEC)):
        executor = LocalExecutor(SOURCE, 2, POOL["num_blocks"], POOL["block_size"],
                                 dtype=torch.float64, num_spec_tokens=NUM_SPEC, feedback=True)
        cfg = SchedulerConfig(num_pipeline_stages=2, profile=profile,
                              num_spec_tokens=num_spec_tokens, **POOL)
        results.append(generate(executor, cfg, workload))
    assert all(w.num_behind_plan > 0 for w in executor.workers)
    assert_same_outputs(*results)


def test_a_decode_placed_on_rejected_drafts_rewrites_their_positions_and_matches_dense_logits():
    """Plans by hand, PP = 2 in-process, float64. Batch 2 decodes with two
    draft slots; the drafter proposes nothing for a prompt without repeats,
    so the slots hold token 0, which the model rejects, and their K/V at
    positions 7 and 8 are garbage. Batch 3 was placed (async) as if both
    drafts were accepted, at 9: the stages run it at 7 and write 7 again;
    batch 4 (placed at 8 once the scheduler has caught up) writes 8 again.
    Every sampled row's logits equal a dense recompute of the true sequence."""
    executor = LocalExecutor(SOURCE, 2, 8, 4, dtype=torch.float64, num_spec_tokens=NUM_SPEC,
                             feedback=True)
    executor.workers[-1].record = record = LogitsRecord()
    prompt = (11, 22, 33, 44, 55, 66)

    def running(start: int, num_new: int, drafts: tuple[int, ...] = ()) -> EntryPlan:
        return EntryPlan("r", start, num_new, None, drafts, (), False, None)

    admission = EntryPlan("r", 0, 6, prompt, (), (0, 1, 2, 3), True, prompt)
    first = executor.run_plan(BatchPlan(1, (admission,), (), NUM_SPEC))
    assert first.draft_token_ids == ((),)                 # no repeats: no drafts proposed
    # The plan's drafts are ignored with feedback (stale under async): the slots
    # are filled from the (empty) proposal.
    second = executor.run_plan(BatchPlan(2, (running(6, 3, (5, 5)),), (), NUM_SPEC))
    model = build_model(SOURCE.model_config(), SOURCE, torch.float64)
    sequence = [*prompt, *first.sampled_token_ids[0]]
    assert dense_logits(model, sequence)[-1].argmax() != EMPTY_DRAFT_SLOT
    assert len(second.sampled_token_ids[0]) == 1          # both drafts rejected
    sequence += second.sampled_token_ids[0]
    third = executor.run_plan(BatchPlan(3, (running(9, 1),), (), NUM_SPEC))
    sequence += third.sampled_token_ids[0]
    fourth = executor.run_plan(BatchPlan(4, (running(8, 1),), (), NUM_SPEC))
    sequence += fourth.sampled_token_ids[0]
    assert [w.num_behind_plan for w in executor.workers] == [1, 1]
    dense = dense_logits(model, sequence)
    # Rows of batch 2 past its known token (positions 7 and 8) read the
    # rejected drafts; every other row reads only true tokens.
    valid = [r for i, r in enumerate(record.rows) if i not in (2, 3)]
    assert [p for _, p, _ in valid] == [5, 6, 7, 8]
    for _, position, row in valid:
        assert torch.allclose(row, dense[position], atol=1e-10, rtol=0), position
