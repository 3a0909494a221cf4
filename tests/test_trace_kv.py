"""check-trace on traces with a KV connector (docs/trace-format.md, "KV
connector"; issue 36): hand-written traces of each feature accepted, each
seeded scheduler error rejected at its event with the KV property it breaks,
each connector error reported as the connector's (its contract clause), by
both checkers alike; `--json` names the property."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from flightcheck.cli import main
from flightcheck.spec.config import KvConnector
from flightcheck.verification.traces.check import (IncrementalChecker, check_events, check_trace, config_from_event,
                                                  read_trace_file)
from flightcheck.verification.traces.connector import CONTRACT
from flightcheck.verification.traces.explain import why_nothing_scheduled
from flightcheck.verification.traces.replay import TraceChecker

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

DATA = Path(__file__).parent / "data" / "kv"

# file -> (ok, line, property): what each trace is and where it breaks
EXPECTED = {
    # every feature, legal
    "accepted_sync_async_send.jsonl": (True, None, None),      # sync hit, async load, sends after finish
    "accepted_sync_rollback.jsonl": (True, None, None),        # a sync load fails in flight: recompute
    "accepted_fail_policy.jsonl": (True, None, None),          # the fail policy: finish by "error"
    "accepted_fail_policy_after_outputs.jsonl": (True, None, None),   # vLLM's order: after the outputs
    "accepted_abort_during_load.jsonl": (True, None, None),    # blocks held until the aborted load reports
    "accepted_aborted_load_held_true.jsonl": (True, None, None),   # that hold written as `held`: either is read
    "accepted_failed_async_load.jsonl": (True, None, None),    # docs/trace-format.md's example: every KV event
    # a failure reported before the completion of a step that scheduled nothing:
    # E-b judges the step from the state before the report (then nothing to schedule)
    "accepted_rollback_engine_steps.jsonl": (True, None, None),
    "accepted_async_rollback.jsonl": (True, None, None),       # async scheduling: the placeholder given back
    "accepted_fenced_abort.jsonl": (True, None, None),         # K = 2: an aborted request's blocks fenced
    # seeded scheduler errors
    "rejected_loading_scheduled.jsonl": (False, 4, "KV2_loading_not_scheduled"),
    "rejected_parked_start.jsonl": (False, 4, "kv_load_decision"),
    "rejected_rollback_start.jsonl": (False, 6, "KV3_rollback_restores_counters"),
    "rejected_rollback_computed.jsonl": (False, 4, "KV3_rollback_restores_counters"),
    "rejected_parked_rollback_ignored.jsonl": (False, 10, "KV3_rollback_restores_counters"),
    # vLLM #49250: the recompute leaves num_output_placeholders as it was
    "rejected_async_placeholders_pr49250.jsonl": (False, 4, "KV3_rollback_restores_counters"),
    "rejected_freed_under_send.jsonl": (False, 6, "KV1_no_reuse_under_transfer"),
    "rejected_fenced_block_reused.jsonl": (False, 7, "KV1_no_reuse_under_transfer"),
    "rejected_load_limit.jsonl": (False, 5, "KV6_load_limit"),
    "rejected_loaded_starved.jsonl": (False, 9, "KV5_loaded_not_starved"),
    "rejected_fail_policy_reason.jsonl": (False, 5, "finish_decision"),
    # seeded connector errors: the contract's clauses
    "contract_received_twice.jsonl": (False, 9, "C3_report_once"),
    "contract_sent_twice.jsonl": (False, 8, "C3_report_once"),
    "contract_send_never_reported.jsonl": (False, 12, "C3_report_once"),
    "contract_failed_foreign_block.jsonl": (False, 8, "C2_reports_own_blocks"),
    "contract_load_offered_twice.jsonl": (False, 10, "C1_load_promised_once"),
}

ASYNC = {"accepted_async_rollback.jsonl", "rejected_async_placeholders_pr49250.jsonl"}   # vllm-0.34-async


def test_every_kv_trace_in_the_data_is_listed():
    assert {p.name for p in DATA.glob("*.jsonl")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_kv_trace_gets_its_verdict_from_both_checkers(name):
    incremental = check_trace(DATA / name)
    full = check_trace(DATA / name, full=True)
    assert (incremental.ok, incremental.line, incremental.property) == EXPECTED[name], incremental.message
    assert incremental.profile == ("vllm-0.34-async" if name in ASYNC else "vllm-0.34")
    assert incremental.to_json() == full.to_json()         # state_before too: both name requests alike


@pytest.mark.parametrize("name", sorted(n for n in EXPECTED if n.startswith("contract_")))
def test_a_connector_error_is_reported_as_the_connectors(name):
    result = check_trace(DATA / name)
    assert result.property.startswith("C") and result.message.startswith(CONTRACT), result.message


@pytest.mark.parametrize("name", sorted(n for n in EXPECTED if n.startswith("rejected_")))
def test_a_scheduler_error_is_not_blamed_on_the_connector(name):
    result = check_trace(DATA / name)
    assert not result.property.startswith("C") and CONTRACT not in result.message, result.message


def test_the_config_event_gives_the_spec_its_connector():
    event = read_trace_file(DATA / "accepted_sync_async_send.jsonl")[0]
    assert config_from_event(event).kv_connector == KvConnector(consumer=True, producer=True,
                                                                load_failure_policy="recompute",
                                                                max_inflight_loads=2)
    without = {k: v for k, v in event.items() if k != "kv_connector"}
    assert config_from_event(without).kv_connector is None
    defaults = dict(event, kv_connector={"consumer": True, "producer": False})
    assert config_from_event(defaults).kv_connector == KvConnector(True, False, "fail", None)


def test_the_offer_reaches_the_spec_a_trace_without_it_loads_nothing():
    """Without `external_hit` the same schedule is a wrong decision: the
    arrival's offer is what makes the sync load legal."""
    events = read_trace_file(DATA / "accepted_sync_rollback.jsonl")
    plain = [dict(e) for e in events]
    del plain[1]["external_hit"]
    result = check_events(plain)
    assert (result.ok, result.line, result.property) == (False, 3, "schedule_decision"), result.message
    assert 'the spec schedules ["a"@0+12]' in result.message


def test_held_and_the_rollbacks_counters_are_unchecked_when_the_trace_omits_them():
    events = [dict(e) for e in read_trace_file(DATA / "accepted_sync_async_send.jsonl")]
    for e in events:
        e.pop("held", None)
    result = check_events(events)
    assert result.ok and any("held for a KV send" in u for u in result.unchecked), result.unchecked
    events = [dict(e) for e in read_trace_file(DATA / "accepted_sync_rollback.jsonl")]
    del events[3]["computed"]
    result = check_events(events)
    assert result.ok and any("rollback's counters" in u for u in result.unchecked), result.unchecked


def test_a_finish_held_where_the_spec_frees_is_a_leak():
    events = [dict(e) for e in read_trace_file(DATA / "accepted_sync_rollback.jsonl")]
    events[7] = dict(events[7], held=True)
    result = check_events(events)
    assert (result.ok, result.line, result.property) == (False, 8, "KV4_no_leak"), result.message


def _cli(*args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["check-trace", *args])
    return code, out.getvalue()


@pytest.mark.parametrize("name", ["rejected_loading_scheduled.jsonl", "contract_received_twice.jsonl"])
def test_json_names_the_property_and_the_line(name):
    code, out = _cli(str(DATA / name), "--json")
    ok, line, prop = EXPECTED[name]
    result = json.loads(out)
    assert code == 1 and (result["ok"], result["line"], result["property"]) == (ok, line, prop)
    code, out = _cli(str(DATA / name))
    assert code == 1 and f"line {line} " in out and f"violates {prop}:" in out


def test_a_legal_kv_trace_exits_0():
    code, out = _cli(str(DATA / "accepted_sync_async_send.jsonl"))
    assert code == 0 and "legal (13 events, profile vllm-0.34)" in out


def _long_trace(rounds: int) -> list[dict]:
    """Requests one after another, ids reused, alternately a sync hit and an
    async load, each held after it finishes until the next one's batch is
    done: the incremental checker must keep a held request's slot (ids are
    reused only once their request is sent: vLLM keeps a held request's id)."""
    config = {"ev": "config", "num_stages": 1, "max_num_batched_tokens": 16, "block_size": 4, "num_blocks": 8,
              "max_model_len": 64, "eos_token_id": 0, "vllm_version": "0.34.0",
              "kv_connector": {"consumer": True, "producer": True, "load_failure_policy": "recompute"}}
    events: list[dict] = [config]
    held = None
    for i in range(rounds):
        name = f"r{i % 3}"
        if i % 2:
            events += [{"ev": "arrive", "req": name, "prompt_len": 8, "max_tokens": 1, "external_hit": 8,
                        "load_async": True},
                       {"ev": "schedule", "batch": None, "entries": [], "kv_loads": [{"req": name, "start": 8}]},
                       {"ev": "kv_received", "req": name},
                       {"ev": "schedule", "batch": i, "entries": [{"req": name, "start": 7, "n": 1, "cached": 7}]}]
        else:
            events += [{"ev": "arrive", "req": name, "prompt_len": 8, "max_tokens": 1, "external_hit": 4},
                       {"ev": "schedule", "batch": i,
                        "entries": [{"req": name, "start": 4, "n": 4, "cached": 4, "external": 4}]}]
        events += [{"ev": "complete", "batch": i, "tokens": {name: [5]}},
                   {"ev": "finish", "req": name, "reason": "length", "held": True}]
        if held is not None:
            events.append({"ev": "kv_sent", "req": held})
        held = name
    return events + [{"ev": "kv_sent", "req": held}, {"ev": "end"}]


def test_a_long_kv_trace_is_legal_to_both_checkers_and_reuses_slots():
    events = _long_trace(24)
    result = check_events(events)                        # both checkers, compared (the fixture)
    assert result.ok, (result.line, result.property, result.message)
    slots = IncrementalChecker(events).state.requests
    assert len(slots) <= 4 < 24                          # one alive, one held, the margin


def test_a_long_kv_trace_with_a_send_reported_for_a_freed_request_is_rejected_by_both():
    events = _long_trace(12)
    at = max(i for i, e in enumerate(events) if e["ev"] == "kv_sent" and i < len(events) - 3)
    events.insert(at + 1, dict(events[at]))              # the same send reported twice
    result = check_events(events)
    assert (result.ok, result.event_index, result.property) == (False, at + 1, "C3_report_once")


def test_a_request_waiting_for_its_load_is_named_when_the_spec_schedules_nothing():
    events = [dict(e) for e in read_trace_file(DATA / "accepted_abort_during_load.jsonl")]
    events = events[:4] + events[6:8]                    # "a" done, "b"'s load still in flight
    checker = TraceChecker(events)
    for event in events[1:]:
        checker.feed(event)
    why = why_nothing_scheduled(checker.state, checker.cfg, checker._quoted_name)
    assert '"b" waits for its KV load (WAITING_FOR_REMOTE_KVS, load in_flight)' in why, why


def test_the_docs_kv_example_is_the_one_in_the_data():
    page = (Path(__file__).parent.parent / "docs" / "trace-format.md").read_text()
    assert (DATA / "accepted_failed_async_load.jsonl").read_text() in page


@pytest.mark.parametrize("version, verdict", [
    ("0.33.0", (True, None, None)),                                  # 0.33 has every feature this trace uses
    ("0.8.5", (False, 4, "C2_reports_own_blocks")),                  # sync hits, but no load failures
    ("0.8.4", (False, 3, "schedule_decision")),                      # no connector: the offer loads nothing
])
def test_what_a_version_has_decides_the_verdict(version, verdict):
    events = [dict(e) for e in read_trace_file(DATA / "accepted_sync_rollback.jsonl")]
    events[0]["vllm_version"] = version
    result = check_events(events)
    assert (result.ok, result.line, result.property) == verdict, result.message


def test_an_error_finish_waits_for_one_completion_at_most():
    events = [dict(e) for e in read_trace_file(DATA / "accepted_fail_policy_after_outputs.jsonl")]
    events.insert(5, {"ev": "arrive", "req": "z", "prompt_len": 4, "max_tokens": 1})   # not of the update
    result = check_events(events)
    assert (result.ok, result.line, result.property) == (False, 6, "missing_finish"), result.message
