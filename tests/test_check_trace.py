"""check-trace against traces the reference writes: the correct scheduler's
traces replay on the spec (with and without block ids), every mutant's trace
is rejected at the event where its damage first shows, malformed files are
malformed, and the command line keeps its exit-code contract."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Callable

import pytest

from flightcheck.reference import (Engine, ModelRunnerOutput, Request, RequestStatus, Sample,
                                   SamplingParams, Scheduler, SchedulerConfig, ScriptedExecutor,
                                   TraceWriter, make_scheduler)
from flightcheck.verification.mutants import reference as M
from flightcheck.verification.mutants.patching import reference_applied
from flightcheck.verification.refinement.fuzz import fuzz
from flightcheck.verification.traces.check import (MalformedTrace, check_events, check_trace,
                                                  read_events)

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared


def prompt(n: int, base: int = 0) -> list[int]:
    return [base + i for i in range(n)]


def traced(cfg: SchedulerConfig, mutant: str | None = None) -> tuple[Scheduler, io.StringIO]:
    """A traced scheduler; a mutant run's trace names its mutant, as every writer's does."""
    sink = io.StringIO()
    return make_scheduler(cfg, TraceWriter(sink, extra={"mutant": mutant} if mutant else None)), sink


def finish_run(engine: Engine) -> None:
    """Run to the end (a mutant may get stuck: that is its damage), then end."""
    try:
        engine.run(max_steps=500)
    except RuntimeError:
        pass
    engine.scheduler.trace.end()


# -- one scenario per mutant: a deterministic driver, the same for both -------

def _concurrent(mutant: str | None, **executor_kwargs) -> io.StringIO:
    cfg = SchedulerConfig(max_num_batched_tokens=10, max_num_seqs=2, max_model_len=64,
                          block_size=16, num_blocks=16, num_pipeline_stages=2,
                          enable_prefix_caching=False)
    sched, sink = traced(cfg, mutant)
    engine = Engine(sched, ScriptedExecutor(**executor_kwargs))
    engine.add_request(Request("0", prompt(12), SamplingParams(max_tokens=5)))
    engine.add_request(Request("1", prompt(12, 100), SamplingParams(max_tokens=5)))
    finish_run(engine)
    return sink


def _three_chunks(mutant: str | None) -> io.StringIO:
    cfg = SchedulerConfig(max_num_batched_tokens=10, max_num_seqs=1, max_model_len=64,
                          block_size=16, num_blocks=16, num_pipeline_stages=3,
                          enable_prefix_caching=False)
    sched, sink = traced(cfg, mutant)
    engine = Engine(sched, ScriptedExecutor())
    engine.add_request(Request("r", prompt(30), SamplingParams(max_tokens=3)))
    finish_run(engine)
    return sink


def _prefix_hit(mutant: str | None) -> io.StringIO:
    cfg = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=2, max_model_len=128,
                          block_size=16, num_blocks=16, num_pipeline_stages=2)
    sched, sink = traced(cfg, mutant)
    engine = Engine(sched, ScriptedExecutor())
    engine.add_request(Request("a", prompt(40), SamplingParams(max_tokens=2)))
    engine.run()
    engine.add_request(Request("b", prompt(40), SamplingParams(max_tokens=2)))
    finish_run(engine)
    return sink


def _spec_decode(mutant: str | None) -> io.StringIO:
    cfg = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=2, max_model_len=64,
                          block_size=4, num_blocks=16, num_spec_tokens=2)
    sched, sink = traced(cfg, mutant)
    engine = Engine(sched, ScriptedExecutor(lambda r, n, d: Sample(500 + n, 0, (7, 8))))
    engine.add_request(Request("a", prompt(10), SamplingParams(max_tokens=6)))
    finish_run(engine)
    return sink


def _stale_after_resume(mutant: str | None) -> io.StringIO:
    """r1's sampling batch is in flight when r1 is preempted, r0 is aborted,
    r1 is resumed, and only then does the old batch return."""
    cfg = SchedulerConfig(max_num_batched_tokens=100, max_num_seqs=2, max_model_len=12,
                          block_size=4, num_blocks=3, num_pipeline_stages=3,
                          enable_prefix_caching=False)
    sched, sink = traced(cfg, mutant)
    executor = ScriptedExecutor()
    sched.add_request(Request("0", prompt(4), SamplingParams(max_tokens=5)))
    b1 = sched.schedule()
    f1 = executor.submit(b1)
    sched.add_request(Request("1", prompt(8, 50), SamplingParams(max_tokens=5)))
    b2 = sched.schedule()
    f2 = executor.submit(b2)
    sched.update_from_output(b1, f1.result())
    executor.submit(sched.schedule())                 # r1 preempted for r0's block
    sched.finish_requests("0", RequestStatus.FINISHED_ABORTED)
    executor.submit(sched.schedule())                 # r1 resumed while b2 is in flight
    sched.update_from_output(b2, f2.result())
    return sink


def _one_batch_preemption(mutant: str | None) -> io.StringIO:
    cfg = SchedulerConfig(max_num_batched_tokens=100, max_num_seqs=2, max_model_len=160,
                          block_size=16, num_blocks=10, num_pipeline_stages=2,
                          continue_prefill=False)
    sched, sink = traced(cfg, mutant)
    engine = Engine(sched, ScriptedExecutor())
    engine.add_request(Request("0", prompt(80), SamplingParams(max_tokens=20)))
    engine.step()
    engine.add_request(Request("1", prompt(80, 1000), SamplingParams(max_tokens=5)))
    finish_run(engine)
    return sink


def _orphan_with_rejections(mutant: str | None) -> io.StringIO:
    cfg = SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=2, max_model_len=28,
                          block_size=4, num_blocks=7, num_pipeline_stages=2, num_spec_tokens=2,
                          long_prefill_token_threshold=8, enable_prefix_caching=False)
    sched, sink = traced(cfg, mutant)
    sched.add_request(Request("0", prompt(24), SamplingParams(max_tokens=4)))
    sched.add_request(Request("1", prompt(3, 100), SamplingParams(max_tokens=8)))
    b1 = sched.schedule()
    sched.update_from_output(b1, ModelRunnerOutput.from_tokens({"0": [], "1": [5]}, {"1": [6, 7]}))
    b2 = sched.schedule()                             # r1 decodes with two drafts
    sched.schedule()                                  # r0 needs blocks: r1 preempted
    sched.update_from_output(b2, ModelRunnerOutput.from_tokens({"0": [], "1": [9]}))
    sched.finish_requests("0", RequestStatus.FINISHED_ABORTED)
    sched.schedule()                                  # r1 resumed
    return sink


def _reused_name(mutant: str | None) -> io.StringIO:
    cfg = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=2, max_model_len=64,
                          block_size=4, num_blocks=16, num_pipeline_stages=2)
    sched, sink = traced(cfg, mutant)
    executor = ScriptedExecutor()
    sched.add_request(Request("x", prompt(4), SamplingParams(max_tokens=4)))
    b1 = sched.schedule()
    f1 = executor.submit(b1)
    sched.finish_requests("x", RequestStatus.FINISHED_ABORTED)
    sched.add_request(Request("x", prompt(20, 300), SamplingParams(max_tokens=4)))
    executor.submit(sched.schedule())
    sched.update_from_output(b1, f1.result())
    return sink


SCENARIOS: dict[str, Callable[[str | None], io.StringIO]] = {
    M.ADVANCE_AT_COMPLETION: _concurrent,
    M.SHARED_SNAPSHOT: _three_chunks,
    M.FINAL_CHUNK_FROM_LIVE_COUNTER: lambda m: _concurrent(m, sample_every_chunk=True),
    M.SNAPSHOT_OMITS_PREFIX_HIT: _prefix_hit,
    M.REJECTIONS_NOT_SUBTRACTED: _spec_decode,
    M.DECODE_WHILE_TOKEN_IN_FLIGHT: _concurrent,
    M.STALE_OUTPUT_APPLIED_TO_RESUMED: _stale_after_resume,
    M.INFLIGHT_SET_NOT_CLEARED_ON_PREEMPTION: _one_batch_preemption,
    M.REJECTIONS_SUBTRACTED_AFTER_RESET: _orphan_with_rejections,
    M.OUTPUT_BOUND_BY_NAME: _reused_name,
}


def scenario(name: str, mutant: str | None) -> io.StringIO:
    """The trace of mutant `name`'s scenario, run with `mutant` (that one or
    None, the correct scheduler) in force."""
    with reference_applied(mutant):
        return SCENARIOS[name](mutant)


def events_of(sink: io.StringIO) -> list[dict]:
    return read_events(sink.getvalue().splitlines())


def first_difference(correct: list[dict], damaged: list[dict]) -> int:
    """The index of the first event (after config) where the mutant's trace
    departs, ignoring time (a stalled engine counts its steps differently)."""
    def timeless(e: dict) -> dict:
        return {k: v for k, v in e.items() if k not in ("step", "t")}
    for i in range(1, max(len(correct), len(damaged))):
        if i >= len(correct) or i >= len(damaged) or timeless(correct[i]) != timeless(damaged[i]):
            return i
    raise AssertionError("the mutant's trace is the correct one")


def without_block_ids(events: list[dict]) -> list[dict]:
    out = []
    for e in events:
        if e["ev"] == "schedule":
            e = {**e, "entries": [{k: v for k, v in x.items() if k != "block_ids"}
                                  for x in e["entries"]]}
        out.append(e)
    return out


def test_every_reference_mutant_has_a_trace_scenario():
    assert set(SCENARIOS) == set(M.MUTANTS)


@pytest.mark.parametrize("mutant", sorted(SCENARIOS))
def test_the_correct_schedulers_trace_of_each_scenario_is_legal(mutant):
    result = check_events(events_of(scenario(mutant, None)))
    assert result.ok, result.to_json()


@pytest.mark.parametrize("mutant", sorted(SCENARIOS))
def test_a_mutants_trace_is_rejected_where_its_damage_first_shows(mutant):
    correct = events_of(scenario(mutant, None))
    damaged = events_of(scenario(mutant, mutant))
    where = first_difference(correct, damaged)
    assert damaged[0]["mutant"] == mutant
    result = check_events(events_of(scenario(mutant, mutant)))
    assert not result.ok
    assert result.event_index == where, (result.to_json(), damaged[where])
    assert result.state_before


def test_random_reference_runs_write_legal_traces_with_and_without_block_ids():
    # The machine drains each run with the engine's loop, ends the trace and
    # checks it twice, once with block_ids stripped (see RefinementMachine).
    result = fuzz(1_200, seed=11, check_traces=True)
    assert not result.failed, result.failure


@pytest.mark.parametrize("allow_name_reuse", [False, True])
def test_random_reference_runs_under_0_33_write_legal_traces(allow_name_reuse):
    # 0.33's loop queues empty batches; with name reuse an old batch's output
    # under a reused id is dropped and listed in `dropped` (nothing unchecked).
    result = fuzz(1_200, seed=11, check_traces=True, profile="vllm-0.33",
                  allow_name_reuse=allow_name_reuse)
    assert not result.failed, result.failure


def test_a_trace_without_block_ids_says_block_identity_is_unchecked():
    events = without_block_ids(events_of(_concurrent(None)))
    result = check_events(events)
    assert result.ok
    assert any("block identity" in u for u in result.unchecked)
    assert not any("block identity" in u for u in check_events(events_of(_concurrent(None))).unchecked)


def _reused_name_after_a_partial_chunk() -> list[dict]:
    """vLLM 0.33: x's first prefill chunk (it samples nothing) is in flight
    when x is aborted and its id re-added; the old batch completes while the
    new x holds the name, then the run drains."""
    cfg = SchedulerConfig(max_num_batched_tokens=4, max_num_seqs=2, max_model_len=64,
                          block_size=4, num_blocks=16, num_pipeline_stages=2, profile="vllm-0.33")
    sched, sink = traced(cfg)
    engine = Engine(sched, ScriptedExecutor())
    engine.add_request(Request("x", prompt(8), SamplingParams(max_tokens=2)))
    assert engine.enqueue_step().entries[0].num_new_tokens == 4          # a partial chunk
    engine.abort_request("x")
    engine.add_request(Request("x", prompt(3, 300), SamplingParams(max_tokens=2)))
    engine.enqueue_step()
    engine.complete_oldest_step()                                       # the old batch returns
    finish_run(engine)
    return events_of(sink)


@pytest.mark.parametrize("full", [False, True])
def test_an_old_output_under_a_reused_name_not_listed_as_dropped_breaks_the_in_flight_counter(full):
    """vLLM 0.33 looks an output up by name, so an old chunk that sampled
    nothing still settles the new x's counters (its id-reuse bug, no token
    to show for it). The reference drops it and lists it in `dropped`:
    accepted. Without that key (as vLLM's recorder writes it) the spec's rule
    applies and the `complete` event is rejected as IF1. Both checkers agree;
    the fresh-id twin is accepted."""
    events = _reused_name_after_a_partial_chunk()
    first = next(i for i, e in enumerate(events) if e["ev"] == "complete")
    assert events[first]["dropped"] == ["x"] and events[first]["tokens"] == {"x": []}
    said = check_events(events, profile="vllm-0.33", full=full)
    assert said.profile == "vllm-0.33"
    assert said.ok, said
    unlisted = [{k: v for k, v in e.items() if k != "dropped"} if i == first else e
                for i, e in enumerate(events)]
    said = check_events(unlisted, profile="vllm-0.33", full=full)
    assert not said.ok and said.property == "IF1_in_flight_counter", said
    assert said.event_index == first, said
    fresh = check_events(events_of(_concurrent(None)), profile="vllm-0.33", full=full)
    assert fresh.ok, fresh


# -- malformed files ------------------------------------------------------------

CONFIG = {"ev": "config", "num_stages": 2, "max_num_batched_tokens": 8, "block_size": 2,
          "num_blocks": 8, "max_model_len": 16}


@pytest.mark.parametrize("lines", [
    [],                                                          # empty file
    ["not json"],
    [json.dumps({"ev": "arrive", "req": "a", "prompt_len": 2, "max_tokens": 1})],  # no config first
    [json.dumps(CONFIG), json.dumps({"ev": "teleport"})],        # unknown event kind
    [json.dumps(CONFIG), json.dumps([1, 2])],                    # not an object
    [json.dumps({**CONFIG, "block_size": "two"})],               # a config field of the wrong type
    [json.dumps({**CONFIG, "policy": "round-robin"})],
    [json.dumps(CONFIG), json.dumps(CONFIG)],                    # a second config
    [json.dumps(CONFIG), json.dumps({"ev": "schedule", "batch": 1})],     # no entries
    [json.dumps(CONFIG), json.dumps({"ev": "arrive", "req": "a", "max_tokens": 1})],  # no prompt_len
], ids=["empty", "not-json", "no-config", "unknown-event", "not-object", "bad-field",
        "bad-policy", "second-config", "schedule-without-entries", "arrive-without-length"])
def test_malformed_traces_raise_malformed_trace(tmp_path, lines):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(MalformedTrace):
        check_trace(path)


def test_a_missing_file_is_malformed(tmp_path):
    with pytest.raises(MalformedTrace):
        check_trace(tmp_path / "nowhere.jsonl")


# -- the command line -----------------------------------------------------------

def run_cli(path) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "flightcheck.cli", "check-trace", str(path), "--json"],
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, json.loads(proc.stdout)


def test_cli_exit_codes_legal_violation_malformed(tmp_path):
    legal, bad, broken = tmp_path / "legal.jsonl", tmp_path / "bad.jsonl", tmp_path / "broken.jsonl"
    legal.write_text(_concurrent(None).getvalue())
    bad.write_text(scenario(M.ADVANCE_AT_COMPLETION, M.ADVANCE_AT_COMPLETION).getvalue())
    broken.write_text('{"ev": "config"\n')

    code, out = run_cli(legal)
    assert code == 0 and out["ok"] is True and out["event_index"] is None
    assert set(out) == {"ok", "events", "event_index", "property", "message", "state_before",
                        "unchecked", "profile", "line", "event"}
    assert out["line"] is None and out["event"] is None

    code, out = run_cli(bad)
    damaged = events_of(scenario(M.ADVANCE_AT_COMPLETION, M.ADVANCE_AT_COMPLETION))
    assert code == 1 and out["ok"] is False
    assert out["event_index"] == first_difference(events_of(_concurrent(None)), damaged)
    assert out["property"] and out["message"] and out["state_before"]
    # the writer writes no blank line: the event's line is its index + 1
    assert (out["line"], out["event"]) == (out["event_index"] + 1, damaged[out["event_index"]]["ev"])

    code, out = run_cli(broken)
    assert code == 2 and out["ok"] is False and "malformed" in out
