"""`flightcheck check-trace` given several traces or a directory
(flightcheck/commands/check_trace_many.py): each trace a task of the executor,
each verdict the one-file check's, in the order named; the worst exit wins;
what it refuses, in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from flightcheck.cli import main

pytestmark = pytest.mark.usefixtures("both_checkers")   # runs check-trace: both checkers compared

KV_TRACES = Path(__file__).parent / "data" / "kv"
LEGAL = KV_TRACES / "accepted_sync_async_send.jsonl"
VIOLATED = KV_TRACES / "rejected_loading_scheduled.jsonl"


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    """A directory: a legal trace, a violated one, a file that is no trace,
    and a file the directory scan leaves out (not .jsonl)."""
    shutil.copy(VIOLATED, tmp_path / "b_violated.jsonl")
    shutil.copy(LEGAL, tmp_path / "a_legal.jsonl")
    (tmp_path / "c_not_a_trace.jsonl").write_text("{}\n")
    (tmp_path / "notes.txt").write_text("not a trace, not looked at\n")
    return tmp_path


def _json(capsys, *argv: str) -> tuple[int, dict]:
    code = main(["check-trace", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def _one(capsys, path: Path) -> tuple[int, dict]:
    return _json(capsys, str(path))


def test_a_directory_is_its_jsonl_traces_by_name_each_the_one_file_verdict(capsys, traces):
    code, report = _json(capsys, str(traces), "--jobs", "2")
    assert code == 2                                       # a file that is no trace wins over a violation
    names = [Path(row["file"]).name for row in report["traces"]]
    assert names == ["a_legal.jsonl", "b_violated.jsonl", "c_not_a_trace.jsonl"]
    assert (report["executor"], report["tasks"], report["retried"]) == ("local", 3, 0)
    assert report["legal"] == 1 and [Path(f).name for f in report["violated"]] == ["b_violated.jsonl"]
    assert [Path(f).name for f in report["malformed"]] == ["c_not_a_trace.jsonl"]
    for row, path in zip(report["traces"][:2], (LEGAL, VIOLATED)):
        exit_alone, alone = _one(capsys, path)
        assert (row["exit"], row["result"]) == (exit_alone, alone)
    assert report["traces"][2]["malformed"].startswith("line 1: ev: missing")


def test_files_in_the_order_named_and_the_exit_of_the_worst(capsys):
    code, report = _json(capsys, str(VIOLATED), str(LEGAL), "--jobs", "1")
    assert code == 1
    assert [row["file"] for row in report["traces"]] == [str(VIOLATED), str(LEGAL)]
    assert [row["exit"] for row in report["traces"]] == [1, 0]
    code, report = _json(capsys, str(LEGAL), str(LEGAL), "--jobs", "1")
    assert code == 0 and report["legal"] == 2


def test_the_text_report_words_each_verdict_as_the_one_file_check(capsys, traces):
    assert main(["check-trace", str(traces / "b_violated.jsonl"), str(traces / "a_legal.jsonl"), "--jobs", "1"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{traces / 'b_violated.jsonl'}: line 4 (schedule event) violates KV2_loading_not_scheduled")
    assert out[1].startswith("state before line 4: ") and out[2] == "profile: vllm-0.34"
    assert out[3].startswith(f"{traces / 'a_legal.jsonl'}: legal (13 events, profile vllm-0.34)")
    assert out[-1].startswith("2 traces on the local executor in ") and out[-1].endswith(
        "1 legal, 1 with a violation, 0 not a trace")


@pytest.mark.parametrize("argv, line", [
    (["-", "X"], "standard input (-) is checked alone: name files or directories to check several"),
    (["X", "Y", "--follow"], "--follow watches one growing file: name one file"),
    (["NOWHERE", "X"], "NOWHERE: no such file or directory"),
    (["ONE", "--executor", "ray"], "--executor and --ray-address run several traces: one trace is checked here"),
    (["A", "B", "--ray-address", "auto"], "--ray-address needs --executor ray"),
])
def test_what_it_refuses_is_one_line_and_exit_2(capsys, tmp_path, monkeypatch, argv, line):
    monkeypatch.chdir(tmp_path)
    for name in ("X", "Y", "ONE", "A", "B"):
        (tmp_path / name).write_text("")
    assert main(["check-trace", *argv]) == 2
    assert capsys.readouterr().err.strip() == f"flightcheck: error: {line}"


def test_a_directory_without_traces_is_refused(capsys, tmp_path):
    (tmp_path / "notes.txt").write_text("x\n")
    assert main(["check-trace", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"flightcheck: error: {tmp_path}: a directory with no .jsonl trace in it"
