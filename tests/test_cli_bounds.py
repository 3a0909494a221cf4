"""Every bad argument is refused before work starts: exit 2, one line, no
traceback, within 2 s, no process left behind (issue 20, CLI bounds)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flightcheck.bench.burstgpt_synth import MIN_MAX_MODEL_LEN, synthetic_burstgpt
from flightcheck.bench.workload import WorkloadError
from flightcheck.commands.common import PP_PER_CORE, check_writable, local_pp_problem

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

SECONDS = 2.0
HUGE = str(10**30)
MISSING_DIR = "/nonexistent-flightcheck-dir/out.json"
NO_GPU = not (any(Path("/dev").glob("nvidia[0-9]*")) or Path("/proc/driver/nvidia").exists()
              or Path("/dev/kfd").exists())
TOO_MANY_STAGES = str(PP_PER_CORE * (os.cpu_count() or 1) + 1)


def processes_in_group(group: int) -> list[int]:
    """Live processes of a process group (zombies count: they were not reaped)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group:             # fields: state, ppid, pgrp, ...
            found.append(int(entry.name))
    return found


def refused(*argv: str) -> str:
    """Run the CLI in its own process group; assert the refusal contract and
    return the one line it printed."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "flightcheck.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    seconds = time.perf_counter() - t0
    left = processes_in_group(proc.pid)
    assert not left, f"processes left behind: {left}"
    assert proc.returncode == 2, (proc.returncode, out, err)
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("flightcheck: error: ")
    assert seconds < SECONDS, f"{seconds:.2f} s"
    return err


@pytest.mark.parametrize("argv, fragment", [
    # numbers: finite, in range
    (["run", "--num-prompts", "2", "--temperature", "nan"], "--temperature: must be a finite number"),
    (["run", "--num-prompts", "2", "--temperature", "-1"], "--temperature"),
    (["run", "--num-prompts", "2", "--top-p", "nan"], "--top-p"),
    (["run", "--num-prompts", "2", "--seed", HUGE], "--seed: must be at most 4294967295"),
    (["run", "--num-prompts", HUGE], "--num-prompts: must be at most"),
    (["run", "--num-prompts", "2", "--num-spec-tokens", "-1"], "--num-spec-tokens: must be at least 0"),
    (["run", "--num-prompts", "2", "--max-tokens", HUGE], "--max-tokens: must be at most"),
    (["simulate", "--seed", HUGE], "--seed: must be at most"),
    (["simulate", "--seed", "-1"], "--seed: must be at least 0"),
    (["simulate", "--seed", "4294967295", "--seeds", "2"], "goes past the largest seed"),
    (["simulate", "--seeds", HUGE], "--seeds: must be at most"),
    (["simulate", "--request-rate", "nan"], "--request-rate: must be a finite number or inf"),
    (["simulate", "--request-rate", "0"], "must be positive"),
    (["simulate", "--burstiness", "inf"], "--burstiness: must be a finite number"),
    (["simulate", "--eta-compute", "nan"], "--eta-compute"),
    (["simulate", "--random-range-ratio", "nan"], "--random-range-ratio"),
    (["simulate", "--random-range-ratio", "1"], "--random-range-ratio: must be in [0, 1)"),
    (["simulate", "--pp", HUGE], "--pp: must be at most"),
    (["simulate", "--num-blocks", "0"], "--num-blocks: must be at least 1"),
    (["bench", "--seed", HUGE], "--seed: must be at most"),
    (["bench", "--request-rate", "-inf"], "--request-rate"),
    (["fuzz", "--steps", HUGE], "--steps: must be at most"),
    (["fuzz", "--seed", HUGE], "--seed: must be at most"),
    (["fuzz", "--profile", "vllm-0.0"], "unknown --profile 'vllm-0.0'"),
    (["verify", "--depth", "1000000"], "--depth: must be at most"),
    (["verify", "--jobs", "1000000"], "--jobs: must be at most"),
    # --max-model-len too small for the workload: the limit named (simulate/bench used to hang)
    (["simulate", "--max-model-len", "64", "--num-prompts", "3"], f"at least {MIN_MAX_MODEL_LEN}"),
    (["simulate", "--max-model-len", "16", "--num-prompts", "3"], f"at least {MIN_MAX_MODEL_LEN}"),
    (["simulate", "--max-model-len", "2", "--num-prompts", "3"], f"at least {MIN_MAX_MODEL_LEN}"),
    (["simulate", "--max-model-len", "1", "--num-prompts", "3"], f"at least {MIN_MAX_MODEL_LEN}"),
    (["bench", "--max-model-len", "64", "--num-prompts", "3"], f"at least {MIN_MAX_MODEL_LEN}"),
    (["bench", "--max-model-len", "16", "--num-prompts", "3"], f"at least {MIN_MAX_MODEL_LEN}"),
    (["bench", "--dataset", "random", "--random-input-len", "100", "--max-model-len", "64",
      "--num-prompts", "2"], "more than --max-model-len 64"),
    (["run", "--num-prompts", "2", "--max-model-len", "2"], "needs at least 5"),
    # local stage processes
    (["bench", "--pp", "100", "--num-prompts", "2"], "without --force"),
    (["run", "--pp", TOO_MANY_STAGES, "--num-prompts", "2"], "without --force"),
    # outputs checked before the run
    (["run", "--num-prompts", "2", "--trace", MISSING_DIR], "--trace"),
    (["run", "--num-prompts", "2", "--chrome-trace", MISSING_DIR], "--chrome-trace"),
    (["simulate", "--num-prompts", "2", "--trace", MISSING_DIR], "--trace"),
    (["simulate", "--num-prompts", "2", "--save-result", MISSING_DIR], "--save-result"),
    (["bench", "--num-prompts", "2", "--trace", MISSING_DIR], "--trace"),
    (["bench", "--num-prompts", "2", "--save-result", MISSING_DIR], "--save-result"),
    (["simulate", "--num-prompts", "2", "--save-result", "/"], "is a directory"),
])
def test_a_bad_argument_is_refused_in_one_line(argv, fragment):
    assert fragment in refused(*argv)


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU driver")
@pytest.mark.parametrize("command", ["run", "bench"])
def test_device_cuda_without_a_gpu_is_one_line(command):
    assert "no CUDA device" in refused(command, "--num-prompts", "2", "--device", "cuda")


@pytest.fixture
def small_trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text('{"ev":"config","num_stages":2}\n{"ev":"stage","batch":1,"stage":0,"t0":0,"t1":1}\n')
    return path


def test_plot_refuses_start_after_end(small_trace):
    assert "must be before --end" in refused("plot", str(small_trace), "--start", "5", "--end", "1")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "x"])
def test_plot_refuses_a_window_that_is_not_a_finite_number(small_trace, value):
    assert "--start" in refused("plot", str(small_trace), "--start", value)


def test_plot_refuses_a_binary_file_naming_the_line(tmp_path):
    path = tmp_path / "b.bin"
    path.write_bytes(b'{"ev"\n' + bytes(range(128, 256)))
    assert "b.bin:2: not UTF-8" in refused("plot", str(path))


@pytest.mark.parametrize("flag", ["--out", "--perfetto"])
def test_plot_refuses_an_unwritable_output_before_reading(small_trace, flag):
    assert flag in refused("plot", str(small_trace), flag, MISSING_DIR)


def test_plot_refuses_a_trace_of_the_wrong_shape_in_one_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"ev":"config","num_stages":"two"}\n')
    assert "not a trace this command reads" in refused("plot", str(path))


def test_synthetic_burstgpt_refuses_a_small_max_model_len_at_once():
    t0 = time.perf_counter()
    for max_model_len in (1, 2, 16, 64, MIN_MAX_MODEL_LEN - 1):
        with pytest.raises(WorkloadError, match=f"at least {MIN_MAX_MODEL_LEN}"):
            synthetic_burstgpt(150, 0, max_model_len)
    assert time.perf_counter() - t0 < SECONDS


def test_synthetic_burstgpt_at_the_minimum_fits_every_request():
    workload = synthetic_burstgpt(150, 0, MIN_MAX_MODEL_LEN)
    assert len(workload.requests) == 150
    assert all(r.prompt_len + r.output_len <= MIN_MAX_MODEL_LEN for r in workload.requests)


def test_force_allows_more_stages_than_the_cap():
    many = PP_PER_CORE * (os.cpu_count() or 1) + 1
    assert local_pp_problem(many, force=False) is not None
    assert local_pp_problem(many, force=True) is None
    assert local_pp_problem(1, force=False) is None


def test_a_writable_output_is_accepted_and_left_as_it_was(tmp_path):
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    old.write_text("kept")
    assert check_writable(str(new), "--out") is None and not new.exists()
    assert check_writable(str(old), "--out") is None and old.read_text() == "kept"
    assert "is a directory" in check_writable(str(tmp_path), "--out")
