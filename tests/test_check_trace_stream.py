"""The streaming check-trace (verification/traces/stream.py): the whole-trace
checker's verdicts on every trace file of the suite and on the reference's
runs, read from a file, standard input or a followed file; a violation
reported while the writer still writes; --follow's ends (the end event, a
signal, idle); --keep-going; and pathological input refused at once in
bounded memory. (Every trace a test checks with check_events is also
streamed, by conftest.py's differential check.)"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from flightcheck.cli import main
from flightcheck.verification.mutants.patching import reference_applied
from flightcheck.verification.traces import stream as stream_module
from flightcheck.verification.traces.check import MalformedTrace, check_events, check_trace, read_events
from flightcheck.verification.traces.stream import MAX_PROMPT_BLOCKS, check_lines

from .conftest import _original_check_events as whole_check_events   # not compared again: long traces
from .fixtures import load_benchmark
from .test_check_trace import SCENARIOS

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

ROOT = Path(__file__).resolve().parent.parent
DATA_TRACES = sorted((ROOT / "tests" / "data").rglob("*.jsonl"))
CLI = [sys.executable, "-m", "flightcheck.cli", "check-trace"]
KEYS = ("ok", "event_index", "property", "message", "line", "event", "profile", "unchecked")

CONFIG = {"ev": "config", "num_stages": 2, "max_num_batched_tokens": 16, "block_size": 4, "num_blocks": 16,
          "max_model_len": 64, "eos_token_id": 0}


def reference_traces(tmp: Path) -> list[Path]:
    """The reference's run of each mutant's scenario, correct and with the mutant, as files."""
    paths = []
    for name in sorted(SCENARIOS):
        for mutant in (None, name):
            with reference_applied(mutant):
                text = SCENARIOS[name](mutant).getvalue()
            path = tmp / f"{name}-{mutant or 'correct'}.jsonl"
            path.write_text(text)
            paths.append(path)
    return paths


def whole_trace_verdict(path: Path) -> dict:
    """What check-trace said before it streamed: the whole-trace checker's result."""
    try:
        return check_trace(path).to_json()
    except MalformedTrace as err:
        return {"ok": False, "malformed": str(err)}


def same_verdict(streamed: dict, whole: dict) -> bool:
    """The verdict, property, line, event, message, profile and what is not
    checked; `state_before` but for the free queue (the streamed pool is cut
    to the arrivals read so far); `events` when legal."""
    if "malformed" in whole and "malformed" not in streamed and not streamed["ok"]:
        # the whole-trace checker reads every line before it checks; a stream
        # stops at its first violation, before a malformed line further on
        # (vLLM 0.34 sent a negative start after the id-reuse bug it shows:
        # tests/data/vllm/reuse-ids)
        malformed_at = int(whole["malformed"].split(":")[0].removeprefix("line "))
        return streamed["line"] < malformed_at
    if "malformed" in whole or "malformed" in streamed:
        return streamed == whole
    def before(result: dict) -> str | None:
        return None if result["state_before"] is None else result["state_before"].split(" | free=")[0]
    return all(streamed[k] == whole[k] for k in KEYS) and before(streamed) == before(whole) \
        and (not whole["ok"] or streamed["events"] == whole["events"])


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["check-trace", *args])
    return code, out.getvalue(), err.getvalue()


def cli_json(*args: str) -> tuple[int, dict]:
    code, out, _ = cli("--json", *args)
    return code, json.loads(out)


def run(command: str | list[str], timeout: float = 30, **options) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          shell=isinstance(command, str), **options)


def write_trace(path: Path, events: list[dict]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def arrive(req: str, prompt_len: int = 4, max_tokens: int = 2) -> dict:
    return {"ev": "arrive", "req": req, "prompt_len": prompt_len, "max_tokens": max_tokens}


# -- the same verdicts as the whole-trace checker ------------------------------------------

def test_every_trace_of_the_suite_streamed_from_a_file_or_followed_gets_the_whole_trace_verdict(tmp_path):
    for path in DATA_TRACES + reference_traces(tmp_path):
        whole = whole_trace_verdict(path)
        code, streamed = cli_json(str(path))
        assert same_verdict(streamed, whole), (path, streamed, whole)
        assert code == (0 if streamed["ok"] else 2 if "malformed" in streamed else 1), path
        code, followed = cli_json("--follow", "--idle", "0", str(path))
        assert same_verdict(followed, whole), (path, followed, whole)


@pytest.mark.slow
def test_every_trace_of_the_suite_piped_to_stdin_and_followed_by_the_cli_gets_the_whole_trace_verdict(tmp_path):
    """`cat T | flightcheck check-trace -` and `flightcheck check-trace --follow T`, in a process each."""
    for path in DATA_TRACES + reference_traces(tmp_path):
        whole = whole_trace_verdict(path)
        for command in (f"cat '{path}' | {' '.join(CLI)} --json -", CLI + ["--json", "--follow", "--idle", "0.2",
                                                                          str(path)]):
            proc = run(command, timeout=60)
            streamed = json.loads(proc.stdout)
            assert same_verdict(streamed, whole), (command, streamed, whole)


def test_stdin_and_a_followed_file_in_their_own_process(tmp_path):
    legal, rejected = ROOT / "tests/data/async/accepted.jsonl", ROOT / "tests/data/async/rejected_stagger.jsonl"
    for path, code in ((legal, 0), (rejected, 1)):
        whole = whole_trace_verdict(path)
        piped = run(f"cat '{path}' | {' '.join(CLI)} --json -")
        followed = run(CLI + ["--json", "--follow", "--idle", "0.2", str(path)])
        for proc in (piped, followed):
            assert proc.returncode == code and same_verdict(json.loads(proc.stdout), whole), proc


def test_long_generated_traces_with_slots_growing_and_labels_pruned_stream_to_the_same_verdict(monkeypatch):
    """Slots double (output labels renamed), the pool grows at arrivals,
    repeated prompts cache labels twice, prompt labels are pruned: the verdict
    of check_events (with its differential of both checkers) on each."""
    monkeypatch.setattr(stream_module, "PRUNE_LABELS_FROM", 16)
    write_long_trace = load_benchmark("long_traces").write_long_trace
    for concurrency, options in ((16, {"block_size": 4, "repeated_prompts": 0.3}),
                                 (9, {"block_size": 2, "repeated_prompts": 0.5, "profile": "vllm-0.8.4",
                                       "continue_prefill": None})):
        sink = io.StringIO()
        write_long_trace(sink, concurrency, 400, seed=3, **options)
        lines = sink.getvalue().split("\n")
        whole = whole_check_events(read_events(lines))
        assert whole.ok
        verdicts = list(check_lines(lines))
        assert len(verdicts) == 1 and verdicts[0].result.ok and verdicts[0].result.events == whole.events
        # damaged: a token of a late batch changed
        late = max(i for i, line in enumerate(lines) if line and json.loads(line)["ev"] == "complete"
                   and json.loads(line).get("tokens"))
        event = json.loads(lines[late])
        name = next(iter(event["tokens"]))
        event["tokens"][name] = event["tokens"][name] + [1]
        damaged = lines[:late] + [json.dumps(event)] + lines[late + 1:]
        whole = whole_check_events(read_events(damaged))
        streamed = list(check_lines(damaged))[-1].result
        assert not whole.ok and (streamed.property, streamed.line, streamed.message) == \
            (whole.property, whole.line, whole.message)


def test_slots_grown_mid_run_rename_cached_output_labels_consistently(monkeypatch):
    """Slots doubled at arrivals 25 and 50, with output blocks cached: the
    full replay, which checks every invariant of the whole state after each
    event (S9 compares every cached label with its content), gives the
    whole-trace verdict, on the trace and on it damaged."""
    from flightcheck.verification.traces.growth import Growing

    original = Growing._new_slot

    def grow_now_and_then(self):
        arrivals = self.num_arrivals if hasattr(self, "next_unused") else len(self.names)
        if arrivals in (25, 50):
            self._grow_slots()
        return original(self)

    monkeypatch.setattr(Growing, "_new_slot", grow_now_and_then)
    sink = io.StringIO()
    load_benchmark("long_traces").write_long_trace(sink, 12, 500, seed=5, block_size=4, repeated_prompts=0.4)
    lines = sink.getvalue().split("\n")
    for full in (False, True):
        assert list(check_lines(lines, full=full))[-1].result.ok
    cut = len(lines) * 3 // 4
    damaged = lines[:cut] + lines[cut + 1:]
    whole = check_events(read_events(damaged))
    for full in (False, True):
        streamed = list(check_lines(damaged, full=full))[-1].result
        assert (streamed.ok, streamed.property, streamed.line, streamed.message) == \
            (whole.ok, whole.property, whole.line, whole.message)


# -- as it is written ------------------------------------------------------------------------

def test_a_violation_is_reported_while_the_writer_still_writes(tmp_path):
    path = tmp_path / "growing.jsonl"
    write_trace(path, [CONFIG, arrive("a", 8)])
    checker = subprocess.Popen(CLI + ["--follow", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=ROOT)
    try:
        time.sleep(0.5)
        with path.open("a") as out:                          # half a line, then the rest: one event
            out.write('{"ev": "schedule", "batch": 1, "entries": [{"req": "a", ')
            out.flush()
            time.sleep(0.3)
            out.write('"start": 0, "n": 5}]}\n')               # the spec schedules all 8 tokens
        stdout, stderr = checker.communicate(timeout=20)
    finally:
        checker.kill()
    assert checker.returncode == 1, stderr
    assert stdout.startswith(f"{path}: line 3 (schedule event) violates schedule_decision:")


def test_follow_ends_at_the_end_event_and_reads_what_was_already_written_after_it(tmp_path):
    path = write_trace(tmp_path / "t.jsonl", [CONFIG, {"ev": "end"}, arrive("late")])
    code, verdict = cli_json("--follow", str(path))
    assert code == 1 and verdict["property"] == "event_after_end" and verdict["line"] == 3


def _wait_until_it_follows(pid: int, path, timeout_s: float = 60) -> None:
    """Until process `pid` holds `path` open (Linux's /proc; elsewhere a plain wait)."""
    deadline = time.monotonic() + timeout_s
    fds = f"/proc/{pid}/fd"
    if not os.path.isdir(fds):
        time.sleep(3)
        return
    while time.monotonic() < deadline:
        try:
            if any(os.path.realpath(os.path.join(fds, fd)) == os.path.realpath(path) for fd in os.listdir(fds)):
                return
        except OSError:
            pass
        time.sleep(0.1)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_ends_follow_with_the_verdict_so_far(tmp_path, sig):
    path = write_trace(tmp_path / "t.jsonl", [CONFIG, arrive("a")])
    checker = subprocess.Popen(CLI + ["--follow", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=ROOT)
    _wait_until_it_follows(checker.pid, path)        # not while Python still loads (a loaded machine: seconds)
    time.sleep(0.5)
    checker.send_signal(sig)
    stdout, stderr = checker.communicate(timeout=20)
    assert checker.returncode == 0, stderr
    first = stdout.splitlines()[0]
    assert first == f"{path}: legal (2 events, profile vllm-0.8.5) (stopped by {sig.name} after 2 events)"


def test_idle_ends_follow_and_says_so(tmp_path):
    path = write_trace(tmp_path / "t.jsonl", [CONFIG, arrive("a")])
    started = time.monotonic()
    code, out, _ = cli("--follow", "--idle", "0.3", str(path))
    assert code == 0 and 0.3 <= time.monotonic() - started < 10
    assert out.splitlines()[0].endswith("(stopped after 0.3 s without a new line, after 2 events)")
    assert "not checked: liveness at the end (the trace has no end event)" in out


def test_a_fifo_is_read_as_its_writer_writes(tmp_path):
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    checker = subprocess.Popen(CLI + [str(fifo)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=ROOT)
    with fifo.open("w") as out:
        for event in (CONFIG, arrive("a"), {"ev": "abort", "req": "a"},
                      {"ev": "finish", "req": "a", "reason": "abort"}, {"ev": "end"}):
            out.write(json.dumps(event) + "\n")
            out.flush()
    stdout, stderr = checker.communicate(timeout=20)
    assert checker.returncode == 0 and stdout.startswith(f"{fifo}: legal (5 events"), stderr


def test_keep_going_reports_each_violation_and_carries_on(tmp_path):
    """Two batches the spec would not form (each skipped, the spec's state
    kept), a legal abort between them, and one left in flight at the end."""
    events = [CONFIG, arrive("a", 8), {"ev": "schedule", "batch": 1, "entries": [{"req": "a", "start": 0, "n": 5}]},
              arrive("b", 4), {"ev": "schedule", "batch": 2, "entries": [{"req": "b", "start": 0, "n": 4}]},
              {"ev": "schedule", "batch": 3, "entries": [{"req": "a", "start": 0, "n": 8}, {"req": "b", "start": 0,
                                                                                          "n": 4}]},
              {"ev": "end"}]
    path = write_trace(tmp_path / "t.jsonl", events)
    code, out, _ = cli("--keep-going", str(path))
    found = re.findall(r"line (\d+) \(\w+ event\) violates (\w+)", out)
    assert code == 1 and found == [("3", "schedule_decision"), ("5", "schedule_decision"), ("7", "L3_drain")]
    assert f"{path}: 3 violations (7 events, profile vllm-0.8.5)" in out
    code, out, _ = cli("--keep-going", "--json", str(path))
    objects = [json.loads(line) for line in out.splitlines()]
    assert [o["line"] for o in objects] == [3, 5, 7, 3] and objects[-1]["violations"] == 3
    assert code == 1 and check_trace(path).line == 3                      # the first is the whole-trace one


def test_json_keeps_its_keys():
    path = ROOT / "tests/data/async/rejected_stagger.jsonl"
    _, verdict = cli_json(str(path))
    assert set(verdict) == {"ok", "events", "event_index", "property", "message", "state_before", "unchecked",
                            "profile", "line", "event"}


def test_a_complete_waits_for_the_finishes_after_it_only_where_a_stop_token_is_unknown():
    """No eos_token_id: the stop is read from the finish after the complete."""
    config = {k: v for k, v in CONFIG.items() if k != "eos_token_id"}
    events = [config, arrive("a", 4, 3), {"ev": "schedule", "batch": 1, "entries": [{"req": "a", "start": 0, "n": 4}]},
              {"ev": "complete", "batch": 1, "tokens": {"a": [7]}}, {"ev": "finish", "req": "a", "reason": "stop"},
              {"ev": "end"}]
    lines = [json.dumps(e) for e in events]
    assert check_events(read_events(lines)).ok
    verdict = list(check_lines(lines))[-1]
    assert verdict.result.ok and verdict.result.events == 6


# -- pathological input: one line, exit 2, at once, in bounded memory --------------------------

MEASURED = (r"import resource, subprocess, sys, time; t = time.monotonic(); "
            r"p = subprocess.run(sys.argv[1], shell=True, capture_output=True, text=True, timeout=10); "
            r"print(p.returncode, time.monotonic() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
            r"sys.stdout.write(p.stderr)")


def measured(command: str) -> tuple[int, float, float, str]:
    """(exit code, seconds, peak RSS in MB of the processes it ran, stderr) of a shell command."""
    proc = run([sys.executable, "-c", MEASURED, command], timeout=30)
    head, _, stderr = proc.stdout.partition("\n")
    code, seconds, kib = head.split()
    return int(code), float(seconds), int(kib) / 1024, stderr


@pytest.mark.parametrize("source, named", [
    ("{cli} /dev/zero", "line 1: longer than 16777216 bytes"),
    ("yes '{{}}' | {cli} -", "line 1: ev: missing"),
    ("yes x | tr -d '\\n' | head -c 1000000000 | {cli} -", "line 1: longer than 16777216 bytes"),
    ("head -c 268435456 /dev/zero | tr '\\0' '\\n' | {cli} -", "line 65537: more than 65536 blank lines"),
], ids=["dev-zero", "endless-braces", "one-1GB-line", "256MB-of-newlines"])
def test_pathological_input_exits_2_with_one_line_within_10_s_in_200_MB(source, named):
    code, seconds, peak_mb, stderr = measured(source.format(cli=" ".join(CLI)))
    assert code == 2 and stderr.count("\n") == 1 and named in stderr, stderr
    assert seconds < 10 and peak_mb <= 200, (seconds, peak_mb)


def test_the_three_line_trace_of_a_huge_prompt_is_refused_naming_the_bound(tmp_path):
    """Block size 1 and one arrival of 2**24 - 1 tokens: its labels, hits and
    table would be 16 Mi entries long."""
    config = {**CONFIG, "block_size": 1, "num_blocks": 2**24, "max_model_len": 2**24}
    path = write_trace(tmp_path / "huge.jsonl", [config, arrive("a", 2**24 - 1, 1), {"ev": "end"}])
    code, seconds, peak_mb, stderr = measured(f"{' '.join(CLI)} {path}")
    assert code == 2 and stderr.count("\n") == 1 and seconds < 10 and peak_mb <= 200
    assert f"line 2: arrive event: prompt_len: 16777215 tokens make 16777215 full blocks of 1; the checker " \
           f"models prompts of at most {MAX_PROMPT_BLOCKS} full blocks" in stderr
    # with its token ids the line is 32 MB: refused by the line bound
    ids = tmp_path / "huge-ids.jsonl"
    ids.write_text(json.dumps(config) + "\n" + json.dumps({**arrive("a", 2**24 - 1, 1),
                                                           "prompt_token_ids": [1] * (2**24 - 1)}) + "\n")
    code, seconds, peak_mb, stderr = measured(f"{' '.join(CLI)} {ids}")
    assert code == 2 and "line 2: longer than 16777216 bytes" in stderr and seconds < 10 and peak_mb <= 200
