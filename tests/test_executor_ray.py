"""The Ray executor (verification/executors/ray_cluster.py) on a Ray instance
started once for the session (two CPUs): the same results, order, errors and
retries as the local executor, `fuzz --seeds`'s JSON equal to the local
run's, and a Ctrl-C that cancels the cluster's tasks. Skipped without Ray
(the optional `cluster` extra; CI installs it). The long comparisons
(`verify`, a vLLM campaign) and the two-node cluster are under `slow`."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from flightcheck.cli import main
from flightcheck.verification import executors
from flightcheck.verification.executors import Task, probes

from .test_executor import FLIGHTCHECK, fuzz_json, napping_tasks, strip_times

pytestmark = pytest.mark.usefixtures("both_checkers")   # runs fuzz/campaign checks: both checkers compared

ray = pytest.importorskip("ray")

# A Ray cluster authenticates its drivers by the token in ~/.ray/auth_token
# (a local instance writes it); a driver joining by address says it uses one.
TOKEN_AUTH = {**os.environ, "RAY_AUTH_MODE": "token"}


@pytest.fixture(scope="session")
def ray_address() -> str:
    """A Ray instance for the session (two CPUs); its address."""
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.ERROR, object_store_memory=100 * 1024 * 1024)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture
def on_ray(ray_address):
    executors.configure("ray")
    yield ray_address
    executors.configure("local")


def test_ray_results_come_back_by_key_and_progress_in_completion_order(on_ray):
    told = []
    with executors.open_executor(3) as executor:
        results = executor.map(list(reversed(napping_tasks())), told.append)
    assert results == ["result 0", "result 1", "result 2"]
    # progress as they finish (which one is last depends on when Ray starts
    # each worker: on a loaded machine, seconds)
    assert [done.finished for done in told] == [1, 2, 3]
    assert sorted(done.task.key for done in told) == [(0,), (1,), (2,)]
    assert [done.seconds for done in told] == sorted(done.seconds for done in told)


def test_a_ray_tasks_own_error_is_the_error_the_local_run_raises(on_ray):
    with pytest.raises(probes.ProbeFailure, match="^no such workload: 7$"):
        with executors.open_executor(2) as executor:
            executor.map([Task((0,), probes.fail, ("no such workload: 7",), "bad")])


def test_a_ray_task_lost_with_its_worker_is_run_again_and_counted(on_ray, tmp_path):
    before = executors.counts()
    with executors.open_executor(2) as executor:
        assert executor.map([Task((0,), probes.die_once, (str(tmp_path / "died"), "survived"))]) == ["survived"]
    assert executors.counts()["retried"] - before["retried"] == 1


def test_fuzz_seeds_on_ray_equals_the_local_run(on_ray, capsys):
    argv = ("--seeds", "0-3", "--steps", "400", "--jobs", "2")     # acceptance's 2000 steps: docs/cluster.md
    local = fuzz_json(capsys, *argv)
    on_cluster = fuzz_json(capsys, *argv, "--executor", "ray")
    assert (local["executor"], on_cluster["executor"]) == ("local", "ray")
    assert local["tasks"] == on_cluster["tasks"] == 4
    assert strip_times(local) == strip_times(on_cluster)


def _wait_for_free_cpus(wanted: float, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("CPU", 0) != wanted and time.monotonic() < deadline:
        time.sleep(0.2)


def test_ctrl_c_cancels_the_clusters_tasks_and_is_one_line_exit_130(on_ray):
    # An earlier test's finished tasks can hold their CPUs a moment longer (Ray
    # keeps a worker's lease briefly): wait until both are free, or "the
    # command's tasks hold the CPUs" below would be true before the command
    # even started, and the SIGINT would reach it while Python loads (a bare
    # death by SIGINT, -2, as CI saw once).
    _wait_for_free_cpus(2)
    assert ray.available_resources().get("CPU", 0) == 2, "an earlier test's tasks still hold the CPUs"
    proc = subprocess.Popen([*FLIGHTCHECK, "fuzz", "--seeds", "0-3", "--steps", "100000000",
                             "--executor", "ray", "--ray-address", on_ray],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=TOKEN_AUTH)
    _wait_for_free_cpus(0)                                       # until its tasks hold the two CPUs
    assert ray.available_resources().get("CPU", 0) == 0, "the tasks never started"   # (a key used up is absent)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    lines = [line for line in err.splitlines() if line.startswith("flightcheck")]
    assert lines == ["flightcheck fuzz: interrupted (Ctrl-C); nothing more was written"], err
    assert "Traceback" not in err
    _wait_for_free_cpus(2, timeout_s=30)                         # the cancelled tasks give their CPUs back
    assert ray.available_resources().get("CPU", 0) == 2, "the cluster's tasks were not cancelled"


def test_a_ray_address_where_no_cluster_answers_is_one_line_and_exit_2():
    proc = subprocess.run([*FLIGHTCHECK, "fuzz", "--seeds", "0-1", "--steps", "10", "--executor", "ray",
                           "--ray-address", "127.0.0.1:1"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == ["flightcheck: error: --executor ray: no Ray cluster answers at 127.0.0.1:1: "
                                        "Connection refused"], proc.stderr


def run_json(argv: list[str]) -> dict:
    import json
    proc = subprocess.run([*FLIGHTCHECK, *argv], capture_output=True, text=True, timeout=1800, env=TOKEN_AUTH)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_verify_on_ray_equals_the_local_run():
    local = run_json(["verify", "--json"])
    on_cluster = run_json(["verify", "--json", "--executor", "ray"])
    assert (local["executor"], on_cluster["executor"]) == ("local", "ray")
    assert local["tasks"] == on_cluster["tasks"] > 0
    assert strip_times(local) == strip_times(on_cluster)


@pytest.mark.slow
@pytest.mark.vllm
def test_a_vllm_campaign_on_ray_equals_the_local_run(tmp_path):
    if os.environ.get("FLIGHTCHECK_SKIP_VLLM"):
        pytest.skip("FLIGHTCHECK_SKIP_VLLM set")
    reports = []
    for executor in ("local", "ray"):
        path = tmp_path / f"{executor}.json"
        subprocess.run([*FLIGHTCHECK, "vllm", "campaign", "--versions", "0.8.5", "--workloads", "20", "--seed", "3",
                        "--json", str(path), "--executor", executor], check=True, capture_output=True, timeout=1800)
        import json
        reports.append(json.loads(path.read_text()))
    local, on_cluster = reports
    assert (local["executor"], on_cluster["executor"]) == ("local", "ray")
    assert local["tasks"] == on_cluster["tasks"] == 21                 # 20 workloads, 1 mutant flagging
    assert strip_times(local) == strip_times(on_cluster)


@pytest.mark.slow
def test_two_ray_nodes_on_this_machine_run_the_seeds_as_one_run_does(tmp_path):
    """docs/cluster.md's example: a head and a worker node (`ray start`), a
    campaign joined to them by address, the same rows as the local run."""
    port = 6390 + os.getpid() % 200
    head = f"127.0.0.1:{port}"
    nodes = [subprocess.Popen(["ray", "start", "--block", *flags, "--num-cpus", "1", "--include-dashboard", "false"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                              env=TOKEN_AUTH)
             for flags in (["--head", "--port", str(port)],)]
    try:
        time.sleep(15)
        nodes.append(subprocess.Popen(["ray", "start", "--block", "--address", head, "--num-cpus", "1"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                      env=TOKEN_AUTH))
        count = ("import ray, time; ray.init(address='%s', logging_level='ERROR'); "
                 "[time.sleep(1) for _ in range(60) if len([n for n in ray.nodes() if n['Alive']]) < 2]; "
                 "print(len([n for n in ray.nodes() if n['Alive']]))" % head)
        alive = subprocess.run([sys.executable, "-c", count], capture_output=True, text=True, timeout=120,
                               env=TOKEN_AUTH)
        assert alive.stdout.strip().splitlines()[-1] == "2", alive.stderr[-2000:]
        argv = ["fuzz", "--seeds", "0-3", "--steps", "500", "--json"]
        local = run_json(argv)
        on_cluster = run_json([*argv, "--executor", "ray", "--ray-address", head])
        assert on_cluster["executor"] == "ray" and on_cluster["tasks"] == 4
        assert strip_times(local) == strip_times(on_cluster)
    finally:
        for node in reversed(nodes):
            os.killpg(node.pid, signal.SIGTERM)
            node.wait(timeout=60)
        forget_cluster(port)


def forget_cluster(port: int) -> None:
    """Remove the address `ray start --head` leaves for later drivers, where
    it is this test's head's (a later `ray.init()` would wait on it)."""
    from pathlib import Path

    left = Path("/tmp/ray/ray_current_cluster")
    if left.exists() and left.read_text().strip().endswith(f":{port}"):
        left.unlink()


def test_check_trace_of_many_traces_on_ray_equals_the_local_run(on_ray, capsys):
    from .test_check_trace_many import LEGAL, VIOLATED

    def report(*argv: str) -> dict:
        assert main(["check-trace", str(VIOLATED), str(LEGAL), "--json", *argv]) == 1
        return json.loads(capsys.readouterr().out)

    local, on_cluster = report("--jobs", "2"), report("--executor", "ray")
    assert (local["executor"], on_cluster["executor"], on_cluster["tasks"]) == ("local", "ray", 2)
    assert strip_times(local) == strip_times(on_cluster)
