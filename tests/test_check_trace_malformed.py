"""check-trace on input nobody here wrote: every malformed file exits 2 with one
line naming the line and the field, and never exits 1 (a verdict) or 3 (our
bug); an internal error exits 3 with the traceback saved; a huge pool costs
no more than a small one.

The property-based test mutates valid traces the reference writes (types,
values, structure, bytes). Its field table restates docs/trace-format.md
independently of the checker's schema, so a field the checker forgets to
validate shows up here. More examples: the `thorough` profile (tests/conftest.py):

    python -m pytest tests/test_check_trace_malformed.py --hypothesis-profile=thorough
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightcheck.cli import main
from flightcheck.verification.traces import replay as replay_module
from flightcheck.verification.traces import stream as stream_module
from flightcheck.verification.traces.check import MalformedTrace, check_events, read_events, read_trace_file
from flightcheck.verification.traces.schema import MAX_POOL_BLOCKS
from tests.test_check_trace import SCENARIOS, events_of

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared


def run_check_trace(path: Path, *extra: str) -> tuple[int, str, str]:
    """The CLI in-process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["check-trace", str(path), *extra])
    return code, out.getvalue(), err.getvalue()


def write_lines(tmp: Path, lines: list[str]) -> Path:
    path = tmp / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
    return path


def assert_malformed(path: Path, *named: str) -> str:
    code, out, err = run_check_trace(path)
    assert code == 2, (code, out, err)
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    for text in named:
        assert text in err, (text, err)
    return err


# -- valid traces the reference writes -------------------------------------------------

def _valid_traces() -> list[list[dict[str, Any]]]:
    return [events_of(SCENARIOS[name](None)) for name in sorted(SCENARIOS)]


VALID = _valid_traces()

# -- the field table: the format's fields, each with values that are never valid --------

RAW_NAN, RAW_INF, RAW_MINUS_INF, RAW_HUGE_FLOAT = "NaN", "Infinity", "-Infinity", "1e400"
NON_FINITE = [RAW_NAN, RAW_INF, RAW_MINUS_INF, RAW_HUGE_FLOAT]   # written raw into the line
NOT_NUMBER = ["3", True, False, None, [], {}, [1], {"a": 1}]
BAD: dict[str, list[Any]] = {
    "count": [-1, 1.5, 0.5, 10**30, *NOT_NUMBER, *NON_FINITE],
    "positive": [0, -1, 1.5, 10**30, *NOT_NUMBER, *NON_FINITE],
    # An entry's `n`: any integer (vLLM 0.8.x with drafts can schedule fewer
    # than 0 tokens; that is read and rejected as a decision, below).
    "scheduled_tokens": [1.5, 0.5, 10**30, -10**30, *NOT_NUMBER, *NON_FINITE],
    "time": ["0.5", True, None, [], {}, *NON_FINITE],
    "request_id": [0, 7, 1.5, True, None, [], ["r0"], {}, "\ud800", "a\udfffb"],
    "flag": [0, 1, "true", None, [], {}, 1.5],
    "flag_or_null": [0, 1, 1.5, "true", [], [True], {}],
    "token_or_null": [-1, 1.5, "1", True, [], {}, 10**30, *NON_FINITE],
    "token_list": [{}, {"0": 1}, 3, "abc", None, True, [None], [1.5], [-1], ["a"], [True], [[1]],
                   [10**30]],
    "token_list_or_null": [{}, {"0": 1}, 3, "abc", True, [None], [1.5], [-1], ["a"], [True], [[1]]],
    "request_ids": [{}, "r0", 3, None, [3], [None], [True], [["a"]], ["\ud800"]],
    "block_ids": [{}, 3, None, "1", [-1], [1.5], ["a"], [True], [None], [10**30]],
    "token_map": [[], 3, "x", None, True, {"r": 3}, {"r": {}}, {"r": [None]}, {"r": [-1]},
                  {"r": "abc"}, {"r": [1.5]}, {"\ud800": [1]}],
    "count_map": [[], 3, None, "x", {"r": -1}, {"r": 1.5}, {"r": True}, {"r": []}, {"r": None}],
    "batch": [-1, 1.5, "1", True, [], {}, 10**30, *NON_FINITE],
    "entries": [None, {}, 3, "x", [3], [None], [[]], ["x"], [{}]],
    "policy": ["round-robin", 0, None, True, [], ""],
    "release_order": ["backwards", "", 0, None, True, []],
    "reason": ["done", "", 0, None, [], True],
    "stage": [-1, 1.5, "0", True, None, 10**30, *NON_FINITE],
}
FIELDS: dict[str, dict[str, str]] = {
    "config": {"num_stages": "positive", "max_num_batched_tokens": "positive",
               "max_num_seqs": "positive", "block_size": "positive", "num_blocks": "positive",
               "usable_blocks": "positive", "max_model_len": "positive",
               "long_prefill_token_threshold": "count", "num_spec_tokens": "count",
               "prefix_caching": "flag", "policy": "policy", "eos_token_id": "token_or_null",
               "num_preallocate_tokens": "count", "release_order": "release_order",
               "cache_duplicate_blocks": "flag", "step": "count", "engine_step": "count", "t": "time"},
    "arrive": {"req": "request_id", "prompt_len": "count", "max_tokens": "count",
               "prompt_token_ids": "token_list", "eos_token_id": "token_or_null",
               "ignore_eos": "flag", "stop_token_ids": "token_list_or_null",
               "step": "count", "engine_step": "count", "t": "time"},
    "schedule": {"batch": "batch", "entries": "entries", "preempted": "request_ids",
                 "step": "count", "engine_step": "count", "t": "time"},
    "entry": {"req": "request_id", "start": "count", "n": "scheduled_tokens", "cached": "count",
              "drafts": "count", "samples": "flag_or_null", "block_ids": "block_ids"},
    "stage": {"batch": "batch", "stage": "stage", "t0": "time", "t1": "time", "recv": "time"},
    "complete": {"batch": "batch", "tokens": "token_map", "dropped": "request_ids",
                 "next_drafts": "count_map", "step": "count", "engine_step": "count", "t": "time"},
    "finish": {"req": "request_id", "reason": "reason", "step": "count", "engine_step": "count", "t": "time"},
    "abort": {"req": "request_id", "step": "count", "engine_step": "count", "t": "time"},
    "end": {"step": "count", "engine_step": "count", "t": "time"},
}
REQUIRED = {"config": ["num_stages", "max_num_batched_tokens", "block_size", "num_blocks",
                       "max_model_len"],
            "arrive": ["req", "prompt_len", "max_tokens"], "schedule": ["entries"],
            "finish": ["req", "reason"], "abort": ["req"], "entry": ["req", "start", "n"]}

PLACEHOLDER = "@@raw@@"


def encode(event: dict[str, Any], raw: str | None = None) -> str:
    """One JSON line; `raw` replaces the placeholder string (NaN and the like,
    which json.dumps does not write)."""
    line = json.dumps(event)
    return line.replace(json.dumps(PLACEHOLDER), raw) if raw is not None else line


def bad_value(draw: st.DrawFn, kind: str) -> tuple[Any, str | None]:
    value = draw(st.sampled_from(BAD[kind]))
    if isinstance(value, str) and value in NON_FINITE:
        return PLACEHOLDER, value
    return value, None


@st.composite
def malformed_traces(draw: st.DrawFn) -> tuple[list[str], int, list[str]]:
    """(lines, the 1-based line that is wrong, texts the message must contain)."""
    events = [dict(e) for e in draw(st.sampled_from(VALID))]
    index = draw(st.integers(0, len(events) - 1))
    event = events[index]
    kind = event["ev"]
    lines = [json.dumps(e) for e in events]
    line = index + 1
    how = draw(st.sampled_from(["value", "value", "value", "entry", "missing", "not-object",
                                "bad-ev", "truncated", "second-config", "bytes"]))
    if how == "entry" and kind == "schedule" and event["entries"]:
        j = draw(st.integers(0, len(event["entries"]) - 1))
        entries = [dict(x) for x in event["entries"]]
        name = draw(st.sampled_from(sorted(FIELDS["entry"])))
        entries[j][name], raw = bad_value(draw, FIELDS["entry"][name])
        lines[index] = encode({**event, "entries": entries}, raw)
        return lines, line, [f"line {line}:", f"entries[{j}].{name}"]
    if how == "missing" and kind in REQUIRED:
        if kind == "schedule" and event["entries"] and draw(st.booleans()):
            j = draw(st.integers(0, len(event["entries"]) - 1))
            name = draw(st.sampled_from(REQUIRED["entry"]))
            entries = [dict(x) for x in event["entries"]]
            del entries[j][name]
            lines[index] = encode({**event, "entries": entries})
            return lines, line, [f"line {line}:", f"entries[{j}].{name}", "missing"]
        name = draw(st.sampled_from(REQUIRED[kind]))
        lines[index] = encode({k: v for k, v in event.items() if k != name})
        return lines, line, [f"line {line}:", name, "missing"]
    if how == "not-object":
        lines[index] = json.dumps(draw(st.sampled_from([[1, 2], "config", 3, None, True, [event]])))
        return lines, line, [f"line {line}:", "expected an event"]
    if how == "bad-ev":
        lines[index] = encode({**event, "ev": draw(st.sampled_from(["teleport", "", 1, None, ["arrive"]]))})
        return lines, line, [f"line {line}:", "ev"]
    if how == "truncated":
        cut = draw(st.integers(1, len(lines[index]) - 1))
        lines[index] = lines[index][:cut]
        return lines, line, [f"line {line}:", "not JSON"]
    if how == "second-config":
        at = draw(st.integers(1, len(events)))
        lines.insert(at, lines[0])
        return lines, at + 1, [f"line {at + 1}:", "second config"]
    if how == "bytes":
        lines[index] = lines[index][:-1] + "\udcff}"           # a lone 0xFF byte: not UTF-8
        return lines, line, [f"line {line}:", "UTF-8"]
    # "value" (and the cases above when the event has nothing of their kind)
    name = draw(st.sampled_from(sorted(FIELDS[kind])))
    value, raw = bad_value(draw, FIELDS[kind][name])
    lines[index] = encode({**event, name: value}, raw)
    return lines, line, [f"line {line}:", name]


def write_raw(path: Path, lines: list[str]) -> None:
    """Lines as UTF-8, with surrogate escapes standing for raw (invalid) bytes."""
    path.write_bytes(("\n".join(lines) + "\n").encode("utf-8", errors="surrogateescape"))


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=malformed_traces())
def test_every_malformed_trace_exits_2_naming_the_line_and_the_field(tmp_path, case):
    lines, line, named = case
    path = tmp_path / "mutant.jsonl"
    write_raw(path, lines)
    assert_malformed(path, *named)


# -- one regression test per class the issue lists ----------------------------------------

def valid_lines() -> list[str]:
    return [json.dumps(e) for e in VALID[0]]


def with_field(lines: list[str], index: int, name: str, value: Any, raw: str | None = None) -> list[str]:
    event = json.loads(lines[index])
    out = list(lines)
    out[index] = encode({**event, name: value}, raw)
    return out


def index_of(lines: list[str], kind: str) -> int:
    return next(i for i, text in enumerate(lines) if json.loads(text)["ev"] == kind)


@pytest.mark.parametrize("value,raw", [("12", None), (12.0, None), (-1, None), (10**30, None),
                                       (PLACEHOLDER, RAW_NAN), (PLACEHOLDER, RAW_INF),
                                       (PLACEHOLDER, RAW_MINUS_INF), (None, None), ([12], None),
                                       ({"n": 12}, None), (True, None)])
def test_a_prompt_len_of_the_wrong_type_or_range_is_malformed(tmp_path, value, raw):
    lines = valid_lines()
    i = index_of(lines, "arrive")
    assert_malformed(write_lines(tmp_path, with_field(lines, i, "prompt_len", value, raw)),
                     f"line {i + 1}:", "prompt_len", "expected an integer")


@pytest.mark.parametrize("name,value", [("num_stages", 0), ("num_stages", -2), ("num_stages", 10**6),
                                        ("max_model_len", 0), ("block_size", "16"),
                                        ("num_blocks", 10**30), ("max_num_seqs", 2.5),
                                        ("max_num_batched_tokens", True), ("num_spec_tokens", 0.5),
                                        ("prefix_caching", "yes"), ("num_preallocate_tokens", -1),
                                        ("release_order", "sideways"), ("cache_duplicate_blocks", 1)])
def test_a_config_value_out_of_range_or_of_the_wrong_type_is_malformed(tmp_path, name, value):
    assert_malformed(write_lines(tmp_path, with_field(valid_lines(), 0, name, value)), "line 1:", name)


@pytest.mark.parametrize("ev", [None, 3, ["arrive"], {"kind": "arrive"}])
def test_a_non_string_event_kind_is_malformed(tmp_path, ev):
    lines = valid_lines()
    assert_malformed(write_lines(tmp_path, with_field(lines, 1, "ev", ev)), "line 2:", "ev")


def test_a_binary_file_exits_2_with_one_line(tmp_path):
    """check-trace reads line by line: the first line that is not an event
    is named, a bad byte by its offset in the file."""
    path = tmp_path / "binary.jsonl"
    path.write_bytes(bytes(range(256)) * 4)          # byte 10 ends line 1; byte 128 is on line 2
    assert_malformed(path, "line 1:", "not JSON")
    path.write_bytes(b"\n" + bytes(range(11, 256)) * 4)   # line 1 blank; byte 118 (128) is on line 2
    assert_malformed(path, "line 2:", "UTF-8", "byte 118")
    with pytest.raises(MalformedTrace, match="line 2: not UTF-8 text .byte 118"):
        read_trace_file(path)                        # the whole file: its decoder says the same


def test_latin1_text_names_the_line_of_the_first_bad_byte(tmp_path):
    lines = valid_lines()
    path = tmp_path / "latin1.jsonl"
    event = json.loads(lines[1])
    lines[1] = json.dumps({**event, "req": "café"}, ensure_ascii=False)
    path.write_bytes("\n".join(lines).encode("latin-1"))
    assert_malformed(path, "line 2:", "UTF-8")


@pytest.mark.parametrize("depth", [10_000, 200_000])
def test_deep_nesting_exits_2_with_one_line(tmp_path, depth):
    lines = valid_lines()
    lines.insert(1, '{"ev": "abort", "req": ' + "[" * depth + "]" * depth + "}")
    assert_malformed(write_lines(tmp_path, lines), "line 2")


@pytest.mark.parametrize("req", [0, 1.5, None, ["r"], {"id": "r"}, True])
def test_a_non_string_request_id_is_malformed(tmp_path, req):
    lines = valid_lines()
    i = index_of(lines, "arrive")
    assert_malformed(write_lines(tmp_path, with_field(lines, i, "req", req)), f"line {i + 1}:", "req")


def test_a_lone_surrogate_request_id_is_malformed_and_printed_escaped():
    # through a real process with a strict UTF-8 stderr, where printing it raw would crash
    lines = valid_lines()
    i = index_of(lines, "arrive")
    text = "\n".join(with_field(lines, i, "req", "r\ud800")) + "\n"
    proc = subprocess.run([sys.executable, "-m", "flightcheck.cli", "check-trace", "/dev/stdin"],
                          input=text.encode("ascii"), capture_output=True, timeout=60,
                          env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"})
    err = proc.stderr.decode("utf-8")
    assert proc.returncode == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"line {i + 1}:" in err and "req" in err and "\\ud800" in err


@pytest.mark.parametrize("tokens", [{"0": 5}, {"0": {"a": 1}}, 7, [[1]], "abc"])
def test_a_token_list_that_is_not_a_list_is_malformed(tmp_path, tokens):
    lines = valid_lines()
    i = index_of(lines, "complete")
    assert_malformed(write_lines(tmp_path, with_field(lines, i, "tokens", tokens)), f"line {i + 1}:", "tokens")


def test_prompt_token_ids_given_as_an_object_are_malformed(tmp_path):
    lines = valid_lines()
    i = index_of(lines, "arrive")
    assert_malformed(write_lines(tmp_path, with_field(lines, i, "prompt_token_ids", {"0": 1})),
                     f"line {i + 1}:", "prompt_token_ids")


@pytest.mark.parametrize("name,value", [("samples", 1), ("samples", 0.0), ("samples", [True]),
                                        ("drafts", True), ("drafts", [1]), ("drafts", 0.5),
                                        ("start", "0"), ("n", None), ("cached", -1)])
def test_a_schedule_entry_field_of_the_wrong_type_is_malformed(tmp_path, name, value):
    lines = valid_lines()
    i = index_of(lines, "schedule")
    event = json.loads(lines[i])
    event["entries"][0][name] = value
    lines[i] = json.dumps(event)
    assert_malformed(write_lines(tmp_path, lines), f"line {i + 1}:", f"entries[0].{name}")


def test_a_negative_token_count_is_read_and_rejected_as_a_decision_not_as_malformed(tmp_path):
    """vLLM 0.8.x with speculative decoding can schedule -2 tokens
    (flightcheck/vllm/README.md, "Speculative decoding"); its recorder writes
    what vLLM did, and check-trace rejects that schedule, naming it."""
    lines = valid_lines()
    i = index_of(lines, "schedule")
    event = json.loads(lines[i])
    event["entries"][0]["n"] = -2
    lines[i] = json.dumps(event)
    verdict = check_events(read_events(lines))
    assert not verdict.ok and verdict.event_index == i, verdict.to_json()
    assert "-2" in verdict.message


@pytest.mark.parametrize("raw", [RAW_NAN, "null", RAW_INF, "1.0", "-3", '"7"'])
def test_a_token_id_that_is_nan_or_null_is_malformed(tmp_path, raw):
    lines = valid_lines()
    i = next(i for i, text in enumerate(lines)
             if json.loads(text)["ev"] == "complete" and any(json.loads(text)["tokens"].values()))
    event = json.loads(lines[i])
    name = next(name for name, ids in event["tokens"].items() if ids)
    event["tokens"][name] = [PLACEHOLDER]
    lines[i] = encode(event, raw)
    assert_malformed(write_lines(tmp_path, lines), f"line {i + 1}:", "tokens")


def test_an_integer_too_long_to_convert_is_malformed(tmp_path):
    lines = valid_lines()
    lines[1] = lines[1][:-1] + ', "prompt_len": ' + "9" * 5000 + "}"
    assert_malformed(write_lines(tmp_path, lines), "line 2:")


@pytest.mark.parametrize("num_blocks", [10**6, 10**7])
def test_a_huge_pool_checks_as_fast_as_a_small_one(tmp_path, num_blocks):
    lines = with_field(valid_lines(), 0, "num_blocks", num_blocks)
    path = write_lines(tmp_path, lines)
    t0 = time.perf_counter()
    code, out, err = run_check_trace(path)
    assert time.perf_counter() - t0 < 2.0
    assert code == 0 and "legal" in out, err


def test_a_pool_the_trace_could_really_fill_beyond_the_limit_is_refused_naming_it(tmp_path):
    config = {"ev": "config", "num_stages": 1, "max_num_batched_tokens": 8, "block_size": 1,
              "num_blocks": 10**7, "max_model_len": 2**20}
    arrive = {"ev": "arrive", "req": "a", "prompt_len": 4, "max_tokens": 2**20}
    path = write_lines(tmp_path, [json.dumps(config), json.dumps(arrive)])
    t0 = time.perf_counter()
    # check-trace streams: it refuses at the arrival that makes the pool too large
    assert_malformed(path, "line 2: arrive event:", "num_blocks", str(MAX_POOL_BLOCKS))
    assert time.perf_counter() - t0 < 2.0
    with pytest.raises(MalformedTrace, match=f"line 1: config event: num_blocks: .* {MAX_POOL_BLOCKS} blocks"):
        check_events(read_events(path.read_text().split("\n")))     # the whole trace: at its config


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_cut_pool_gives_the_full_pools_verdict(name, monkeypatch):
    """Every reference trace, correct and mutant, in a pool larger than it can
    fill: the same verdict, property and event index with the pool cut as with
    the whole pool modelled."""
    for mutant in (None, name):
        events = events_of(SCENARIOS[name](mutant))
        events[0]["num_blocks"] = events[0].get("usable_blocks", events[0]["num_blocks"]) + 3_000
        events[0].pop("usable_blocks", None)
        cut = check_events([dict(e) for e in events])
        with monkeypatch.context() as patch:
            patch.setattr(replay_module, "modelled_pool", lambda cfg, _events: cfg)
            full = check_events([dict(e) for e in events])
        assert (cut.ok, cut.property, cut.event_index, cut.message) == \
               (full.ok, full.property, full.event_index, full.message)


# -- our own bugs: exit 3, never a verdict -----------------------------------------------

def test_an_unexpected_exception_exits_3_with_the_traceback_saved(tmp_path, monkeypatch):
    def broken(lines: Any, profile: Any = None, **options: Any) -> None:
        raise KeyError("a bug of ours")

    monkeypatch.setattr(stream_module, "check_lines", broken)
    code, out, err = run_check_trace(write_lines(tmp_path, valid_lines()))
    assert code == 3 and out == ""
    assert err.count("\n") == 1 and "internal error" in err and "KeyError" in err
    saved = Path(err.rsplit("traceback saved to ", 1)[1].strip())
    try:
        assert "Traceback" in saved.read_text() and "a bug of ours" in saved.read_text()
    finally:
        saved.unlink()


def test_an_unexpected_exception_with_json_prints_one_object(tmp_path, monkeypatch):
    monkeypatch.setattr(stream_module, "check_lines", lambda lines, profile=None, **options: 1 / 0)
    code, out, err = run_check_trace(write_lines(tmp_path, valid_lines()), "--json")
    assert code == 3 and json.loads(out)["ok"] is False and "internal_error" in json.loads(out)
    Path(err.rsplit("traceback saved to ", 1)[1].strip()).unlink()


def test_read_events_and_check_events_refuse_malformed_events_directly():
    with pytest.raises(MalformedTrace, match="line 1: .*num_stages"):
        read_events([json.dumps({**VALID[0][0], "num_stages": "2"})])
    # a plain list of events reads as a file of one event per line: event 1 is line 2
    with pytest.raises(MalformedTrace, match="^line 2: abort event: req: expected a request id"):
        check_events([VALID[0][0], {"ev": "abort", "req": 3}])


def test_a_well_formed_prompt_the_spec_refuses_is_a_violation_not_malformed(tmp_path):
    config = {"ev": "config", "num_stages": 1, "max_num_batched_tokens": 8, "block_size": 2,
              "num_blocks": 8, "max_model_len": 16}
    arrive = {"ev": "arrive", "req": "a", "prompt_len": 16, "max_tokens": 1}    # = max_model_len
    code, out, err = run_check_trace(write_lines(tmp_path, [json.dumps(config), json.dumps(arrive)]))
    assert code == 1 and "line 2 (arrive event) violates" in out, (code, out, err)
