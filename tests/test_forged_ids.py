"""No input can forge a line of check-trace's output or move the cursor.

Request ids, version strings and event kinds come from the trace, and the
trace may come from anyone: every one of them is printed escaped (ASCII,
control characters as Python writes them) and shortened (a quoted id to 40
characters, a whole message line to MESSAGE_LIMIT). Each template below puts
a drawn name where a message quotes it; the output must keep its shape (the
same number of lines) whatever the name holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightcheck.cli import main
from flightcheck.verification.traces.schema import MESSAGE_LIMIT, one_line

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

CONFIG = {"ev": "config", "num_stages": 3, "max_num_batched_tokens": 8, "block_size": 4, "num_blocks": 16,
          "max_model_len": 64, "eos_token_id": 0}
FORGED = "a\nrun.jsonl: legal (9 events, profile vllm-0.8.5)\x1b[2A\x1b]0;title\x07\r"


def arrive(req: str, prompt_len: int = 10) -> dict:
    return {"ev": "arrive", "req": req, "prompt_len": prompt_len, "max_tokens": 2}


def schedule(number: int, req: str, start: int, n: int) -> dict:
    return {"ev": "schedule", "batch": number, "entries": [{"req": req, "start": start, "n": n}]}


# (what the name is, the events after the config, the exit code, lines on stdout)
TEMPLATES = {
    "a schedule the spec would not form": (lambda r: [arrive(r), schedule(1, r, 0, 8), schedule(2, r, 8, 1)], 1, 3),
    "an id that arrives twice": (lambda r: [arrive(r), arrive(r)], 1, 3),
    "a finish the spec does not make": (
        lambda r: [arrive(r, 1), schedule(1, r, 0, 1), {"ev": "finish", "req": r, "reason": "stop"}], 1, 3),
    "a request that never arrived": (lambda r: [arrive("b"), schedule(1, r, 0, 8)], 1, 3),
    "an unknown event kind": (lambda r: [{"ev": r}], 2, 0),
    "an unknown vLLM version": (lambda r: [], 2, 0),
}


def trace_with(name: str, template: str) -> list[dict]:
    events, _, _ = TEMPLATES[template]
    config = {**CONFIG, "vllm_version": name} if template == "an unknown vLLM version" else CONFIG
    return [config, *events(name)]


def run_check(tmp_path: Path, events: list[dict], capsys, *options: str) -> tuple[int, str, str]:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    code = main(["check-trace", str(path), *options])
    out, err = capsys.readouterr()
    return code, out, err


def assert_printable(text: str) -> None:
    for line in text.splitlines():
        assert all(" " <= c <= "~" for c in line), repr(line[:200])
        assert len(line) <= MESSAGE_LIMIT + 400, len(line)


@pytest.mark.parametrize("template", TEMPLATES)
def test_a_forged_id_neither_adds_a_line_nor_moves_the_cursor(tmp_path, capsys, template):
    code, out, err = run_check(tmp_path, trace_with(FORGED, template), capsys)
    _, expected_code, stdout_lines = TEMPLATES[template]
    assert code == expected_code, (out, err)
    assert_printable(out + err)
    judged = [line for line in out.splitlines() if not line.startswith("not checked: ")]
    assert len(judged) == stdout_lines, out
    assert "run.jsonl: legal" not in "\n".join(line.split(": ", 1)[0] for line in judged)
    if expected_code == 2:
        assert err.count("\n") == 1 and err.startswith("flightcheck: error: "), err


@pytest.mark.parametrize("template", TEMPLATES)
def test_a_100k_character_id_gives_a_short_message(tmp_path, capsys, template):
    code, out, err = run_check(tmp_path, trace_with("x" * 100_000, template), capsys)
    assert len(out) + len(err) < 5_000, (len(out), len(err))


NAMES = st.text(st.characters(codec="utf-8"), min_size=1, max_size=300)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=NAMES, template=st.sampled_from(sorted(TEMPLATES)))
def test_no_drawn_name_changes_the_shape_of_the_output(tmp_path, capsys, name, template):
    code, out, err = run_check(tmp_path, trace_with(name, template), capsys)
    assert code in (0, 1, 2)
    assert_printable(out + err)
    assert err.count("\n") <= 1


def test_one_line_escapes_what_a_terminal_would_act_on_and_cuts_the_rest():
    assert one_line("a\nb\x1b[2A\u2028\x00é") == "a\\nb\\x1b[2A\\u2028\\x00\\xe9"
    cut = one_line("y" * 5000, limit=100)
    assert cut.startswith("y" * 100) and cut.endswith("... (4900 more characters)")
