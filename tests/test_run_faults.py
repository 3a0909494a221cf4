"""`flightcheck run --pp 3` under faults of its processes: a driver killed or
told to stop, a stage that hangs, Ctrl-C while the stages start, a stage
that dies once every result is back. Nothing is left running 2 s after the
driver has exited, whatever the case."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from flightcheck.cli import main
from flightcheck.runtime import heartbeat
from flightcheck.verification.traces.check import check_trace

pytestmark = [pytest.mark.usefixtures("both_checkers"),     # checks traces: both checkers compared
              pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")]

# Long enough a run that it is still generating when the test acts on it.
LONG_RUN = ["--pp", "3", "--num-prompts", "6", "--max-tokens", "400", "--max-model-len", "512"]
LEFT_AFTER_S = 2.0                   # no process of the run may be left this long after the driver
# A guard against a run that never starts, not a bound on its start: the driver
# and its stages each import torch and build the model, seconds on an idle host
# and minutes on a busy one (about 2 min for one torch import under
# `nice -n 10` at load 15 to 18, 2026-12-07); the tests that stop a run need it
# generating first, however long that takes.
STARTUP_HANG_S = 600.0


@dataclass
class Run:
    """`flightcheck run` in its own session, its stderr lines read by a thread."""
    proc: subprocess.Popen
    lines: list[str] = field(default_factory=list)
    generating: threading.Event = field(default_factory=threading.Event)

    def errors_after(self, start: int) -> list[str]:
        time.sleep(0.2)                                  # the reader's last lines
        return [line for line in self.lines[start:]
                if line.strip() and "requests finished" not in line]

    def kill_all(self, pids: list[int]) -> None:
        for pid in [self.proc.pid, *pids]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def answer_stop_signals() -> None:
    """Popen's preexec_fn: the driver starts with SIGTERM and SIGHUP at their
    default action, whatever the suite's own. Under `nohup` (a suite run in
    the background) SIGHUP is ignored, the driver inherits that, and
    flightcheck keeps a stop signal it was started ignoring ignored
    (commands/stop_signals.py): the SIGHUP cases would test nohup, not the
    driver's answer, and their driver would run on past the signal."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def _start(*argv: str) -> Run:
    cmd = [sys.executable, "-m", "flightcheck.cli", "run", *argv]
    run = Run(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, preexec_fn=answer_stop_signals))

    def read() -> None:
        for line in run.proc.stderr:
            run.lines.append(line)
            if "requests finished" in line:
                run.generating.set()

    threading.Thread(target=read, daemon=True).start()
    return run


def _start_generating(tmp_path: Path) -> tuple[Run, list[int]]:
    """A long run once it generates, and every process under its driver."""
    run = _start(*LONG_RUN, "--trace", str(tmp_path / "t.jsonl"))
    assert run.generating.wait(STARTUP_HANG_S), "".join(run.lines)
    return run, _descendants(run.proc.pid)


def _children(pid: int) -> list[int]:
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []
    found: list[int] = []
    for task in tasks:
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def _descendants(pid: int) -> list[int]:
    """Every process under `pid`: the stages and multiprocessing's helper."""
    found, todo = [], _children(pid)
    while todo:
        child = todo.pop()
        found.append(child)
        todo += _children(child)
    return found


def _stage_pids(driver: int) -> list[int]:
    """The spawned stage processes, stage 0 first (not the resource tracker)."""
    return sorted(pid for pid in _children(driver) if "spawn_main" in _cmdline(pid))


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")                       # a zombie has ended


def _left_after(pids: list[int], seconds: float) -> list[int]:
    """Those of `pids` still running `seconds` from now (checked as they end)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.02)
    return [pid for pid in pids if _alive(pid)]


def _assert_whole_trace(path: Path) -> int:
    """Every line of the trace is a whole JSON event and the events are a
    legal prefix of a run; returns how many."""
    lines = path.read_text().splitlines(keepends=True)
    assert lines and all(line.endswith("\n") for line in lines)
    for line in lines:
        json.loads(line)
    assert check_trace(path).ok
    return len(lines)


PROBE = """
import importlib.util, os, sys, time
spec = importlib.util.spec_from_file_location("lifeline", {lifeline!r})
lifeline = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lifeline)


def child(marker, parent_death_signal, delay):
    time.sleep(delay)
    lifeline.tie_to_driver(parent_death_signal)
    open(marker, "w").close()
    time.sleep(60)
"""

DRIVER = """
import multiprocessing, sys, time
sys.path.insert(0, {folder!r})
import probe
if __name__ == "__main__":
    child = multiprocessing.get_context("spawn").Process(
        target=probe.child, args=({marker!r}, {parent_death_signal!r}, {delay!r}))
    child.start()
    print(child.pid, flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize("parent_death_signal, delay", [(True, 0.0), (False, 0.0), (True, 1.0)],
                         ids=["death-signal", "watchdog-pipe-alone", "driver-gone-before-the-tie"])
def test_a_process_tied_to_its_driver_ends_within_a_second_of_its_sigkill(
        tmp_path, parent_death_signal, delay):
    """runtime/lifeline.py without torch: a spawned child tied to its driver
    (the parent-death signal, the watchdog pipe alone, or a driver that died
    before the child could tie itself) ends within a second of the driver."""
    lifeline = Path(heartbeat.__file__).with_name("lifeline.py")
    (tmp_path / "probe.py").write_text(PROBE.format(lifeline=str(lifeline)))
    marker = tmp_path / "tied"
    script = DRIVER.format(folder=str(tmp_path), marker=str(marker),
                           parent_death_signal=parent_death_signal, delay=delay)
    driver = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    child = -1
    try:
        child = int(driver.stdout.readline())
        deadline = time.monotonic() + 30.0
        while delay == 0.0 and not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        driver.kill()
        driver.wait(10.0)
        assert not _left_after([child], 1.0 + delay), "the child outlived its driver"
        assert delay == 0.0 or not marker.exists()       # it ended as it tied itself
    finally:
        driver.kill()
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def test_the_watch_names_a_stopped_process_but_not_a_silent_one_that_works():
    """runtime/heartbeat.py's judge without torch: two processes beat once,
    then fall silent; the one that uses CPU time all the same (a long call
    into C holding its GIL) is working, the one stopped by SIGSTOP is hung,
    named (index, pid, why) and SIGKILLed."""
    spin = "import time\nwhile True:\n    t = time.time()\n    while time.time() - t < 0.02: pass\n" \
           "    time.sleep(0.02)\n"
    working = subprocess.Popen([sys.executable, "-c", spin])
    stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        now = time.monotonic()
        watch = heartbeat.HangWatch([now, now], [working, stopped], hang_s=1.0)
        deadline = now + 20.0
        while watch.failure is None and time.monotonic() < deadline:
            time.sleep(0.05)
        watch.stop()
        assert watch.failure is not None and watch.failure.startswith(
            f"stage 1 (pid {stopped.pid}) is hung: no heartbeat for "), watch.failure
        assert "stopped by a signal, /proc state T" in watch.failure
        assert stopped.wait(10.0) == -signal.SIGKILL            # SIGKILL ends a stopped process
        assert working.poll() is None
    finally:
        for proc in (working, stopped):
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_a_driver_killed_by_sigkill_takes_every_stage_with_it_within_a_second(tmp_path):
    run, pids = _start_generating(tmp_path)
    stages = _stage_pids(run.proc.pid)
    try:
        assert len(stages) == 3, pids
        os.kill(run.proc.pid, signal.SIGKILL)
        run.proc.wait(10.0)
        left = _left_after(stages, 1.0)                  # the parent-death signal, at once
        assert not left, f"stages {left} outlived their driver by 1 s"
        assert not _left_after(pids, LEFT_AFTER_S)       # the resource tracker follows them
    finally:
        run.kill_all(pids)
    assert run.proc.returncode == -signal.SIGKILL


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_stop_the_run_with_one_line_a_whole_trace_and_nothing_left(
        tmp_path, signum):
    run, pids = _start_generating(tmp_path)
    try:
        before = len(run.lines)
        os.kill(run.proc.pid, signum)
        run.proc.wait(30.0)
        left = _left_after(pids, LEFT_AFTER_S)
    finally:
        run.kill_all(pids)
    assert not left, left
    assert run.proc.returncode == 128 + signum
    after = run.errors_after(before)
    name = signal.Signals(signum).name
    assert len(after) == 1 and re.fullmatch(
        rf"flightcheck: run stopped by {name}; the trace holds (\d+) complete events\n", after[0]), after
    events = _assert_whole_trace(tmp_path / "t.jsonl")
    assert after[0] == f"flightcheck: run stopped by {name}; the trace holds {events} complete events\n"


@pytest.mark.slow
def test_a_stopped_stage_is_named_within_the_stated_bound_and_the_run_ends_reaped(tmp_path):
    bound = heartbeat.HANG_S + heartbeat.BEAT_S + heartbeat.WATCH_S + 1.0   # the documented 6.75 s
    assert bound <= 10.0
    run, pids = _start_generating(tmp_path)
    stage_1 = _stage_pids(run.proc.pid)[1]
    try:
        before = len(run.lines)
        os.kill(stage_1, signal.SIGSTOP)
        stopped_at = time.monotonic()
        named = f"stage 1 (pid {stage_1}) is hung"
        while (time.monotonic() - stopped_at < 30.0 and run.proc.poll() is None
               and not any(named in line for line in run.lines[before:])):
            time.sleep(0.05)
        took = time.monotonic() - stopped_at
        run.proc.wait(30.0)
        left = _left_after(pids, LEFT_AFTER_S)           # the stopped stage too: SIGKILL ends it
    finally:
        run.kill_all(pids)
    after = run.errors_after(before)
    assert len(after) == 1 and named in after[0] and "stopped by a signal" in after[0], after
    assert took <= bound, took
    assert run.proc.returncode == 1
    assert not left, left
    _assert_whole_trace(tmp_path / "t.jsonl")
    log = re.search(r"the stages' output: (\S+)\)", after[0])
    assert log, after
    Path(log.group(1)).unlink()                          # kept after a failure, for the user


def test_ctrl_c_while_the_stages_import_torch_is_one_line_and_exit_130(tmp_path):
    """Ctrl-C reaches the whole process group, the stages too, while they
    import torch (before they can ignore SIGINT themselves). The driver is
    held stopped meanwhile, as a loaded machine may hold it, until each
    stage has either ended (a stage that took the Ctrl-C prints its
    traceback first) or holds it blocked, or has reached `stage_entry`
    (its stderr is the log), where it ignores it."""
    run = _start("--pp", "3", "--num-prompts", "2", "--max-tokens", "4",
                 "--trace", str(tmp_path / "t.jsonl"))
    try:
        stages = _stages_importing_torch(run.proc.pid)
        pids = _descendants(run.proc.pid)
        os.kill(run.proc.pid, signal.SIGSTOP)
        os.killpg(run.proc.pid, signal.SIGINT)          # what a terminal's Ctrl-C does
        deadline = time.monotonic() + 60.0
        while not all(_deaf_to_sigint(pid) for pid in stages) and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(run.proc.pid, signal.SIGCONT)
        run.proc.wait(30.0)
        left = _left_after(pids, LEFT_AFTER_S)
    finally:
        run.kill_all(_descendants(run.proc.pid))
    assert len(stages) == 3
    assert run.proc.returncode == 130
    lines = run.errors_after(0)
    assert lines[0].startswith("flightcheck run: 2 requests"), lines
    assert len(lines) == 2 and "interrupted" in lines[1], lines
    assert not left, left


def _stages_importing_torch(driver: int, timeout_s: float = 120.0) -> list[int]:
    """Wait until each of the 3 stages has mapped libtorch (it is importing
    torch: its interpreter is up, its `stage_entry` not yet reached)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stages = _stage_pids(driver)
        if len(stages) == 3 and all(_maps_libtorch(pid) for pid in stages):
            return stages
        time.sleep(0.005)
    raise AssertionError("the stages did not start importing torch")


def _deaf_to_sigint(stage: int) -> bool:
    """The stage has ended, or SIGINT waits blocked on it, or it has reached
    `stage_entry` (then its stderr is the stages' log)."""
    sigint = 1 << (signal.SIGINT - 1)
    try:
        status = dict(line.split(":\t", 1) for line in
                      Path(f"/proc/{stage}/status").read_text().splitlines() if ":\t" in line)
        pending = int(status["ShdPnd"], 16) | int(status["SigPnd"], 16)
        if pending & int(status["SigBlk"], 16) & sigint:
            return True
        return "flightcheck-stages-" in os.readlink(f"/proc/{stage}/fd/2")
    except (OSError, KeyError, ValueError):
        return not _alive(stage)


def _maps_libtorch(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.slow
def test_ctrl_c_mid_run_writes_the_chrome_trace_from_the_partial_trace(tmp_path):
    chrome = tmp_path / "t.chrome.json"
    run = _start(*LONG_RUN, "--trace", str(tmp_path / "t.jsonl"), "--chrome-trace", str(chrome))
    assert run.generating.wait(STARTUP_HANG_S), "".join(run.lines)
    pids = _descendants(run.proc.pid)
    try:
        os.killpg(run.proc.pid, signal.SIGINT)
        run.proc.wait(30.0)
        left = _left_after(pids, LEFT_AFTER_S)
    finally:
        run.kill_all(pids)
    assert run.proc.returncode == 130
    assert not left, left
    _assert_whole_trace(tmp_path / "t.jsonl")
    events = json.loads(chrome.read_text())["traceEvents"]
    assert any(e["ph"] == "X" for e in events)              # the stages' slices so far


def test_a_stage_that_dies_once_every_result_is_back_is_named_and_the_run_exits_1(
        tmp_path, monkeypatch, capsys):
    """The last stage is killed after generate() returned every result and
    before the stages are stopped: the results are printed, then one line
    names the stage and how it ended, exit 1 (a fault of the run)."""
    generate_module = sys.modules["flightcheck.runtime.generate"]   # the package's `generate` is the function
    real_generate = generate_module.generate
    victims: list = []

    def generate_then_kill_the_last_stage(executor, *args, **kwargs):
        result = real_generate(executor, *args, **kwargs)
        victims.append(executor.processes[-1])
        os.kill(victims[0].pid, signal.SIGKILL)
        victims[0].join(10.0)
        return result

    monkeypatch.setattr(generate_module, "generate", generate_then_kill_the_last_stage)
    code = main(["run", "--pp", "2", "--num-prompts", "2", "--max-tokens", "4", "--json",
                 "--max-model-len", "96", "--block-size", "4", "--num-blocks", "40"])
    out, err = capsys.readouterr()
    assert code == 1
    assert len(json.loads(out)["requests"]) == 2                # the results, whole
    pid = victims[0].pid
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"flightcheck: error: every result was back, but stage 1 (pid {pid}) "
                           "was killed by SIGKILL"), err
    assert not _left_after([pid], LEFT_AFTER_S)
    log = re.search(r"the stages' output: (\S+)\)", line)
    assert log, line
    Path(log.group(1)).unlink()                          # kept after a failure, for the user
