"""Sampled-token feedback (runtime/feedback.py): the last stage sends every
token it samples to stage 0, which embeds a running request's tokens from
there instead of from the scheduler's snapshot (vLLM's V2 model runner under
PP with async scheduling). Under synchronous scheduling with the switch on,
the greedy outputs stay token-identical to the snapshot path and to a dense
full-recompute decode, float64, PP = 1, 2, 3 (real stage processes for
PP > 1), and the traces still pass check-trace.

The workload is small (8 requests, the tiny preset) but preempts requests
while batches of theirs are in flight, so tokens of closed generations reach
stage 0 and must be dropped, and resumptions rebuild stage 0's view from the
whole sequence.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from flightcheck.reference import SchedulerConfig
from flightcheck.runtime import (LocalExecutor, PipelineExecutor, RuntimeTraceWriter, StageSpec,
                                 WeightSource, build_model, generate)
from flightcheck.runtime.dense import dense_greedy
from flightcheck.runtime.feedback import (FeedbackError, LocalFeedback, SampledTokens, TokenInbox,
                                          pack, unpack)
from flightcheck.runtime.workload import mixed_workload
from flightcheck.verification.traces.check import check_trace

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

torch.set_num_threads(1)

SOURCE = WeightSource(seed=1)
WORKLOAD = mixed_workload(1, 8, abort_fraction=0.25, max_tokens=(4, 12))
POOL = dict(max_num_batched_tokens=24, max_num_seqs=6, max_model_len=96, block_size=4,
            num_blocks=24)
NUM_SPEC = 2


# -- the channel and the inbox -----------------------------------------------------


def test_a_feedback_message_round_trips_through_int64_tensors():
    message = SampledTokens(7, ((3, 12, 250), (3, 13, 9), (5, 40, 0)))
    header, rows = pack(message)
    assert header.dtype == rows.dtype == torch.int64 and rows.shape == (3, 3)
    assert unpack(header, rows) == message
    empty = SampledTokens(8, ())
    assert unpack(*pack(empty)) == empty


def test_stage_zero_drops_a_token_of_a_generation_closed_meanwhile():
    """Generation 1 of a request is preempted (closed) while its token for
    position 5 is in flight; the resumption (generation 2) samples position
    5 again: stage 0 must embed generation 2's token, never generation 1's."""
    channel = LocalFeedback()
    inbox = TokenInbox(channel)
    inbox.open(1)
    channel.send(SampledTokens(1, ((1, 5, 111),)))
    inbox.close(1)
    inbox.open(2)
    channel.send(SampledTokens(2, ((2, 5, 222),)))
    assert inbox.take(2, 5, num_expected=2) == 222
    assert inbox.num_dropped == 1 and inbox.num_received == 2


def test_stage_zero_drops_the_stored_tokens_of_a_generation_when_it_closes():
    channel = LocalFeedback()
    inbox = TokenInbox(channel)
    inbox.open(1)
    inbox.open(2)
    channel.send(SampledTokens(1, ((1, 5, 111), (2, 9, 7))))
    assert inbox.take(2, 9, num_expected=1) == 7          # reads past generation 1's token
    inbox.close(1)                                          # ... which is dropped with it
    assert inbox.num_dropped == 1


def test_stage_zero_refuses_to_wait_for_a_token_no_earlier_batch_sampled():
    channel = LocalFeedback()
    inbox = TokenInbox(channel)
    inbox.open(1)
    channel.send(SampledTokens(1, ((1, 5, 111),)))
    with pytest.raises(FeedbackError, match="position 6 of generation 1"):
        inbox.take(1, 6, num_expected=1)


# -- end to end ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def expected() -> dict[str, list[int]]:
    """The dense greedy outputs (no EOS: requests run to max_tokens or abort)."""
    model = build_model(SOURCE.model_config(), SOURCE, torch.float64)
    return {g.req_id: dense_greedy(model, g.prompt_token_ids, g.max_tokens, None,
                                   POOL["max_model_len"]) for g in WORKLOAD}


def assert_matches(result, expected: dict[str, list[int]]) -> None:
    for r in result.requests:
        want = expected[r.req_id]
        if r.finish_reason == "abort":
            assert list(r.output_token_ids) == want[:len(r.output_token_ids)], r.req_id
        else:
            assert list(r.output_token_ids) == want, r.req_id


def run(executor, tmp_path, k: int, spec: int, name: str):
    cfg = SchedulerConfig(num_pipeline_stages=k, num_spec_tokens=spec, **POOL)
    path = tmp_path / f"{name}-pp{k}-spec{spec}.jsonl"
    executor.reset()
    with open(path, "w") as sink:
        result = generate(executor, cfg, WORKLOAD, trace=RuntimeTraceWriter(sink))
    return result, path


def preemptions(path) -> int:
    return sum(len(e["preempted"]) for e in map(json.loads, open(path)) if e["ev"] == "schedule")


@pytest.mark.parametrize("k", [1, 2, 3])
def test_in_process_feedback_gives_the_snapshot_paths_outputs_and_plans_carry_no_running_tokens(
        expected, tmp_path, k):
    """LocalExecutor, all stages in this process: the plans of running
    requests carry no known tokens (stage 0 cannot read them from the
    snapshot), stage 0 takes them from the last stage's messages, and tokens
    of preempted incarnations are dropped; outputs equal the snapshot path's
    and the dense decode's."""
    for spec in (0, NUM_SPEC):
        snapshot = LocalExecutor(SOURCE, k, POOL["num_blocks"], POOL["block_size"],
                                 dtype=torch.float64, num_spec_tokens=NUM_SPEC)
        feedback = LocalExecutor(SOURCE, k, POOL["num_blocks"], POOL["block_size"],
                                 dtype=torch.float64, num_spec_tokens=NUM_SPEC, feedback=True)
        plans = []
        run_plan = feedback.run_plan
        feedback.run_plan = lambda plan: (plans.append(plan), run_plan(plan))[1]
        want, _ = run(snapshot, tmp_path, k, spec, "snapshot")
        got, path = run(feedback, tmp_path, k, spec, "feedback")
        assert got.outputs() == want.outputs()
        assert_matches(got, expected)
        assert check_trace(path).ok
        running = [e for p in plans for e in p.entries if not e.replaces_table]
        assert running and all(e.known_token_ids is None for e in running)
        resumed = [e for p in plans for e in p.entries if e.is_resumption]
        assert all(e.all_token_ids is not None for e in resumed)
        if k > 1:
            assert preemptions(path) > 0 and resumed
            assert feedback.inbox is not None and 0 < feedback.inbox.num_received <= len(plans)
            assert feedback.inbox.num_dropped > 0      # tokens of closed generations


@pytest.mark.parametrize("k", [2, 3])
def test_stage_processes_with_feedback_give_the_dense_outputs_and_traces_pass(expected, tmp_path, k):
    """Real stage processes: the tokens travel from the last stage's process
    to stage 0's over torch.distributed (gloo)."""
    with PipelineExecutor.spawn(StageSpec(SOURCE, k, POOL["num_blocks"], POOL["block_size"],
                                          "float64", feedback=True),
                                num_spec_tokens=NUM_SPEC) as executor:
        for spec in (0, NUM_SPEC):
            result, path = run(executor, tmp_path, k, spec, "processes")
            assert_matches(result, expected)
            check = check_trace(path)
            assert check.ok, (check.property, check.message)
            assert preemptions(path) > 0
