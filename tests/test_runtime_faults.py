"""Faults: a stage process killed at start-up or mid-run, Ctrl-C, and bad input."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from flightcheck.reference import Request, SamplingParams, Scheduler, SchedulerConfig
from flightcheck.runtime import (PipelineExecutor, RunFailed, RuntimeTraceWriter, StageSpec,
                                 WeightSource, generate, pipeline)
from flightcheck.runtime.pipeline import StageDied
from flightcheck.runtime.workload import mixed_workload
from flightcheck.verification.traces.check import check_trace

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

torch.set_num_threads(1)


def test_killing_a_stage_mid_run_raises_reaps_and_aborts_every_unfinished_request(tmp_path):
    spec = StageSpec(WeightSource(seed=2), 2, 64, 4, "float32")
    cfg = SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=8, max_model_len=128,
                          block_size=4, num_blocks=64, num_pipeline_stages=2)
    workload = mixed_workload(4, 12, max_tokens=(30, 40))
    executor = PipelineExecutor.spawn(spec)
    victim = executor.processes[0]
    killed_at: list[float] = []

    def progress(done: int, total: int, tokens: int) -> None:
        if tokens >= 20 and not killed_at:
            os.kill(victim.pid, signal.SIGKILL)
            killed_at.append(time.monotonic())

    path = tmp_path / "killed.jsonl"
    try:
        with open(path, "w") as sink:
            with pytest.raises(RunFailed) as info:
                generate(executor, cfg, workload, trace=RuntimeTraceWriter(sink), progress=progress)
        detected = time.monotonic() - killed_at[0]
    finally:
        executor.close()
    assert detected < 10.0, detected
    # The killed stage is named, not stage 1 that lost its peer first.
    assert f"stage 0 (pid {victim.pid}) was killed by SIGKILL" in str(info.value), info.value
    assert all(p.exitcode is not None for p in executor.processes)   # every process reaped
    result = info.value.result
    assert result.error is not None
    unfinished = [r for r in result.requests if r.finish_reason == "abort"]
    assert unfinished and all(r.finish_reason in ("length", "abort") for r in result.requests)
    assert sum(len(r.output_token_ids) for r in result.requests) >= 20
    check = check_trace(path)                         # the aborts are legal; no `end` written
    assert check.ok, check
    Path(executor.log_path).unlink()                  # kept after a failure, for the user


def test_submit_that_is_first_to_see_a_dead_stage_raises_instead_of_deadlocking(monkeypatch):
    """`submit` checks the stages before it sends a plan. When it is the first
    to see a stage's death (the receiver thread has not noticed yet), it must
    raise; it once reported the failure while holding the lock that reporting
    takes, and the driver hung for good. The receiver is held back after the
    kill, so that submit is the first to notice every time."""
    killed, release = threading.Event(), threading.Event()
    receive = pipeline.recv_object

    def held_back_after_the_kill(src, group):
        try:
            return receive(src, group)
        finally:
            if killed.is_set():
                release.wait()

    monkeypatch.setattr(pipeline, "recv_object", held_back_after_the_kill)
    cfg = SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=8, max_model_len=128,
                          block_size=4, num_blocks=64, num_pipeline_stages=2)
    scheduler = Scheduler(cfg)
    scheduler.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=4)))
    first = scheduler.schedule()
    scheduler.add_request(Request("b", [4, 5, 6], SamplingParams(max_tokens=4)))
    second = scheduler.schedule()
    assert second.total_num_scheduled_tokens > 0          # submit sends it: the check runs
    executor = PipelineExecutor.spawn(StageSpec(WeightSource(seed=2), 2, 64, 4, "float32"))
    victim = executor.processes[0]
    raised: list[BaseException] = []

    def submit_second() -> None:
        try:
            executor.submit(second)
        except BaseException as err:
            raised.append(err)

    try:
        executor.submit(first).result()                   # the pipeline runs
        killed.set()
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(10.0)
        assert victim.exitcode == -signal.SIGKILL
        submitter = threading.Thread(target=submit_second, daemon=True)
        submitter.start()
        submitter.join(10.0)
        assert not submitter.is_alive(), "submit() hung after a stage died"
    finally:
        release.set()
        executor.close()
    assert len(raised) == 1 and isinstance(raised[0], StageDied), raised
    assert f"stage 0 (pid {victim.pid}) was killed by SIGKILL" in str(raised[0])
    assert all(p.exitcode is not None for p in executor.processes)   # every process reaped
    Path(executor.log_path).unlink()                  # kept after a failure, for the user


def test_a_send_that_gloo_refuses_after_a_stage_died_names_the_stage():
    """gloo refuses a send to a stage whose connection has closed. When the
    stage died after the driver's last check (`reset` makes none), that is
    the stage's death, reported as such, not a bare gloo RuntimeError."""
    executor = PipelineExecutor.spawn(StageSpec(WeightSource(seed=2), 2, 64, 4, "float32"))
    victim = executor.processes[0]
    try:
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(10.0)
        deadline = time.monotonic() + 20.0
        with pytest.raises(StageDied) as info:
            while time.monotonic() < deadline:        # until gloo has seen the connection close
                executor.reset()
                time.sleep(0.05)
    finally:
        executor.close()
    assert f"stage 0 (pid {victim.pid}) was killed by SIGKILL" in str(info.value), info.value
    Path(executor.log_path).unlink()                  # kept after a failure, for the user


def test_a_stage_killed_while_starting_is_named_within_seconds_and_everything_is_reaped(
        monkeypatch):
    spec = StageSpec(WeightSource(seed=2), 3, 64, 4, "float32")
    started: list = []
    killed_at: list[float] = []
    wait_for_checkins = pipeline._wait_for_checkins

    def kill_stage_1_first(store, procs, timeout_s, log_path):
        started.extend(procs)
        os.kill(procs[1].pid, signal.SIGKILL)        # before it can reach the store
        killed_at.append(time.monotonic())
        wait_for_checkins(store, procs, timeout_s, log_path)

    monkeypatch.setattr(pipeline, "_wait_for_checkins", kill_stage_1_first)
    with pytest.raises(StageDied) as info:        # a fault of the run: `run` exits 1, not 2
        PipelineExecutor.spawn(spec, init_timeout=300.0)
    detected = time.monotonic() - killed_at[0]
    assert detected < 10.0, detected
    message = str(info.value)
    assert f"stage 1 (pid {started[1].pid}) was killed by SIGKILL while starting" in message
    assert all(p.exitcode is not None for p in started)            # every process reaped
    log = Path(_log_named(message))
    assert log.exists()                                # kept after a failure, for the user
    log.unlink()


def _log_named(message: str) -> str:
    found = re.search(r"the stages' output: (\S+)\)", message)
    assert found, message
    return found.group(1)


# -- the CLI: what a user sees ---------------------------------------------------------

def _start_run(tmp_path: Path) -> tuple[subprocess.Popen, list[str], threading.Event]:
    """`flightcheck run --pp 3` in its own process group; its stderr lines are
    collected by a thread; the event is set once generation has begun."""
    cmd = [sys.executable, "-m", "flightcheck.cli", "run", "--pp", "3", "--num-prompts", "6",
           "--max-tokens", "400", "--max-model-len", "512", "--trace", str(tmp_path / "t.jsonl")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    lines: list[str] = []
    generating = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)
            if "requests finished" in line:
                generating.set()

    threading.Thread(target=read, daemon=True).start()
    assert generating.wait(120.0), "".join(lines)
    return proc, lines, generating


def _stage_pids(driver_pid: int) -> list[int]:
    """The driver's spawned stage processes, in start order (stage 0 first)."""
    children = Path(f"/proc/{driver_pid}/task/{driver_pid}/children").read_text().split()
    stages = [int(pid) for pid in children
              if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")]
    return sorted(stages)


def _group_is_gone(pgid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _assert_valid_jsonl(path: Path) -> None:
    lines = path.read_text().splitlines()
    assert lines
    for line in lines:
        json.loads(line)                               # no torn line
    assert check_trace(path).ok                        # a prefix of a legal run is legal


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")
def test_run_names_the_killed_stage_and_keeps_the_survivors_tracebacks_out_of_stderr(tmp_path):
    proc, lines, _ = _start_run(tmp_path)
    try:
        stage_0 = _stage_pids(proc.pid)[0]
        os.kill(stage_0, signal.SIGKILL)
        proc.wait(30.0)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1
    assert _group_is_gone(proc.pid, 5.0)                # every process reaped
    stderr = "".join(lines)
    assert f"stage 0 (pid {stage_0}) was killed by SIGKILL" in stderr, stderr
    assert "Traceback" not in stderr, stderr
    log = Path(_log_named(stderr))
    assert log.exists()
    log.unlink()
    _assert_valid_jsonl(tmp_path / "t.jsonl")


def test_ctrl_c_stops_the_run_and_every_stage_within_two_seconds_with_one_line(tmp_path):
    proc, lines, _ = _start_run(tmp_path)
    try:
        before = len(lines)
        os.killpg(proc.pid, signal.SIGINT)               # what a terminal's Ctrl-C does
        interrupted_at = time.monotonic()
        proc.wait(30.0)
        took = time.monotonic() - interrupted_at
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130
    assert took < 2.0, took
    assert _group_is_gone(proc.pid, 2.0)                # every process reaped
    time.sleep(0.2)                                     # the reader thread's last lines
    after = [line for line in lines[before:] if line.strip() and "requests finished" not in line]
    assert after == ["flightcheck: interrupted\n"], after
    _assert_valid_jsonl(tmp_path / "t.jsonl")
