"""Outputs under faults (docs/outputs.md): an output never clobbers an input
or another output, a directory, a device or a reader-less FIFO is refused at
once, whole files are written whole or not at all, growing traces a whole
line at a time, and every write error is one line naming the path and the
cause. The commands run in-process through `flightcheck.cli.main` where the
point is a refusal; a real write error (a file-size limit the kernel
enforces, EFBIG, as a full disk's ENOSPC would) and a killed run run as
subprocesses."""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flightcheck.cli import main
from flightcheck.commands import outputs
from flightcheck.verification.traces.reading import parse_line

TINY_RUN = ["--pp", "1", "--num-prompts", "1", "--max-tokens", "2", "--max-model-len", "96",
            "--block-size", "4", "--num-blocks", "40", "--max-num-batched-tokens", "32"]
TINY_SIM = ["--num-prompts", "3"]
TINY_BENCH = ["--pp", "1", "--num-prompts", "2", "--dataset", "random", "--random-input-len", "8",
              "--random-output-len", "2", "--request-rate", "inf", "--max-model-len", "64",
              "--num-blocks", "64"]


def refused(capsys, argv: list[str], *needles: str) -> str:
    """main(argv) exits 2 with one stderr line holding every needle."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flightcheck: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture
def trace(tmp_path: Path, capsys) -> Path:
    """A small simulated trace with stage events (what `plot` draws)."""
    path = tmp_path / "t.jsonl"
    assert main(["simulate", *TINY_SIM, "--trace", str(path)]) == 0
    capsys.readouterr()
    return path


# --- clashes: the cases, one each --------------------------------------

def test_plot_perfetto_onto_its_own_trace_is_refused(capsys, trace):
    before = trace.read_bytes()
    refused(capsys, ["plot", str(trace), "--perfetto", str(trace), "--no-png"], "--perfetto", str(trace))
    assert trace.read_bytes() == before


def test_plot_out_through_a_link_to_the_trace_is_refused(capsys, trace, tmp_path):
    before = trace.read_bytes()
    (tmp_path / "link.png").symlink_to(trace)
    refused(capsys, ["plot", str(trace), "--out", str(tmp_path / "link.png")], "--out", "link.png")
    assert trace.read_bytes() == before


@pytest.mark.parametrize("flag", ["--trace", "--chrome-trace"])
def test_run_output_onto_its_prompts_is_refused(capsys, tmp_path, flag):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('"hello"\n')
    refused(capsys, ["run", "--prompts", str(prompts), flag, str(prompts), *TINY_RUN[:2]],
            flag, "--prompts")
    assert prompts.read_text() == '"hello"\n'


@pytest.mark.parametrize("flag", ["--trace", "--save-result"])
def test_simulate_output_onto_its_dataset_is_refused(capsys, tmp_path, flag):
    dataset = tmp_path / "d.json"
    dataset.write_text("[]")
    refused(capsys, ["simulate", "--dataset", "sharegpt", "--dataset-path", str(dataset), flag, str(dataset)],
            flag, "--dataset-path")
    assert dataset.read_text() == "[]"


@pytest.mark.parametrize("argv", [["run", *TINY_RUN, "--trace", "X", "--chrome-trace", "X"],
                                  ["simulate", *TINY_SIM, "--trace", "X", "--save-result", "X"],
                                  ["bench", *TINY_BENCH, "--trace", "X", "--save-result", "X"]])
def test_two_outputs_on_one_path_are_refused(capsys, tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    refused(capsys, argv, "same file")
    assert not (tmp_path / "X").exists()


# --- what is not a regular file ------------------------------------------------

@pytest.mark.parametrize("argv", [["run", *TINY_RUN, "--trace", "/dev/full"],
                                  ["run", *TINY_RUN, "--chrome-trace", "/dev/full"],
                                  ["simulate", *TINY_SIM, "--save-result", "/dev/full"],
                                  ["bench", *TINY_BENCH, "--save-result", "/dev/full"]])
def test_a_device_as_an_output_is_refused_at_once(capsys, argv):
    t0 = time.monotonic()
    refused(capsys, argv, "/dev/full", "character device")
    assert time.monotonic() - t0 < 5


@pytest.fixture
def fifo(tmp_path: Path):
    """A FIFO with no reader; a rescue thread reads it from 8 s on, so a
    command that blocks in open() (as main's did) fails this test instead of
    hanging it."""
    path = tmp_path / "fifo"
    os.mkfifo(path)
    done = threading.Event()

    def rescue() -> None:
        if done.wait(8):
            return
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        while not done.is_set():
            try:
                os.read(fd, 1 << 16)
            except BlockingIOError:
                pass
            time.sleep(0.01)
        os.close(fd)
    threading.Thread(target=rescue, daemon=True).start()
    yield path
    done.set()


@pytest.mark.parametrize("argv", [["simulate", *TINY_SIM, "--save-result"], ["simulate", *TINY_SIM, "--trace"],
                                  ["run", *TINY_RUN, "--trace"], ["bench", *TINY_BENCH, "--trace"],
                                  ["plot", "TRACE", "--out"]])
def test_a_fifo_with_no_reader_is_refused_within_the_bound(capsys, monkeypatch, fifo, trace, argv):
    monkeypatch.setattr(outputs, "FIFO_WAIT_S", 0.3)
    argv = [str(trace) if a == "TRACE" else a for a in argv]
    t0 = time.monotonic()
    code = main([*argv, str(fifo)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and time.monotonic() - t0 < 5
    assert "no reader" in err[-1] and str(fifo) in err[-1]
    grows = "--trace" in argv
    assert len(err) == (2 if grows else 1)          # a trace says it waits, then gives up
    assert not grows or "waiting up to" in err[0]


def test_a_fifo_with_a_reader_gets_the_whole_result(capsys, tmp_path, fifo):
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(Path(fifo).read_bytes()))
    reader.start()
    time.sleep(0.2)
    assert main(["simulate", *TINY_SIM, "--save-result", str(fifo), "--json"]) == 0
    reader.join(10)
    assert json.loads(received[0])["completed"] == 3
    assert json.loads(capsys.readouterr().out)["completed"] == 3


# --- plot --out ----------------------------------------------------------------

def test_plot_out_with_an_unknown_extension_lists_the_supported_ones(capsys, trace, tmp_path):
    refused(capsys, ["plot", str(trace), "--out", str(tmp_path / "x.docx")], "--out", ".docx", ".png", ".svg")
    assert not (tmp_path / "x.docx").exists()


def test_plot_out_without_an_extension_writes_exactly_that_path(capsys, trace, tmp_path):
    out = tmp_path / "noext"
    assert main(["plot", str(trace), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not (tmp_path / "noext.png").exists()
    assert f"wrote {out} " in capsys.readouterr().out


def test_plot_out_dev_full_is_refused_and_creates_nothing(capsys, trace):
    existed = Path("/dev/full.png").exists()
    try:
        refused(capsys, ["plot", str(trace), "--out", "/dev/full"], "/dev/full", "character device")
        assert existed or not Path("/dev/full.png").exists()
    finally:
        if not existed and Path("/dev/full.png").exists():
            os.unlink("/dev/full.png")             # what main's plot left behind


def test_an_interrupted_plot_leaves_the_old_png_and_no_temporary_file(capsys, trace, tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    out = tmp_path / "old.png"
    out.write_bytes(b"old")

    def interrupted_savefig(self, fname, *args, **kwargs):
        (open(fname, "wb") if isinstance(fname, (str, Path)) else fname).write(b"\x89PNG half")
        raise KeyboardInterrupt
    monkeypatch.setattr(Figure, "savefig", interrupted_savefig)
    assert main(["plot", str(trace), "--out", str(out)]) == 130          # Ctrl-C: cli.py's one line
    assert out.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.png", "t.jsonl", "t.perfetto.json"]


# --- write errors: a real one from the kernel --------------------------------

def cli(argv: list[str], cwd: Path, file_limit: int | None = None, **kwargs) -> subprocess.CompletedProcess:
    """flightcheck in a subprocess; `file_limit`: the largest file it may
    write (RLIMIT_FSIZE, SIGXFSZ ignored): a write past it fails with EFBIG."""
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))
    return subprocess.run([sys.executable, "-m", "flightcheck.cli", *argv], cwd=cwd, capture_output=True,
                          text=True, timeout=120, preexec_fn=limit if file_limit else None, **kwargs)


def one_error_line(done: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    lines = done.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("flightcheck: error:")]
    assert done.returncode == code and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    return errors[0]


def whole_lines(path: Path) -> list[dict]:
    """Every line of a trace, each a complete JSON object (check-trace's parser)."""
    text = path.read_text()
    assert text == "" or text.endswith("\n"), "the trace ends in a cut line"
    return [parse_line(line, n) for n, line in enumerate(text.splitlines(), 1)]


def test_a_trace_cut_by_a_full_disk_keeps_whole_lines_and_says_so(tmp_path):
    done = cli(["simulate", "--num-prompts", "20", "--trace", "t.jsonl"], tmp_path, file_limit=30_000)
    line = one_error_line(done, 1, "--trace t.jsonl", os.strerror(errno.EFBIG))      # as ENOSPC would
    events = whole_lines(tmp_path / "t.jsonl")
    assert events[0]["ev"] == "config" and f"first {len(events)} lines" in line


def test_a_result_or_figure_that_does_not_fit_leaves_the_old_file_and_no_temporary(tmp_path, trace):
    (tmp_path / "r.json").write_text("old")
    done = cli(["simulate", "--num-prompts", "10", "--save-result", "r.json"], tmp_path, file_limit=2_000)
    one_error_line(done, 1, "--save-result r.json", os.strerror(errno.EFBIG), "not saved")
    (tmp_path / "p.json").write_text("old")
    done = cli(["plot", str(trace), "--perfetto", "p.json", "--no-png"], tmp_path, file_limit=2_000)
    one_error_line(done, 1, "--perfetto p.json", os.strerror(errno.EFBIG))
    assert (tmp_path / "r.json").read_text() == "old" == (tmp_path / "p.json").read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_trace_reader_that_goes_away_is_one_line_naming_the_pipe(capsys, tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)

    def read_a_little_then_go() -> None:
        while True:
            try:
                if os.read(fd, 1000):
                    break
            except BlockingIOError:
                pass
            time.sleep(0.01)
        os.close(fd)
    reader = threading.Thread(target=read_a_little_then_go)
    reader.start()
    done = cli(["simulate", "--num-prompts", "20", "--request-rate", "1000", "--trace", str(path)], tmp_path)
    reader.join(10)
    one_error_line(done, 1, f"--trace {path}", "Broken pipe")


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_a_killed_run_leaves_every_trace_line_before_it_complete(tmp_path):
    """The driver is killed once a request has finished: the trace holds
    that request's `finish` (not waiting in a buffer) and only whole lines."""
    process = subprocess.Popen([sys.executable, "-m", "flightcheck.cli", "run", "--pp", "2", "--num-prompts", "6",
                                "--max-tokens", "40", *TINY_RUN[6:], "--trace", "t.jsonl"], cwd=tmp_path,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for line in process.stderr:
            if "1/6 requests finished" in line or "2/6 requests finished" in line:
                break
    finally:
        kill_group(process.pid)                         # the driver and its stage processes
        process.wait(30)
    events = whole_lines(tmp_path / "t.jsonl")
    assert events[0]["ev"] == "config" and any(e["ev"] == "finish" for e in events)


def test_a_path_that_cannot_be_written_is_one_line_naming_it_and_the_cause(capsys):
    """/sys takes no new file, for root too (EACCES, or EROFS where it is
    mounted read-only): refused before the run."""
    path = "/sys/flightcheck-output-test.json"
    line = refused(capsys, ["simulate", *TINY_SIM, "--save-result", path], "--save-result", path)
    assert os.strerror(errno.EACCES) in line or os.strerror(errno.EROFS) in line


@pytest.mark.parametrize("writer", ["simulate/bench", "run"])
def test_every_trace_event_is_a_whole_line_on_disk_as_it_is_written(tmp_path, writer):
    """The growing traces keep nothing back: after each event the file holds
    it, whole, so a process that dies loses nothing written (main's 64 KB
    buffer held them all). The killed `run` above is the end-to-end case."""
    path = tmp_path / "t.jsonl"
    if writer == "run":
        from flightcheck.runtime.trace import RuntimeTraceWriter
        trace = RuntimeTraceWriter.to_path(str(path), eos_token_id=2)
    else:
        from flightcheck.bench.timed_trace import TimedTraceWriter
        trace = TimedTraceWriter.to_path(str(path), time.monotonic)
    for batch in range(50):
        trace.stage(batch, 0, time.time(), time.time() + 0.001)
        events = whole_lines(path)
        assert len(events) == batch + 1 and events[-1]["batch"] == batch
    trace.close()
