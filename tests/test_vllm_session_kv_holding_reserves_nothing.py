"""A streaming session admitted from `kv_holding_waiting` reserves nothing
for a later async load in the same call (campaign `--versions 0.34.0,0.33.0
--all-features --reuse-ids --spec-tokens 3 --workloads 80 --seed 301`,
index 32, 0.33.0 async; kept in tests/data/vllm/hunt300/).

Session r0 waits between turns in `kv_holding_waiting`, holding one block
(4 tokens computed), when its second input (6 tokens) arrives. Batch 11's
waiting loop takes r0 first and admits it to the end of its tokens (4 + 6 =
10), then r3 (a sync load of 4 tokens beside a local hit of 4), then r2,
whose async load of its one token needs one block. vLLM 0.33
`Scheduler.schedule` hands that allocation `reserved_blocks =
_inflight_prefill_reserved_blocks() + _spec_decode_step_blocks`; r0 is not
in `_inflight_prefills` (added at admission only when `num_computed_tokens +
num_new_tokens < num_tokens`, or at a park; 0.34 adds a request also when it
is in `_parked_reservations`, which `_reserve_parked` fills at a park and a
promotion only, never for a session). So vLLM reserved the one step's block
alone, and r2's block fit beside it among the two free: r2 parked (block 3).
The spec counted every request taken from `kv_holding` as a parked load
(`Walk.parked`), so r0's whole sequence with one step past it (4 blocks, 3
held) was reserved too, r2 did not fit, and check-trace rejected the
correct run with `kv_load_decision` at line 34. The spec now marks only
requests holding a parked or landed load (spec/kv_loads.py `next_candidate`,
`_holds_load`); the reference already made vLLM's decisions.
"""

from __future__ import annotations

import pytest

from flightcheck.spec import kv_loads
from flightcheck.verification.traces.check import check_events
from flightcheck.vllm.campaign import check_verdict, verdict
from flightcheck.vllm.differential import compare, decisions, first_difference, profile_for, read_trace, run_reference

from .vllm_support import DATA, KeptCase, replay_kept_case, drawn_before_clients_went_away, workers

pytestmark = pytest.mark.usefixtures("both_checkers")       # judges check-trace's verdict

CASE = KeptCase(DATA / "hunt300" / "033_async_session_admitted_from_kv_holding_reserves_nothing_seed301_32")
STEM = CASE.stem
_raw, _result = CASE.raw, CASE.result
PROFILE = profile_for("0.33.0", True)


def test_vllm_parks_r2_in_the_call_that_admits_the_session_to_its_end() -> None:
    events = read_trace(STEM.with_suffix(".jsonl"))
    batch = next(e for e in events if e["ev"] == "schedule" and e.get("kv_loads"))
    assert batch["batch"] == 11
    assert [(x["req"], x["start"], x["n"]) for x in batch["entries"]] == [("r0", 4, 6), ("r3", 8, 3)]
    assert batch["kv_loads"] == [{"req": "r2", "start": 1, "block_ids": [3]}]
    # r0 is the session, back for its second input: its chunk reaches its tokens
    inputs = [e["num_tokens"] for e in events if e["ev"] == "input" and e["req"] == "r0" and "num_tokens" in e]
    assert inputs[:2] == [1, 6]


def test_check_trace_accepts_the_run_as_the_ground_truth_saw_it() -> None:
    checked = check_events(read_trace(STEM.with_suffix(".jsonl")))
    assert checked.ok, (checked.property, checked.message)
    category, detail = verdict(_result(), check_verdict(STEM.with_suffix(".jsonl")))
    assert category == "accepted, correct run", detail


def test_counting_the_session_as_a_parked_load_rejects_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule this run tells apart: with every request taken from
    `kv_holding` counted as a parked load (the spec before), r2 no longer
    fits and the correct run is rejected where the campaign saw it."""
    pick = kv_loads.next_candidate

    def counting_every_held_request(state, cfg, walk, loads_only):    # type: ignore[no-untyped-def]
        found = pick(state, cfg, walk, loads_only)
        if found is not None and found[1] == "holding":
            walk.parked.add(found[0])
        return found

    monkeypatch.setattr(kv_loads, "next_candidate", counting_every_held_request)
    checked = check_events(read_trace(STEM.with_suffix(".jsonl")))
    assert not checked.ok and checked.property == "kv_load_decision", (checked.property, checked.message)
    assert checked.line == 34 and 'the trace ["r2"@1]' in checked.message, checked.message


def test_the_reference_makes_vllms_decisions_and_the_differential_finds_them_identical() -> None:
    raw, events = _raw(), read_trace(STEM.with_suffix(".jsonl"))
    conforming = run_reference(raw, PROFILE, vllm_outputs=True)
    assert first_difference(decisions(events), decisions(conforming.events, block_offset=1)) is None
    comparison = compare(raw["name"], _result(), events, run_reference(raw, PROFILE), conforming)
    assert comparison.explained and comparison.deviation is None, comparison.describe()


def test_the_kept_workload_is_the_campaigns_index_32() -> None:
    from flightcheck.vllm.campaign import with_async_scheduling

    # drawn before one session in eight lost its end (its own stream): the workload the hunt found
    drawn = drawn_before_clients_went_away(301, 80, reuse_ids=True, spec_tokens=3, features_of="0.33.0")[32]
    assert with_async_scheduling(drawn) == _raw()


@pytest.fixture(scope="module")
def running():
    yield from workers()


@pytest.mark.slow
@pytest.mark.vllm
def test_the_kept_workload_replays_on_vllm_to_an_accepted_correct_run(running, tmp_path) -> None:
    comparison, (category, detail) = replay_kept_case(running["0.33.0"], CASE, PROFILE, tmp_path / "trace.jsonl")
    assert comparison.explained and comparison.deviation is None, comparison.describe()
    assert category == "accepted, correct run", detail
