"""`flightcheck vllm replay` says on stderr that vLLM is loading (its import
takes about a minute) and when it is ready, on a terminal and off it, and
keeps `--json` stdout pure JSON. A stand-in worker (no vLLM) plays the venv's
interpreter: it announces itself only once the test lets it, so each line is
seen while the load it reports is still under way."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

WORKER = '''
import json, os, sys, time
gate = sys.argv[1]
while not os.path.exists(gate):          # "importing vLLM" until the test opens the gate
    time.sleep(0.02)
print(json.dumps({"ready": "0.8.5"}), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    print(json.dumps({"name": job["workload"]["name"], "vllm_version": "0.8.5", "recorder": True,
                      "ending": "done", "steps": 3, "batches_in_flight": 0, "batches": [[1]], "outputs": [],
                      "ground_truth": {}, "trace": job["trace"], "unfinished": [], "exception": None}),
          flush=True)
'''

WORKLOADS = [{"name": name, "config": {"num_stages": 2, "max_num_batched_tokens": 16, "block_size": 4,
                                       "num_blocks": 20}, "requests": [{"prompt_len": 4}]}
             for name in ("first", "second")]


@pytest.fixture
def stand_in(tmp_path: Path) -> tuple[dict[str, str], Path, Path]:
    """The environment naming a stand-in interpreter, its gate, and a workload file."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    gate = tmp_path / "gate"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}" "{gate}"\n')
    python.chmod(0o755)
    workloads = tmp_path / "workloads.json"
    workloads.write_text(json.dumps(WORKLOADS))
    env = {**os.environ, "FLIGHTCHECK_VLLM_PYTHON_0_8_5": str(python)}
    return env, gate, workloads


def _read_until(read, text: str, timeout: float = 60.0) -> str:
    """What `read()` gives until `text` has appeared (fails after `timeout`)."""
    seen = ""
    deadline = time.monotonic() + timeout
    while text not in seen:
        assert time.monotonic() < deadline, f"no {text!r} in {seen!r}"
        seen += read()
    return seen


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from flightcheck.cli import main; sys.exit(main(sys.argv[1:]))",
            "vllm", "replay", *args]


def test_off_a_terminal_the_load_is_announced_while_it_runs_and_json_stays_pure(stand_in):
    env, gate, workloads = stand_in
    process = subprocess.Popen(_cli(str(workloads), "--json"), env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    before = _read_until(process.stderr.readline, "loading vLLM 0.8.5")
    assert "(importing vLLM takes about a minute)" in before and "ready" not in before
    gate.touch()
    stdout, after = process.communicate(timeout=60)
    assert process.returncode == 0
    lines = after.splitlines()
    assert lines[0].startswith("vLLM 0.8.5 ready after ")
    assert lines[1:] == ["replaying 1/2: first", "replaying 2/2: second"]
    assert [w["name"] for w in json.loads(stdout)["workloads"]] == ["first", "second"]   # nothing but JSON


def test_on_a_terminal_the_load_is_announced_while_it_runs(stand_in):
    env, gate, workloads = stand_in
    controller, terminal = pty.openpty()
    process = subprocess.Popen(_cli(str(workloads)), env=env, stdout=subprocess.PIPE, stderr=terminal, text=True)
    os.close(terminal)

    def read() -> str:
        ready, _, _ = select.select([controller], [], [], 1.0)
        return os.read(controller, 4096).decode() if ready else ""

    try:
        assert "ready" not in _read_until(read, "loading vLLM 0.8.5")
        gate.touch()
        _read_until(read, "vLLM 0.8.5 ready after ")
        stdout, _ = process.communicate(timeout=60)
    finally:
        os.close(controller)
    assert process.returncode == 0
    # Text results already name each workload on stdout: no progress lines there.
    assert stdout.splitlines()[0] == "first: vLLM 0.8.5, 1 batches, 3 engine steps, ended done"
    assert "replaying" not in stdout
