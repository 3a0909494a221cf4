"""The KV connector's part of the trace format (docs/trace-format.md, "KV
connector"): every new field and event is schema-checked, so a malformed one
exits 2 with one line naming the line and the field, and a KV event or field
in a trace whose config has no `kv_connector` is malformed too."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from flightcheck.cli import main
from flightcheck.verification.traces.check import MalformedTrace, read_events

pytestmark = pytest.mark.usefixtures("both_checkers")   # reads traces: both checkers compared

CONNECTOR = {"consumer": True, "producer": True, "load_failure_policy": "recompute", "max_inflight_loads": 2}


def config(**keys: Any) -> dict[str, Any]:
    base = {"ev": "config", "num_stages": 1, "max_num_batched_tokens": 16, "block_size": 4, "num_blocks": 16,
            "max_model_len": 64, "eos_token_id": 0, "vllm_version": "0.34.0", "kv_connector": CONNECTOR}
    return base | keys


def lines(*events: dict[str, Any]) -> list[str]:
    return [json.dumps(e) for e in events]


def malformed(text_lines: list[str]) -> str:
    """The one-line message read_events refuses these lines with."""
    with pytest.raises(MalformedTrace) as err:
        read_events(text_lines)
    message = str(err.value)
    assert "\n" not in message
    return message


ARRIVE = {"ev": "arrive", "req": "a", "prompt_len": 8, "max_tokens": 1}


def test_every_kv_field_and_event_is_well_formed_with_a_connector():
    events = read_events(lines(
        config(),
        ARRIVE | {"external_hit": 4, "load_async": True},
        {"ev": "schedule", "batch": None, "entries": [], "kv_loads": [{"req": "a", "start": 4}]},
        {"ev": "kv_failed", "req": "a", "from_block": 0, "computed": 0, "placeholders": 0},
        {"ev": "kv_received", "req": "a"},
        {"ev": "schedule", "batch": 1, "entries": [{"req": "a", "start": 0, "n": 8, "external": 0}]},
        {"ev": "finish", "req": "a", "reason": "error", "held": True},
        {"ev": "kv_sent", "req": "a"}))
    assert len(events) == 8


def test_a_null_kv_connector_is_no_connector():
    assert len(read_events(lines(config(kv_connector=None), ARRIVE))) == 2


@pytest.mark.parametrize("event, field", [
    ({"ev": "kv_received", "req": "a"}, "ev"),
    ({"ev": "kv_failed", "req": "a", "from_block": 0}, "ev"),
    ({"ev": "kv_sent", "req": "a"}, "ev"),
    (ARRIVE | {"external_hit": 0}, "external_hit"),
    (ARRIVE | {"load_async": False}, "load_async"),
    ({"ev": "schedule", "entries": [], "kv_loads": []}, "kv_loads"),
    ({"ev": "schedule", "entries": [{"req": "a", "start": 0, "n": 8, "external": 0}]}, "entries[0].external"),
    ({"ev": "finish", "req": "a", "reason": "stop", "held": False}, "held"),
    ({"ev": "finish", "req": "a", "reason": "error"}, "reason"),
])
def test_a_kv_event_or_field_without_a_connector_is_malformed(event, field):
    message = malformed(lines(config(kv_connector=None), ARRIVE, event))
    assert message.startswith(f"line 3: {event['ev']} event: {field}: expected no KV connector event or field"), \
        message
    without_key = {k: v for k, v in config().items() if k != "kv_connector"}
    assert malformed(lines(without_key, ARRIVE, event)) == message


@pytest.mark.parametrize("connector, field", [
    ({"producer": True}, "kv_connector.consumer: missing"),
    ({"consumer": 1, "producer": True}, "kv_connector.consumer: expected true or false, got 1"),
    ({"consumer": True, "producer": "yes"}, "kv_connector.producer: expected true or false"),
    (CONNECTOR | {"load_failure_policy": "retry"}, 'kv_connector.load_failure_policy: expected one of "recompute"'),
    (CONNECTOR | {"max_inflight_loads": 0}, "kv_connector.max_inflight_loads: expected an integer from 1"),
    (CONNECTOR | {"max_inflight_loads": 1.5}, "kv_connector.max_inflight_loads: expected an integer from 1"),
    (True, "kv_connector: expected an object (the KV connector) or null, got true"),
    ([], "kv_connector: expected an object (the KV connector) or null, got a list of 0 items"),
])
def test_a_malformed_kv_connector_names_its_field(connector, field):
    message = malformed(lines(config(kv_connector=connector)))
    assert message.startswith("line 1: config event: ") and field in message, message


@pytest.mark.parametrize("event, field", [
    (ARRIVE | {"external_hit": -4}, "external_hit: expected an integer from 0"),
    (ARRIVE | {"external_hit": "4"}, "external_hit: expected an integer from 0"),
    (ARRIVE | {"external_hit": 2**31}, "external_hit: expected an integer from 0"),
    (ARRIVE | {"load_async": 1}, "load_async: expected true or false"),
    ({"ev": "schedule", "entries": [], "kv_loads": {}}, "kv_loads: expected a list"),
    ({"ev": "schedule", "entries": [], "kv_loads": ["a"]}, "kv_loads[0]: expected an object (a parked KV load)"),
    ({"ev": "schedule", "entries": [], "kv_loads": [{"req": "a"}]}, "kv_loads[0].start: missing"),
    ({"ev": "schedule", "entries": [], "kv_loads": [{"req": 3, "start": 0}]}, "kv_loads[0].req: expected a request id"),
    ({"ev": "schedule", "entries": [], "kv_loads": [{"req": "a", "start": -1}]}, "kv_loads[0].start: expected"),
    ({"ev": "schedule", "entries": [{"req": "a", "start": 0, "n": 8, "external": True}]},
     "entries[0].external: expected an integer from 0"),
    ({"ev": "kv_received"}, "req: missing"),
    ({"ev": "kv_received", "req": None}, "req: expected a request id"),
    ({"ev": "kv_sent", "req": ["a"]}, "req: expected a request id"),
    ({"ev": "kv_failed", "req": "a"}, "from_block: missing"),
    ({"ev": "kv_failed", "req": "a", "from_block": -1}, "from_block: expected an integer from 0"),
    ({"ev": "kv_failed", "req": "a", "from_block": 0, "computed": 1.0}, "computed: expected an integer from 0"),
    ({"ev": "kv_failed", "req": "a", "from_block": 0, "placeholders": -2}, "placeholders: expected an integer"),
    ({"ev": "finish", "req": "a", "reason": "failed"}, 'reason: expected one of "stop", "length", "abort", "error"'),
    ({"ev": "finish", "req": "a", "reason": "stop", "held": "no"}, "held: expected true or false"),
])
def test_a_malformed_kv_field_names_the_line_and_the_field(event, field):
    message = malformed(lines(config(), ARRIVE, event))
    assert message.startswith(f"line 3: {event['ev']} event: ") and field in message, message


def test_the_cli_exits_2_with_one_line_for_a_kv_event_without_a_connector(tmp_path: Path):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines(config(kv_connector=None), ARRIVE, {"ev": "kv_sent", "req": "a"})) + "\n")
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["check-trace", str(path)])
    assert code == 2 and out.getvalue() == "" and err.getvalue().count("\n") == 1, (code, err.getvalue())
    assert 'line 3: kv_sent event: ev: expected no KV connector event or field' in err.getvalue()
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["check-trace", str(path), "--json"])
    assert code == 2 and "expected no KV connector" in json.loads(out.getvalue())["malformed"]
