"""check-trace on input a user may feed it by mistake, made from a kept vLLM
trace: a last line a crashed writer cut short (named as such, and the
events before it still checked and counted, not lost), a compressed file
(named, with the command that reads it), an empty file, a trace of a vLLM
version no profile covers. Each exits 2 with one line on stderr."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from flightcheck.cli import main
from flightcheck.verification.traces.check import MalformedTrace, read_trace_file
from flightcheck.verification.traces.stream import Verdict

from .vllm_support import DATA

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

KEPT = DATA / "hunt395" / "034_sync_padded_admission_past_a_hit_behind_parked_blocks_seed372_85.jsonl"


def _check(path: Path, *extra: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["check-trace", str(path), *extra])
    return code, out.getvalue(), err.getvalue()


def _one_error_line(path: Path) -> str:
    code, out, err = _check(path)
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, (code, out, err)
    return err


def test_the_kept_trace_is_legal_as_kept() -> None:
    code, out, _ = _check(KEPT)
    assert code == 0 and "legal (45 events" in out, out


def test_a_last_line_cut_short_is_named_and_the_events_before_it_are_counted(tmp_path: Path) -> None:
    data = KEPT.read_bytes()
    assert data.count(b"\n") == 45 and data.endswith(b"\n")
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(data[:-40])                       # line 45 (the end event) loses its tail and newline
    err = _one_error_line(cut)
    assert "line 45: not JSON" in err and "no newline ends it: a write cut short" in err, err
    assert "the 44 events before it break no property checked so far" in err, err
    code, out, _ = _check(cut, "--json")
    assert code == 2 and json.loads(out)["events_checked_before"] == 44


def test_a_bad_line_ended_by_its_newline_is_not_called_cut_short(tmp_path: Path) -> None:
    lines = KEPT.read_text().splitlines()
    lines[9] = lines[9][:-5]                          # line 10 broken, the file goes on
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join(lines) + "\n")
    err = _one_error_line(broken)
    assert "line 10: not JSON" in err and "cut short" not in err, err
    assert "the 9 events before it break no property" in err, err


def test_a_last_line_that_is_json_is_not_called_cut_short(tmp_path: Path) -> None:
    events = [json.loads(line) for line in KEPT.read_text().splitlines()]
    array = tmp_path / "array.json"
    array.write_text(json.dumps(events))              # one line, no newline: a JSON array of the events
    err = _one_error_line(array)
    assert "line 1: expected an event (a JSON object), got a list of 45 items" in err and "cut short" not in err


def test_a_pretty_printed_file_is_told_a_trace_is_one_event_per_line(tmp_path: Path) -> None:
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps(json.loads(KEPT.read_text().splitlines()[0]), indent=1) + "\n")
    err = _one_error_line(pretty)
    assert "line 1: not JSON" in err and "a trace is JSON Lines, one event per line" in err, err
    with pytest.raises(MalformedTrace, match="one event per line"):
        read_trace_file(pretty)


def test_a_report_names_violations_already_reported_and_events_not_yet_checked() -> None:
    kept_going = Verdict(True, None, malformed="line 9: not JSON", violations=2, read_before=8, checked_before=8)
    assert kept_going.malformed_report() == "line 9: not JSON; 2 violations reported in the events before it"
    held = Verdict(True, None, malformed="line 7: not JSON", read_before=6, checked_before=4, cut_short=True)
    assert held.malformed_report() == ("line 7: not JSON; it is the last line and no newline ends it: a write "
                                       "cut short; the 4 events before it break no property checked so far "
                                       "(2 more read, not yet checked)")


@pytest.mark.parametrize("name, compress, reader", [
    ("gzip", gzip.compress, "zcat"), ("bzip2", bz2.compress, "bzcat"), ("xz", lzma.compress, "xzcat")])
def test_a_compressed_trace_is_named_with_the_command_that_reads_it(tmp_path: Path, name, compress,
                                                                    reader) -> None:
    packed = tmp_path / f"trace.{name}"
    packed.write_bytes(compress(KEPT.read_bytes()))
    err = _one_error_line(packed)
    assert f"line 1: {name}-compressed data" in err and f"{reader} FILE | flightcheck check-trace -" in err, err
    with pytest.raises(MalformedTrace, match=f"{name}-compressed"):
        read_trace_file(packed)


def test_zstd_is_named_by_its_magic_bytes(tmp_path: Path) -> None:
    packed = tmp_path / "trace.zst"
    packed.write_bytes(b"\x28\xb5\x2f\xfd\x04\x58\xff\xfe\n{}\n")
    assert "zstd-compressed data" in _one_error_line(packed)


def test_text_that_only_starts_as_bzip2_is_read_as_text(tmp_path: Path) -> None:
    text = tmp_path / "bzh.jsonl"
    text.write_text("BZh not a trace\n")
    err = _one_error_line(text)
    assert "line 1: not JSON" in err and "compressed" not in err, err


def test_an_empty_file_and_blank_lines_say_the_trace_is_empty(tmp_path: Path) -> None:
    for content in ("", "\n\n  \n"):
        empty = tmp_path / "empty.jsonl"
        empty.write_text(content)
        assert "the trace is empty (the first event must be 'config')" in _one_error_line(empty)


def test_a_version_no_profile_covers_is_named_with_the_profiles_to_choose_from(tmp_path: Path) -> None:
    lines = KEPT.read_text().splitlines()
    config = json.loads(lines[0])
    assert config["vllm_version"] == "0.34.0"
    lines[0] = json.dumps(config | {"vllm_version": "0.99.1"})
    unknown = tmp_path / "unknown.jsonl"
    unknown.write_text("\n".join(lines) + "\n")
    err = _one_error_line(unknown)
    assert 'no profile covers vLLM "0.99.1"' in err and "vllm-0.34" in err and "--profile" in err, err
    code, out, _ = _check(unknown, "--profile", "vllm-0.34")
    assert code == 0 and "legal (45 events, profile vllm-0.34)" in out, out


def test_several_files_report_a_cut_file_as_one_does(tmp_path: Path, capsys) -> None:
    (tmp_path / "a_kept.jsonl").write_bytes(KEPT.read_bytes())
    (tmp_path / "b_cut.jsonl").write_bytes(KEPT.read_bytes()[:-40])
    assert main(["check-trace", str(tmp_path), "--jobs", "1", "--json"]) == 2
    rows = {Path(row["file"]).name: row for row in json.loads(capsys.readouterr().out)["traces"]}
    assert rows["a_kept.jsonl"]["exit"] == 0
    assert "a write cut short; the 44 events before it" in rows["b_cut.jsonl"]["malformed"]
