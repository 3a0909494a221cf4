"""Differential tests of the pipeline runtime, in float64 (so summation order
cannot flip a greedy choice): for PP = 1, 2, 3 (real stage processes for
PP > 1), continue_prefill on and off, spec decode on and off, the greedy
outputs of a mixed workload equal a dense full-recompute greedy decode
(aborted requests: a prefix of it), and every trace passes check-trace.

The workload: 14 requests, prompts of 3-60 tokens (shared prefixes for
prefix-cache hits, repeated motifs for prompt-lookup drafts), a 24-token
budget (prefills split into chunks), a 30-block pool of 4-token blocks
(preemption), and 4 requests aborted while a batch of theirs is in flight.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from flightcheck.reference import SchedulerConfig
from flightcheck.runtime import (LocalExecutor, PipelineExecutor, RuntimeTraceWriter, StageSpec,
                                 WeightSource, generate)
from flightcheck.runtime.workload import mixed_workload
from flightcheck.verification.mutants.patching import reference_applied
from flightcheck.verification.traces.check import check_trace

from .fixtures import dense_oracle

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

torch.set_num_threads(1)

SOURCE = WeightSource(seed=1)
WORKLOAD = mixed_workload(1, 14, abort_fraction=0.25, max_tokens=(4, 20))
POOL = dict(max_num_batched_tokens=24, max_num_seqs=6, max_model_len=96, block_size=4,
            num_blocks=30)
NUM_SPEC = 2
MATRIX = [(k, cp, spec) for k in (1, 2, 3) for cp in (True, False) for spec in (0, NUM_SPEC)]


@pytest.fixture(scope="module")
def oracle() -> tuple[int, dict[str, list[int]]]:
    """An EOS id the model emits (so some requests stop) and the dense greedy outputs."""
    return dense_oracle(SOURCE, WORKLOAD, POOL["max_model_len"])


class Executors:
    """One executor at a time (one torch.distributed group per process)."""

    def __init__(self) -> None:
        self.k, self.executor = None, None

    def get(self, k: int):
        if k != self.k:
            self.close()
            self.executor = (LocalExecutor(SOURCE, 1, POOL["num_blocks"], POOL["block_size"],
                                           dtype=torch.float64, num_spec_tokens=NUM_SPEC)
                             if k == 1 else
                             PipelineExecutor.spawn(StageSpec(SOURCE, k, POOL["num_blocks"],
                                                              POOL["block_size"], "float64"),
                                                    num_spec_tokens=NUM_SPEC))
            self.k = k
        self.executor.reset()
        return self.executor

    def close(self) -> None:
        if self.executor is not None:
            self.executor.close()
        self.k, self.executor = None, None


@pytest.fixture(scope="module")
def executors():
    pool = Executors()
    yield pool
    pool.close()


def run_traced(executors, tmp_path, k, cp, spec, eos, mutant=None, workload=WORKLOAD):
    """A traced run; with `mutant`, that reference mutant in force and named in the trace."""
    cfg = SchedulerConfig(num_pipeline_stages=k, continue_prefill=cp, num_spec_tokens=spec, **POOL)
    path = tmp_path / f"pp{k}-{'cp' if cp else 'obpr'}-spec{spec}-{mutant or 'correct'}.jsonl"
    extra = {"mutant": mutant} if mutant is not None else None
    with open(path, "w") as sink, reference_applied(mutant):
        result = generate(executors.get(k), cfg, workload, eos_token_id=eos,
                          trace=RuntimeTraceWriter(sink, eos_token_id=eos, extra=extra))
    return result, path


def assert_matches_oracle(result, expected):
    for r in result.requests:
        want = expected[r.req_id]
        if r.finish_reason == "abort":
            assert list(r.output_token_ids) == want[:len(r.output_token_ids)], r.req_id
        else:
            assert list(r.output_token_ids) == want, r.req_id


def trace_features(path) -> dict[str, int]:
    events = [json.loads(line) for line in open(path)]
    entries = [x for e in events if e["ev"] == "schedule" for x in e["entries"]]
    depth = max_depth = 0
    for e in events:
        if e["ev"] == "schedule" and e["batch"] is not None:
            depth += 1
            max_depth = max(max_depth, depth)
        elif e["ev"] == "complete":
            depth -= 1
    stage = {(e["batch"], e["stage"]): (e["t0"], e["t1"]) for e in events if e["ev"] == "stage"}
    last = max((s for _, s in stage), default=0)
    # Pipelining: stage 0 starts batch n + 1 before the last stage has finished
    # batch n. (Whether their compute overlaps in wall time depends on free
    # cores, which a loaded 2-core machine may not have.)
    ahead = sum(1 for (b, s), (t0, _) in stage.items()
                if s == 0 and b > 1 and (b - 1, last) in stage and t0 < stage[(b - 1, last)][1])
    return {
        "preemptions": sum(len(e["preempted"]) for e in events if e["ev"] == "schedule"),
        "prefix_hits": sum(1 for x in entries if x["cached"] > 0),
        "partial_chunks": sum(1 for x in entries if not x["samples"]),
        "drafts": sum(x["drafts"] for x in entries),
        "accepted": sum(len(t) - 1 for e in events if e["ev"] == "complete"
                        for t in e["tokens"].values() if t),
        "dropped": sum(len(e.get("dropped", [])) for e in events if e["ev"] == "complete"),
        "stops": sum(1 for e in events if e["ev"] == "finish" and e["reason"] == "stop"),
        "max_in_flight": max_depth, "stage0_ahead": ahead,
        "stage_events": len(stage),
    }


@pytest.mark.parametrize("k,cp,spec", MATRIX,
                         ids=[f"pp{k}-{'cp' if cp else 'obpr'}-spec{s}" for k, cp, s in MATRIX])
def test_greedy_outputs_equal_dense_recompute_and_traces_pass_check_trace(
        executors, oracle, tmp_path, k, cp, spec):
    eos, expected = oracle
    result, path = run_traced(executors, tmp_path, k, cp, spec, eos)
    assert_matches_oracle(result, expected)
    check = check_trace(path)
    assert check.ok, (check.property, check.message)
    f = trace_features(path)
    # The workload exercises what it claims to.
    assert f["preemptions"] > 0 and f["prefix_hits"] > 0 and f["partial_chunks"] > 0, f
    assert f["stops"] > 0 and sum(r.finish_reason == "abort" for r in result.requests) >= 2, f
    assert f["dropped"] > 0, f                  # an abort landed while its batch was in flight
    assert f["stage_events"] == k * result.num_batches, f
    assert f["max_in_flight"] == k, f
    if spec:
        assert f["drafts"] > 0 and f["accepted"] > 0, f
    if k > 1:
        assert f["stage0_ahead"] > 0, f         # stage 0 on batch n+1 while n is still in the pipe


def test_shared_snapshot_mutant_makes_outputs_diverge_and_its_trace_is_rejected(
        executors, oracle, tmp_path):
    """The reference's shared_snapshot mutant (one CachedRequestData per
    request, overwritten while an earlier batch is in flight) at PP = 3, on a
    workload where a request is preempted and resumed while a batch of its
    old incarnation is still in the pipeline: the stale batch's entry now
    carries the new incarnation, so its token is applied to the resumed
    request. The correct scheduler on the same workload and pipeline passes."""
    eos, _ = oracle
    workload = mixed_workload(9, 14, abort_fraction=0.25, max_tokens=(4, 20))
    good, good_path = run_traced(executors, tmp_path, 3, True, NUM_SPEC, eos, workload=workload)
    assert check_trace(good_path).ok
    bad, bad_path = run_traced(executors, tmp_path, 3, True, NUM_SPEC, eos,
                               mutant="shared_snapshot", workload=workload)
    assert bad.outputs() != good.outputs()
    check = check_trace(bad_path)
    assert not check.ok
    assert check.property == "S7_output_binding", check
