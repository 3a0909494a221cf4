"""Lookahead slots (vLLM 0.33/0.34 `VllmConfig.num_lookahead_tokens`): a
workload's `config.num_lookahead_tokens`, the campaign's `--lookahead`, what
the recorder writes (`num_lookahead_tokens`, `skip_drafts`), and the
fabricated drafter, which proposes nothing after a batch marked
`skip_drafts` (the V2 runner's `execute_model`: K = 0); the spec's and the
reference's rule for them (spec/lookahead.py, reference/batch.py and
`allocate_slots`), against traces vLLM 0.34.0 wrote (tests/data/vllm/lookahead:
workload diff-lookahead-stages1-spec2-7-4, sync and async). The slow tests run
vLLM 0.34.0's scheduler built with a draft-model `SpeculativeConfig`."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from flightcheck.spec import Config
from flightcheck.spec.state import Request, State
from flightcheck.verification.traces.check import MalformedTrace, check_events
from flightcheck.verification.traces.skip_drafts import SkipDrafts, drafts_sure_unused
from flightcheck.vllm import drafter_recording
from flightcheck.vllm import lookahead_workload as lookahead_module
from flightcheck.vllm.differential import decisions, read_trace, run_reference
from flightcheck.vllm.draft_handler import DraftHandler
from flightcheck.vllm.engine import FabricatedModel
from flightcheck.vllm.generate import campaign_workloads
from flightcheck.vllm.lookahead_workload import lookahead_workload, with_lookahead
from flightcheck.vllm.workload import WorkloadError, draft_outcome, workload_from_json

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

KEPT = Path(__file__).resolve().parent / "data" / "vllm" / "lookahead"
CONFIG = {"num_stages": 1, "max_num_batched_tokens": 16, "block_size": 4, "num_blocks": 40, "num_spec_tokens": 2}


def _workload(**config: Any) -> Any:
    return workload_from_json({"seed": 5, "draft_acceptance": 1.0, "config": {**CONFIG, **config},
                               "requests": [{"id": "a", "prompt_len": 10, "max_tokens": 30}]})


def test_lookahead_slots_are_none_by_default_and_k_when_asked():
    assert _workload().config.num_lookahead_tokens == 0
    assert _workload(num_lookahead_tokens=2).config.num_lookahead_tokens == 2


@pytest.mark.parametrize("config, why", [
    ({"num_lookahead_tokens": 1}, "must be 0 or config.num_spec_tokens"),
    ({"num_spec_tokens": 0, "num_lookahead_tokens": 2}, "must be 0 or config.num_spec_tokens"),
    ({"num_lookahead_tokens": 2, "max_num_batched_tokens": 2}, "must be above config.num_lookahead_tokens"),
])
def test_lookahead_slots_no_drafter_gives_are_refused(config: dict[str, Any], why: str):
    with pytest.raises(WorkloadError, match=why):
        _workload(**config)


def test_the_campaigns_lookahead_gives_k_slots_to_workloads_with_drafts_only():
    drawn = campaign_workloads(4, 3, spec_tokens=3)
    plain = {**drawn[0], "config": {**drawn[0]["config"], "num_spec_tokens": 0}}
    assert lookahead_workload(plain) is plain
    changed = with_lookahead(drawn, True)
    assert with_lookahead(drawn, False) is drawn
    for before, after in zip(drawn, changed):
        assert after["config"]["num_lookahead_tokens"] == 3 and "num_lookahead_tokens" not in before["config"]
        assert after["config"]["max_num_batched_tokens"] == max(before["config"]["max_num_batched_tokens"], 4)
        assert after["name"] == before["name"].replace("diff-", "diff-lookahead-", 1)
        assert after["requests"] == before["requests"]
        workload_from_json(after)                                  # a legal workload


def test_the_budget_not_above_k_is_raised_to_k_plus_one():
    raw = {"name": "w", "seed": 1, "config": {**CONFIG, "num_spec_tokens": 4, "max_num_batched_tokens": 4},
           "requests": [{"id": "a", "prompt_len": 3}]}
    changed = lookahead_workload(raw)
    assert changed["config"]["max_num_batched_tokens"] == 5 and raw["config"]["max_num_batched_tokens"] == 4
    assert changed["name"] == "lookahead-w"


def test_the_recorder_writes_lookahead_and_skip_drafts_only_when_vllm_has_them():
    assert drafter_recording.config_fields(SimpleNamespace(num_lookahead_tokens=2)) == {"num_lookahead_tokens": 2}
    assert drafter_recording.config_fields(SimpleNamespace(num_lookahead_tokens=0)) == {}
    assert drafter_recording.config_fields(SimpleNamespace()) == {}          # vLLM 0.8.x: no such attribute
    assert drafter_recording.schedule_fields(SimpleNamespace(skip_drafts=True)) == {"skip_drafts": True}
    assert drafter_recording.schedule_fields(SimpleNamespace(skip_drafts=False)) == {}
    assert drafter_recording.schedule_fields(SimpleNamespace()) == {}


def _decode(skip_drafts: bool) -> SimpleNamespace:
    """r a's decode step at token 10 with 2 drafts (its prompt was computed)."""
    return SimpleNamespace(finished_req_ids=set(), num_scheduled_tokens={"a": 3}, scheduled_new_reqs=[
        SimpleNamespace(req_id="a", prompt_token_ids=[0] * 10, num_computed_tokens=10)],
        scheduled_cached_reqs=[], scheduled_spec_decode_tokens={"a": [7, 8]}, skip_drafts=skip_drafts)


def _run(skip_drafts: bool) -> tuple[FabricatedModel, Any, dict[str, list[int]]]:
    """The model's output for the decode step, and the rows its V2 drafter
    held for it (what a later deferred batch is handed: draft_handler.py)."""
    model = FabricatedModel(_workload(num_lookahead_tokens=2), SimpleNamespace)
    model.draft_handler = DraftHandler(retains_per_request=False)
    out = model.execute(_decode(skip_drafts))
    model.draft_handler.submitted({})                     # a later batch: the decode's rows are the ones held
    req_ids, rows = model.draft_handler.take(SimpleNamespace())
    return model, out, dict(zip(req_ids, rows))


def test_the_fabricated_drafter_proposes_nothing_after_a_batch_marked_skip_drafts():
    workload = _workload(num_lookahead_tokens=2)
    _, expected = draft_outcome(workload, workload.requests[0], 10, 2)
    assert expected > 0                     # the drafter would propose: the skip is what removes them
    model, out, rows = _run(skip_drafts=False)
    assert len(out.spec_token_ids[0]) == expected and len(model.latest_drafts[1][0]) == expected
    assert len(rows["a"]) == 2
    model, out, rows = _run(skip_drafts=True)
    assert out.spec_token_ids == [[]] and model.latest_drafts == (["a"], [[]]) and rows == {"a": []}
    assert out.sampled_token_ids == _run(skip_drafts=False)[1].sampled_token_ids    # sampling is unchanged


# -- the spec and the reference, on traces vLLM 0.34.0 wrote ----------------------------

def _kept(mode: str, drop: str | None = None) -> list[dict[str, Any]]:
    events = read_trace(KEPT / f"0.34.0-{mode}.jsonl")
    if drop is not None:
        events[0].pop(drop)
    return events


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_check_trace_accepts_vllms_lookahead_slots_and_draft_input_slots(mode: str):
    """vLLM reserved 2 lookahead slots per entry and charged each entry one
    input slot: accepted; the same trace read without either rule is
    rejected where the rule shows (so both rules are what accepts it)."""
    events = _kept(mode)
    assert events[0]["num_lookahead_tokens"] == 2 and events[0]["draft_input_slots"] == 1
    assert any(e.get("skip_drafts") for e in events)
    assert check_events(_kept(mode), None).ok
    without_slots = check_events(_kept(mode, "num_lookahead_tokens"), None)
    assert not without_slots.ok and without_slots.property == "S9_kv_ownership"
    without_inputs = check_events(_kept(mode, "draft_input_slots"), None)
    assert not without_inputs.ok and without_inputs.property == "schedule_decision"


def test_a_batch_whose_input_slots_spent_the_budget_skips_nothing():
    """PR3 under the priority policy (seed 12 index 2 of `--all-features
    --spec-tokens 2 --lookahead --stages 1`): budget 4, r3's 3 tokens and
    its input slot leave `input_budget - draft_slots` at -1, so vLLM's running
    loop stops before r2; PR3 counted only the tokens and called r2 skipped."""
    events = read_trace(KEPT / "0.34.0-priority-budget-spent.jsonl")
    assert events[0]["scheduling_policy"] == "priority" and events[0]["max_num_batched_tokens"] == 4
    batch_10 = next(e for e in events if e["ev"] == "schedule" and e["batch"] == 10)
    assert [(x["req"], x["n"]) for x in batch_10["entries"]] == [("r3", 3)]     # r2, running, left out
    assert check_events(events, None).ok


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_batch_marked_skip_drafts_whose_drafts_may_be_used_violates_sd1(mode: str):
    """SD1 (verification/traces/skip_drafts.py): vLLM's marks hold; the
    first batch vLLM did not mark, marked, is rejected at that event (one of
    its entries samples a token that is not its request's last)."""
    events = _kept(mode)
    unmarked = next(i for i, e in enumerate(events)
                    if e["ev"] == "schedule" and e["entries"] and not e.get("skip_drafts"))
    events[unmarked]["skip_drafts"] = True
    result = check_events(events, None)
    assert not result.ok and result.property == "SD1_skip_drafts_only_when_unused"
    assert result.event_index == unmarked


class _Checker(SkipDrafts):
    """SD1's mixin on a spec state of its own (the trace checker's parts it
    reads): k = 2, every request running (none is a padded admission)."""

    def __init__(self, *requests: Request) -> None:
        self.state = State(requests=requests, running=tuple(range(len(requests))))
        self.cfg = Config(num_spec_tokens=2)

    @staticmethod
    def _violation(prop: str, message: str) -> Exception:
        return AssertionError(prop, message)

    def _name(self, r: int) -> str:
        return f"r{r}"


def _entry(req: int, start: int, n: int, drafts: int = 0) -> SimpleNamespace:
    return SimpleNamespace(req=req, start=start, n=n, drafts=drafts)


def test_sd1_judges_each_entry_of_a_marked_batch_by_vllms_drafts_unused():
    checker = _Checker(Request(prompt_len=10, max_tokens=5), Request(prompt_len=4, num_output=4, max_tokens=5),
                       Request(prompt_len=4, num_output=3, max_tokens=5, placeholders=1))
    assert drafts_sure_unused(checker.state.requests[0], 0, 9)          # a non-final chunk
    assert not drafts_sure_unused(checker.state.requests[0], 0, 10)     # the prompt's last token: an output follows
    assert drafts_sure_unused(checker.state.requests[1], 8, 1)          # it samples its 5th and last output
    assert drafts_sure_unused(checker.state.requests[2], 7, 1)          # async: 3 + 1 in flight + 1 reach 5
    checker._check_skip_drafts({"skip_drafts": True}, [_entry(0, 0, 9), _entry(1, 8, 1), _entry(2, 7, 1)])
    with pytest.raises(AssertionError, match="SD1_skip_drafts_only_when_unused"):
        checker._check_skip_drafts({"skip_drafts": True}, [_entry(0, 0, 10)])


def test_sd1_rejects_drafts_scheduled_right_after_a_marked_batch():
    """The request's next entry verifies drafts: they were needed, whatever the mark's own entries said."""
    checker = _Checker(Request(prompt_len=10, max_tokens=5))
    checker._check_skip_drafts({"skip_drafts": True}, [_entry(0, 0, 9)])
    with pytest.raises(AssertionError, match="SD1_skip_drafts_only_when_unused"):
        checker._check_skip_drafts({}, [_entry(0, 9, 3, drafts=2)])
    checker._check_skip_drafts({"skip_drafts": True}, [_entry(0, 0, 9)])
    checker._check_skip_drafts({}, [_entry(0, 9, 1)])                   # no drafts: then drafts are free again
    checker._check_skip_drafts({}, [_entry(0, 10, 3, drafts=2)])
    session = _Checker(Request(prompt_len=4, num_output=4, max_tokens=5, resumable=True))
    session._check_skip_drafts({"skip_drafts": True}, [_entry(0, 8, 1)])
    with pytest.raises(AssertionError, match="SD1_skip_drafts_only_when_unused"):
        session._check_skip_drafts({}, [_entry(0, 9, 3, drafts=2)])     # running: a session is judged alike


def test_a_sessions_next_turn_admitted_padded_after_a_turn_marked_skip_drafts_is_accepted():
    """vLLM 0.34 async (seed 12 index 39 of `--all-features --spec-tokens 2
    --lookahead`): r2's turn samples its last token in batch 4, marked
    skip_drafts (`_drafts_unused`: max_tokens reached); r2 is a streaming
    session, and its next turn of one token is admitted padded with k
    placeholder drafts (`Scheduler.schedule`'s waiting loop,
    `pad_spec_decode`): no drafts the marked batch skipped, so SD1 accepts
    them (verification/traces/skip_drafts.py; the minimal workload's tests:
    tests/test_vllm_skip_drafts_padded_turn.py)."""
    events = read_trace(KEPT / "0.34.0-async-session-placeholders.jsonl")
    schedules = [e for e in events if e["ev"] == "schedule" and any(x["req"] == "r2" for x in e["entries"])]
    marked = next(i for i, e in enumerate(schedules) if e.get("skip_drafts"))
    assert schedules[marked]["batch"] == 4 and schedules[marked + 1]["entries"][0]["drafts"] == 2
    assert schedules[marked + 1]["entries"][0]["cached"] == schedules[marked + 1]["entries"][0]["start"] == 11
    assert next(e for e in events if e["ev"] == "arrive" and e["req"] == "r2")["resumable"]
    assert check_events(events, None).ok


def test_a_profile_without_lookahead_slots_refuses_them():
    events = _kept("sync")
    with pytest.raises(MalformedTrace, match="lookahead slots"):
        check_events(events, "vllm-0.8.5")


def _async_workload() -> dict[str, Any]:
    raw = json.loads((KEPT / "workload.json").read_text())
    raw["config"]["async_scheduling"] = True
    return raw


def test_the_reference_takes_vllms_decisions_with_lookahead_and_input_slots(monkeypatch: pytest.MonkeyPatch):
    """Under vllm-0.34-async the reference schedules and allocates as vLLM
    did, batch for batch; without the draft model's input slot it does not."""
    vllm = decisions(read_trace(KEPT / "0.34.0-async.jsonl"))
    assert decisions(run_reference(_async_workload(), "vllm-0.34-async").events, block_offset=1) == vllm
    monkeypatch.setattr(lookahead_module, "DRAFT_MODEL_INPUT_SLOTS", 0)
    assert decisions(run_reference(_async_workload(), "vllm-0.34-async").events, block_offset=1) != vllm


# -- against vLLM 0.34.0 ---------------------------------------------------------------

def _entries(trace: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    events = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
    return events[0], [e for e in events if e["ev"] == "schedule"]


def _lookahead_workloads(async_scheduling: bool) -> list[dict[str, Any]]:
    workloads = with_lookahead(campaign_workloads(12, 6, spec_tokens=2, stages=1), True)
    for workload in workloads:
        workload["config"]["async_scheduling"] = async_scheduling
    return workloads


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_vllm_reserves_k_lookahead_slots_and_marks_steps_whose_drafts_go_unused(async_scheduling: bool,
                                                                                 tmp_path: Path):
    """Every entry's table covers its tokens and k more (`allocate_slots(
    num_lookahead_tokens=k)`, clipped at max_model_len), some entry needs a
    block only for them, and some batch is marked `skip_drafts` (the first
    chunk of a prompt longer than the budget, or a request's last token)."""
    from flightcheck.vllm import ASYNC_RECORDER
    from flightcheck.vllm.replay import ReplayWorker

    from .vllm_support import require_venv
    require_venv("0.34.0")
    worker = ReplayWorker("0.34.0")
    needed_a_block, skipped = 0, 0
    try:
        for workload in _lookahead_workloads(async_scheduling):
            trace = tmp_path / f"{workload['name']}.jsonl"
            result = worker.replay(workload, trace=str(trace),
                                   scheduler_cls=ASYNC_RECORDER if async_scheduling else None)
            assert result["ending"] == "done", result
            config, schedules = _entries(trace)
            assert config["num_lookahead_tokens"] == 2
            bs, most = config["block_size"], config["max_model_len"]
            tables: dict[str, int] = {}
            for event in schedules:
                skipped += bool(event.get("skip_drafts"))
                for e in event["entries"]:
                    admitted = e.get("cached", 0) or e["start"] == 0 or e["req"] not in tables
                    tables[e["req"]] = (0 if admitted else tables[e["req"]]) + len(e["block_ids"])
                    end = e["start"] + e["n"]
                    assert tables[e["req"]] >= -(-min(end + 2, most) // bs), (workload["name"], event)
                    needed_a_block += -(-min(end, most) // bs) < -(-min(end + 2, most) // bs)
    finally:
        worker.close()
    assert needed_a_block > 0 and skipped > 0
