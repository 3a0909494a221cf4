"""A streaming session through vLLM 0.33's and 0.34's real scheduler
(flightcheck/vllm/session_probe.py), sync and async, observed step by step
and compared with the spec's run of the same scenario (docs/request-states.md,
"Streaming sessions"): the stop parks the session in
WAITING_FOR_STREAMING_REQ with its blocks, in kv_holding, its turn's
in-flight output stale in drop mode; it holds the one seat; its next input
keeps every output but the last as prompt; the next turn runs beside the
old output, which is dropped when it returns."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from flightcheck.spec import (Arrive, CompleteOldest, Config, Prompt, Sample, Schedule, SendInput, State, Status,
                              initial_state, step)
from flightcheck.vllm.replay import venv_python

from .vllm_support import require_venv

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("both_checkers")]   # checks traces: both checkers compared


def _observe(version: str, async_scheduling: bool) -> dict:
    require_venv(version)
    argv = [str(venv_python(version)), "-m", "flightcheck.vllm.session_probe"] + (["--async"] if async_scheduling else [])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _spec_look(s: State, cfg: Config) -> dict:
    q = s.requests[0]
    return {"status": q.status.name, "num_computed": q.num_computed, "num_tokens": q.num_tokens,
            "num_prompt": q.prompt_len, "num_output": q.num_output, "in_flight": q.num_in_flight,
            "stale": q.num_stale, "drop": q.drop_stale, "placeholders": q.placeholders,
            "blocks": len(q.block_table), "in_kv_holding": 0 in s.kv_holding, "in_waiting": 0 in s.waiting,
            "running": 0 in s.running,
            "waiting_for_input": sum(x.status is Status.WAITING_FOR_STREAMING_REQ for x in s.requests)}


def _scheduled(before: State, after: State) -> dict:
    return {f"r{e.req}": e.n for e in after.in_flight[-1]} if len(after.in_flight) > len(before.in_flight) else {}


def _spec_run(async_scheduling: bool) -> dict:
    """The probe's scenario in the spec: the same sizes (vLLM's pool keeps a null block back); the
    probe calls `schedule()` with up to three batches out, as an engine with that depth would."""
    cfg = Config(num_stages=1, max_num_batched_tokens=32, max_num_seqs=1, block_size=4, num_blocks=15,
                 max_model_len=64, prefix_caching=False, streaming_sessions=True, batch_queue_depth=3,
                 profile="vllm-0.34-async" if async_scheduling else "vllm-0.34")
    session, plain = Prompt(6, 4, session=((2, 2), (0, 0))), Prompt(3, 1)
    s = initial_state(2, cfg.num_blocks)
    for action in (Arrive(0, session), Arrive(1, plain)):
        s = step(s, cfg, action)
    seen = {}
    nxt = step(s, cfg, Schedule())
    seen["first"], s = _scheduled(s, nxt), nxt
    if async_scheduling:
        nxt = step(s, cfg, Schedule())
        seen["second"], s = _scheduled(s, nxt), nxt
    else:
        seen["second"] = {}
    s = step(s, cfg, CompleteOldest((Sample(stop_at=0),)))
    seen["stopped"] = _spec_look(s, cfg)
    nxt = step(s, cfg, Schedule())
    seen["while_parked"], s = _scheduled(s, nxt), nxt
    s = step(s, cfg, SendInput(0))
    seen["input_taken"] = _spec_look(s, cfg)
    nxt = step(s, cfg, Schedule())
    seen["resumed"], s = _scheduled(s, nxt), nxt
    if async_scheduling:
        s = step(s, cfg, CompleteOldest(()))                   # the old decode: dropped, no sample taken
        seen["old_output_returned"] = _spec_look(s, cfg)
    s = step(s, cfg, CompleteOldest(()))                       # the empty batch formed while parked
    s = step(s, cfg, CompleteOldest((Sample(),)))
    seen["new_output_returned"] = _spec_look(s, cfg)
    return seen


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_session_in_vllm_goes_as_the_spec_reads_it(version: str, async_scheduling: bool):
    assert _observe(version, async_scheduling) == _spec_run(async_scheduling)


SESSION_WORKLOADS = sorted((Path(__file__).parent / "data" / "vllm" / "sessions").glob("*.json"))


@pytest.fixture(scope="module")
def running():
    from .vllm_support import workers
    yield from workers()


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("path", SESSION_WORKLOADS, ids=lambda p: p.stem)
def test_session_workloads_replay_alike_on_vllm_and_the_reference(running, tmp_path, version: str,
                                                                  async_scheduling: bool, path: Path):
    """Replay workloads with streaming sessions (a request's `session` key:
    inputs sent at engine steps, session_workload.py): vLLM's real scheduler
    and the reference take the same decisions, vLLM's ground truth flags
    nothing, and check-trace accepts vLLM's trace."""
    from flightcheck.vllm import ASYNC_RECORDER
    from flightcheck.vllm.differential import decisions, read_trace, run_reference
    from flightcheck.vllm.replay import findings

    raw = json.loads(path.read_text())
    raw = {**raw, "config": {**raw["config"], "async_scheduling": async_scheduling}}
    trace = tmp_path / "trace.jsonl"
    result = running[version].replay(raw, trace=str(trace), scheduler_cls=ASYNC_RECORDER if async_scheduling else None)
    assert result["ending"] == "done" and not findings(result), result
    profile = ("vllm-0.34" if version == "0.34.0" else "vllm-0.33") + ("-async" if async_scheduling else "")
    reference = run_reference(raw, profile)
    assert reference.ending == "done"
    assert decisions(read_trace(trace)) == decisions(reference.events, block_offset=1)
    # check-trace reads vLLM's session trace (its `input` events) and agrees with the ground truth
    from flightcheck.verification.traces.check import check_events
    checked = check_events(read_trace(trace))
    assert checked.ok, (checked.property, checked.message)


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_finding_a_session_update_takes_vllm_past_max_model_len(running, tmp_path, version: str):
    """Finding (docs/request-states.md, "Finding: a session grows past
    max_model_len"): a session of 15 known tokens (max_model_len 16) takes an
    update of 4 tokens; vLLM's `add_request` checks no length, and the next
    turn is scheduled from token 14 to 18, past max_model_len (and past the
    blocks one request may hold)."""
    path = Path(__file__).parent / "data" / "vllm" / "sessions-findings" / "session-past-max-model-len.json"
    raw = json.loads(path.read_text())
    trace = tmp_path / "trace.jsonl"
    running[version].replay(raw, trace=str(trace))
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    ends = [x["start"] + x["n"] for e in events if e["ev"] == "schedule" for x in e.get("entries", ())]
    assert max(ends) == 18 > raw["config"]["max_model_len"]


# -- the two stalls the sessions fuzzer found on the spec and the reference --------

SESSION_STALLS = {"session-stall-below-padding-budget": ["s0"], "session-stall-pool-full-between-turns": ["a", "b"]}


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("name", list(SESSION_STALLS))
def test_finding_vllm_stalls_a_sessions_next_turn_as_the_spec_does(running, tmp_path, version: str,
                                                                   async_scheduling: bool, name: str):
    """Finding (docs/request-states.md, "Finding: two stalls of a session's
    next turn"): the two liveness holes the sessions fuzzer found on the spec
    and the reference are vLLM's too. A one-token next turn with a budget
    below 1 + k (`Scheduler.schedule`'s waiting loop breaks rather than
    schedule a decode un-padded), and two sessions that fill the pool
    between turns (the waiting loop's `allocate_slots` fails and it breaks;
    only the running loop preempts, and nothing runs): vLLM schedules
    nothing ever again, the reference ends stuck with the same decisions,
    and check-trace rejects vLLM's trace for L2_no_deadlock."""
    path = Path(__file__).parent / "data" / "vllm" / "sessions-findings" / f"{name}.json"
    _stalls_alike(running[version], path, SESSION_STALLS[name], version, async_scheduling, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_finding_vllm_stalls_a_prefix_hit_below_the_padding_budget(running, tmp_path, version: str,
                                                                   async_scheduling: bool):
    """Finding (docs/request-states.md, "Finding: a one-token admission
    below the padding budget"): the first stall above needs no session. A
    plain request whose prefix hit leaves it one token is padded to 1 + k
    as well (`num_computed_tokens > 0`), so with k = 3 and a budget of 3 b
    is never admitted once a has finished (the priority fuzzer's seed 11
    reached it first, as L2 on the spec and the reference alike)."""
    path = Path(__file__).parent / "data" / "vllm" / "spec-decode-findings" / "prefix-hit-stall-below-padding-budget.json"
    _stalls_alike(running[version], path, ["b"], version, async_scheduling, tmp_path)


def _stalls_alike(worker, path: Path, unfinished: list[str], version: str, async_scheduling: bool,
                  tmp_path: Path) -> None:
    """vLLM's run of the workload at `path` ends stuck with `unfinished` left
    after its first step, the reference stuck with the same decisions, and
    check-trace rejects vLLM's trace for L2_no_deadlock."""
    from flightcheck.vllm import ASYNC_RECORDER
    from flightcheck.vllm.differential import decisions, read_trace, run_reference
    from flightcheck.verification.traces.check import check_events

    raw = json.loads(path.read_text())
    raw = {**raw, "config": {**raw["config"], "async_scheduling": async_scheduling}}
    trace = tmp_path / "trace.jsonl"
    result = worker.replay(raw, trace=str(trace), scheduler_cls=ASYNC_RECORDER if async_scheduling else None)
    assert result["ending"] == "stuck" and result["unfinished"] == unfinished, result
    scheduled = [step["scheduled"] for step in result["engine_steps"]]
    assert scheduled[0] and not any(scheduled[1:]), scheduled          # the first turn, then nothing
    profile = ("vllm-0.34" if version == "0.34.0" else "vllm-0.33") + ("-async" if async_scheduling else "")
    reference = run_reference(raw, profile)
    assert reference.ending == "stuck"
    assert decisions(read_trace(trace)) == decisions(reference.events, block_offset=1)
    checked = check_events(read_trace(trace))
    assert not checked.ok and checked.property == "L2_no_deadlock", (checked.property, checked.message)


# -- the priority policy beside streaming sessions --------------------------------

PRIORITY_SESSION_WORKLOADS = sorted((Path(__file__).parent / "data" / "vllm" / "priority-sessions").glob("*.json"))


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("path", PRIORITY_SESSION_WORKLOADS, ids=lambda p: p.stem)
def test_priority_sessions_replay_alike_on_vllm_and_the_reference(running, tmp_path, version: str,
                                                                  async_scheduling: bool, path: Path):
    """Sessions under the priority policy (docs/request-states.md, "Features
    together"): a session takes its input's arrival time
    (`_update_request_as_session`), so vLLM's victim (`max(running,
    key=(priority, arrival_time))`) is the session resumed by a later input
    (session-priority-takes-input-arrival), and a preempted session waits
    behind a request that arrived before its input (campaign seed 1 index
    55, a false `schedule_decision` before the spec and the reference read
    it). vLLM and the reference take the same decisions, the ground truth
    flags nothing, check-trace accepts vLLM's trace."""
    from flightcheck.vllm import ASYNC_RECORDER
    from flightcheck.vllm.differential import decisions, read_trace, run_reference
    from flightcheck.vllm.replay import findings
    from flightcheck.verification.traces.check import check_events

    raw = json.loads(path.read_text())
    raw = {**raw, "config": {**raw["config"], "async_scheduling": async_scheduling}}
    trace = tmp_path / "trace.jsonl"
    result = running[version].replay(raw, trace=str(trace), scheduler_cls=ASYNC_RECORDER if async_scheduling else None)
    assert result["ending"] == "done" and not findings(result), result
    events = read_trace(trace)
    if path.stem == "session-priority-takes-input-arrival":
        assert [e["preempted"] for e in events if e["ev"] == "schedule" and e.get("preempted")][0] == ["s"]
    profile = ("vllm-0.34" if version == "0.34.0" else "vllm-0.33") + ("-async" if async_scheduling else "")
    assert decisions(events) == decisions(run_reference(raw, profile).events, block_offset=1)
    checked = check_events(events)
    assert checked.ok, (checked.property, checked.message)


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_finding_a_sessions_input_leaves_vllms_priority_heap_out_of_order(running, tmp_path, version: str,
                                                                         async_scheduling: bool):
    """Finding (docs/request-states.md, "Finding: a session's input reorders
    a priority heap"): s0 then s1 park in `kv_holding_waiting` (a
    `PriorityRequestQueue`); s1's input, then s0's, are taken at once, and
    `_update_request_as_session` sets s0's arrival_time (now the later)
    where s0 sits, at the heap's root. vLLM admits s0 before s1 against its
    own (priority, arrival) order; the ground truth flags the heap, the
    reference (in place, as vLLM) takes the same decisions, and check-trace
    rejects vLLM's trace for SS5 at s0's input."""
    from flightcheck.vllm import ASYNC_RECORDER
    from flightcheck.vllm.differential import decisions, read_trace, run_reference
    from flightcheck.vllm.replay import findings
    from flightcheck.verification.traces.check import check_events

    path = Path(__file__).parent / "data" / "vllm" / "sessions-findings" / "session-input-reorders-priority-heap.json"
    raw = json.loads(path.read_text())
    raw = {**raw, "config": {**raw["config"], "async_scheduling": async_scheduling}}
    trace = tmp_path / "trace.jsonl"
    result = running[version].replay(raw, trace=str(trace), scheduler_cls=ASYNC_RECORDER if async_scheduling else None)
    assert [f for f in findings(result) if "out of heap order" in f] == findings(result) != [], findings(result)
    events = read_trace(trace)
    after_inputs = [e for e in events if e["ev"] == "schedule" and len(e["entries"]) == 2][0]
    assert [x["req"] for x in after_inputs["entries"]] == ["s0", "s1"]
    profile = ("vllm-0.34" if version == "0.34.0" else "vllm-0.33") + ("-async" if async_scheduling else "")
    assert decisions(events) == decisions(run_reference(raw, profile).events, block_offset=1)
    checked = check_events(events)
    assert not checked.ok and checked.property == "SS5_session_queues_in_priority_order", checked.property
