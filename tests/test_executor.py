"""The executor seam (verification/executors) with its local process pool:
results in key order whatever order tasks finish in, a task's own error
raised as it is, a task lost with its worker run again and counted, and the
seam's options on the commands (`fuzz --seeds`); Ray's own tests are in
test_executor_ray.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from flightcheck.cli import main
from flightcheck.verification import executors
from flightcheck.verification.executors import Task, probes

from .test_ctrl_c import wait_until_sigint_is_caught

pytestmark = pytest.mark.usefixtures("both_checkers")   # runs fuzz/campaign checks: both checkers compared

FLIGHTCHECK = [sys.executable, "-m", "flightcheck.cli"]


def napping_tasks() -> list[Task]:
    """Three tasks that finish in the reverse of their key order."""
    return [Task((key,), probes.nap, (1.0 - 0.45 * key, f"result {key}"), f"task {key}") for key in range(3)]


def test_local_results_come_back_by_key_and_progress_in_completion_order():
    told = []
    with executors.open_executor(3, kind="local") as executor:
        results = executor.map(list(reversed(napping_tasks())), told.append)
    assert results == ["result 0", "result 1", "result 2"]
    assert [done.task.key for done in told] == [(2,), (1,), (0,)]
    assert [done.finished for done in told] == [1, 2, 3] and told[-1].total == 3


def test_a_tasks_own_error_comes_back_as_it_is_and_cancels_the_rest():
    tasks = [Task((0,), probes.fail, ("no such workload: 7",), "bad"), Task((1,), probes.nap, (30, None))]
    started = time.monotonic()
    with pytest.raises(probes.ProbeFailure, match="^no such workload: 7$"):
        with executors.open_executor(2, kind="local") as executor:
            executor.map(tasks)
    assert time.monotonic() - started < 20                # the 30 s task was not waited for


def test_a_task_lost_with_its_worker_is_run_again_and_counted(tmp_path):
    before = executors.counts()
    tasks = [Task((0,), probes.die_once, (str(tmp_path / "died"), "survived")),
             Task((1,), probes.echo, ("other",))]
    with executors.open_executor(2, kind="local") as executor:
        assert executor.map(tasks) == ["survived", "other"]
    assert (tmp_path / "died").exists()
    assert executors.counts()["retried"] - before["retried"] >= 1


def test_two_tasks_with_one_key_are_refused():
    with executors.open_executor(1, kind="local") as executor, pytest.raises(ValueError, match="share a key"):
        executor.map([Task((0,), probes.echo, (1,)), Task((0,), probes.echo, (2,))])


def strip_times(value):
    """A report without what depends on the clock or the executor's name."""
    if isinstance(value, dict):
        return {key: strip_times(item) for key, item in value.items() if key not in ("seconds", "executor")}
    if isinstance(value, list):
        return [strip_times(item) for item in value]
    return value


def fuzz_json(capsys, *argv: str) -> dict:
    code = main(["fuzz", *argv, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    return report


def test_fuzz_seeds_are_the_single_seed_runs_in_seed_order(capsys):
    report = fuzz_json(capsys, "--seeds", "3,1-2", "--steps", "120", "--jobs", "2")
    assert report["executor"] == "local" and report["tasks"] == 3 and report["retried"] == 0
    assert report["seeds"] == [1, 2, 3] and [run["seed"] for run in report["runs"]] == [1, 2, 3]
    alone = fuzz_json(capsys, "--seed", "2", "--steps", "120")
    assert strip_times(report["runs"][1]) == strip_times(alone)
    assert "executor" not in alone                           # one --seed runs in-process, as before


def test_fuzz_seeds_with_a_mutant_exits_0_only_when_every_seed_catches_it(capsys):
    code = main(["fuzz", "--seeds", "0-1", "--steps", "300", "--mutant", "advance_at_completion", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["failed"] == [0, 1] and code == 0
    code = main(["fuzz", "--seeds", "0-1", "--steps", "60", "--mutant", "snapshot_omits_prefix_hit", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["failed"] != [0, 1] and code == 1


@pytest.mark.parametrize(("argv", "line"), [
    (["--seed", "1", "--executor", "ray"], "--executor and --ray-address run the seeds of --seeds"),
    (["--seeds", "0-1", "--ray-address", "auto"], "--ray-address needs --executor ray"),
])
def test_executor_options_out_of_place_are_one_line_and_exit_2(capsys, argv, line):
    assert main(["fuzz", *argv, "--steps", "10"]) == 2
    assert capsys.readouterr().err.strip().endswith(line)


def test_without_ray_the_ray_executor_is_one_line_and_exit_2(monkeypatch, capsys):
    from flightcheck.verification.executors import ray_cluster

    real = ray_cluster.importlib.util.find_spec
    monkeypatch.setattr(ray_cluster.importlib.util, "find_spec",
                        lambda name, *rest: None if name == "ray" else real(name, *rest))
    assert main(["fuzz", "--seeds", "0-1", "--steps", "10", "--executor", "ray"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install -e '.[cluster]'" in err[0]


def test_the_core_never_imports_ray():
    code = ("import sys; from flightcheck.cli import main; "
            "main(['fuzz', '--seeds', '0-1', '--steps', '20', '--jobs', '2']); "
            "import flightcheck.verification.suite, flightcheck.vllm.campaign; "
            "assert 'ray' not in sys.modules, 'ray imported'")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=120)


def test_ctrl_c_during_local_tasks_is_one_line_exit_130_and_no_worker_left():
    proc = subprocess.Popen([*FLIGHTCHECK, "fuzz", "--seeds", "0-3", "--steps", "100000000", "--jobs", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    wait_until_sigint_is_caught(proc.pid)
    time.sleep(4)                                            # the pool's workers are running their seeds
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    time.sleep(2)
    left = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert proc.returncode == 130, err
    lines = [line for line in err.splitlines() if not line.startswith("flightcheck fuzz [")]
    assert lines == ["flightcheck fuzz: interrupted (Ctrl-C); nothing more was written"], err
    assert not left, f"processes left behind: {left}"
