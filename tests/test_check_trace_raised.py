"""A scheduler that raises on legal input is wrong: the `raised` event
(docs/trace-format.md) rejects a trace at its line as `scheduler_raised`.

vLLM 0.33 and 0.34 with drafts raise in `Scheduler.schedule` on an admission
padded to 1 + k tokens that the long-prefill threshold cut (`assert
num_new_tokens == 1 + self.num_spec_tokens`, 0.34.0 scheduler.py:1643,
0.33.0 :1579). The recorder's trace used to stop before that `schedule`,
with nothing wrong in it, and check-trace accepted it: `flightcheck vllm
campaign --versions 0.34.0,0.33.0 --all-features --spec-tokens 3 --stages 1
--workloads 80 --seed 103` counted 10 such misses (2 + 2 on 0.34.0 sync and
async, 3 + 3 on 0.33.0). vLLM's recorder now ends such a trace with
`raised` (flightcheck/vllm/raised_recording.py): the kept traces here are
its, from index 76 on 0.34.0 async and index 33 on 0.33.0 sync (the same
runs as tests/test_vllm_padded_admission.py's, whose traces stop before it).
vLLM 0.8.4 with drafts and one stage raises in `schedule()` too, in
`KVCacheManager.allocate_slots` (`assert num_new_blocks > 0`,
kv_cache_manager.py:265) and `BlockPool.cache_full_blocks` (`assert
blk.block_hash is None`, block_pool.py:120): `--versions 0.8.4 --spec-tokens
3 --stages 1 --workloads 120 --seed 305` missed indices 3 and 41, kept in
data/vllm/raised with the traces the recorder now writes. The recorder's
own rules are checked on a stand-in for vLLM's scheduler; the slow tests
replay index 76 on vLLM 0.34.0 and index 41 on 0.8.4.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from flightcheck.verification.traces.check import MalformedTrace, check_events
from flightcheck.verification.traces.ground_truth import expected_verdict
from flightcheck.vllm.campaign import check_verdict, verdict
from flightcheck.vllm.differential import read_trace
from flightcheck.vllm.raised_recording import RaisedRecording

from .vllm_support import DATA, require_venv

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

HUNT = DATA / "hunt34"
KEPT = [("034_async_padded_admission_raised_seed103_76", 1643),
        ("033_sync_kv_padded_admission_raised_seed103_33", 1579)]
PADDING = "assert num_new_tokens == 1 + self.num_spec_tokens"
RAISED_084 = [("084_allocate_slots_seed305_3", "kv_cache_manager.py:265 in allocate_slots: assert num_new_blocks > 0"),
              ("084_cache_full_blocks_seed305_41", "block_pool.py:120 in cache_full_blocks: assert blk.block_hash is None")]


def _vllm_result(exception: str) -> dict[str, Any]:
    """A replay result that ended as these runs did, as the verdicts read it."""
    return {"ending": "exception", "batches_in_flight": 0, "exception": exception,
            "ground_truth": {"stale_tokens": [], "partial_chunk_tokens": [], "in_flight_set_mismatches": []}}


@pytest.mark.parametrize("stem,line", KEPT)
def test_a_padded_admissions_trace_is_rejected_at_its_raised_event(stem, line):
    events = read_trace(HUNT / f"{stem}.jsonl")
    assert events[-1]["ev"] == "raised" and events[-1]["in"] == "schedule"
    result = check_events(events)
    assert (result.ok, result.property, result.event_index) == (False, "scheduler_raised", len(events) - 1)
    assert f"raised in schedule(): AssertionError (vllm/v1/core/sched/scheduler.py:{line} in schedule: " \
           f"{PADDING})" in result.message, result.message
    # the command's reading (line by line) says the same, at the file's last line
    said = check_verdict(HUNT / f"{stem}.jsonl")
    assert (said["ok"], said["property"], said["line"]) == (False, "scheduler_raised", len(events))


@pytest.mark.parametrize("stem,line", KEPT)
def test_without_its_raised_event_the_trace_is_a_legal_prefix(tmp_path, stem, line):
    """What check-trace said of these runs before: nothing in the prefix is
    wrong, so the run was a miss against vLLM's ground truth."""
    events = read_trace(HUNT / f"{stem}.jsonl")[:-1]
    # the trace as vLLM's recorder wrote it before (tests/test_vllm_padded_admission.py's), but its config's time
    before = read_trace(HUNT / f"{stem.replace('_raised_', '_cut_by_threshold_')}.jsonl")
    assert [{k: v for k, v in e.items() if k != "t"} for e in before] == \
           [{k: v for k, v in e.items() if k != "t"} for e in events]
    assert check_events(events).ok
    prefix = tmp_path / "prefix.jsonl"
    prefix.write_text("".join(json.dumps(e) + "\n" for e in events))
    exception = f"AssertionError at vllm/v1/core/sched/scheduler.py:{line} in schedule: {PADDING}"
    assert verdict(_vllm_result(exception), check_verdict(prefix))[0] == "accepted, MISSED bug"


@pytest.mark.parametrize("stem,line", KEPT)
def test_the_campaign_counts_the_rejection_a_real_bug(stem, line):
    events = read_trace(HUNT / f"{stem}.jsonl")
    result = _vllm_result(f"AssertionError at vllm/v1/core/sched/scheduler.py:{line} in schedule: {PADDING}")
    category, detail = verdict(result, check_verdict(HUNT / f"{stem}.jsonl"))
    assert category == "rejected, real bug" and detail.endswith("scheduler_raised"), detail
    assert expected_verdict(result, events).agrees(check_events(events))


@pytest.mark.parametrize("stem,where", RAISED_084)
def test_vllm_0_8_4s_block_assertions_are_rejected_at_the_raised_event_and_not_before(stem, where):
    events = read_trace(DATA / "raised" / f"{stem}.jsonl")
    assert check_events(events[:-1]).ok                  # the trace as it stopped before: a miss
    result = check_events(events)
    assert (result.ok, result.property, result.event_index) == (False, "scheduler_raised", len(events) - 1)
    assert f"raised in schedule(): AssertionError (vllm/v1/core/{where})" in result.message, result.message
    category, _ = verdict(_vllm_result(f"AssertionError at vllm/v1/core/{where}"),
                          check_verdict(DATA / "raised" / f"{stem}.jsonl"))
    assert category == "rejected, real bug"


def test_the_reference_never_writes_raised_not_even_where_it_raises_as_vllm_does():
    """The released reference (reference/profiles.py `padding_asserted_whole`)
    fails the padding's assertion at the same schedule: its trace stops
    there, and the differential compares decisions, which `raised` is not."""
    from flightcheck.vllm.differential import decisions, profile_for, run_reference

    raw = json.loads((HUNT / "034_async_padded_admission_cut_by_threshold_seed103_76.workload.json").read_text())
    released = run_reference(raw, profile_for("0.34.0", True), vllm_outputs=True)
    assert released.ending == "exception" and PADDING in str(released.exception)
    assert not any(event["ev"] == "raised" for event in released.events)
    assert decisions(released.events, block_offset=1) == decisions(read_trace(HUNT / f"{KEPT[0][0]}.jsonl"))


# -- the checker's rule on small traces -------------------------------------------

CONFIG = {"ev": "config", "num_stages": 1, "max_num_batched_tokens": 8, "block_size": 4, "num_blocks": 8,
          "max_model_len": 64, "eos_token_id": 0}
RUN = [CONFIG, {"ev": "arrive", "req": "a", "prompt_len": 6, "max_tokens": 1},
       {"ev": "schedule", "batch": 1, "entries": [{"req": "a", "start": 0, "n": 6}]},
       {"ev": "complete", "batch": 1, "tokens": {"a": [5]}}]
RAISED = {"ev": "raised", "in": "update_from_output", "error": "AssertionError: placeholders"}


def test_a_raised_event_outranks_the_finish_the_spec_awaits():
    """"a" reached max_tokens at the completion: the spec awaits its finish,
    but the scheduler raised first (vLLM's update writes its `complete`, then
    raises): the verdict is the raise, not a missing finish."""
    result = check_events(RUN + [RAISED])
    assert (result.ok, result.property, result.event_index) == (False, "scheduler_raised", 4)
    assert "raised in update_from_output(): AssertionError: placeholders;" in result.message
    assert check_events(RUN + [{"ev": "finish", "req": "a", "reason": "length"}, {"ev": "end"}]).ok


def test_a_raised_event_after_end_is_an_event_after_end():
    run = RUN + [{"ev": "finish", "req": "a", "reason": "length"}, {"ev": "end"}, RAISED]
    assert check_events(run).property == "event_after_end"


@pytest.mark.parametrize("event,said", [
    ({"ev": "raised", "in": "scheduled", "error": "AssertionError"},
     'in: expected one of "schedule", "update_from_output", "finish_requests", got "scheduled"'),
    ({"ev": "raised", "in": "schedule"}, "error: missing"),
    ({"ev": "raised", "in": "schedule", "error": 3}, "error: expected the exception: a string"),
    ({"ev": "raised", "in": "schedule", "error": "E", "at": ["x"]}, "at: expected where it was raised"),
])
def test_a_malformed_raised_event_is_refused_naming_its_field(event, said):
    with pytest.raises(MalformedTrace) as refused:
        check_events(RUN + [event])
    assert str(refused.value).startswith("line 5: raised event: ") and said in str(refused.value), str(refused.value)


# -- the recorder's rule, on a stand-in for vLLM's scheduler ------------------------

_SCHEDULER = '''
class Scheduler:
    fail = None
    def schedule(self):
        assert self.fail != "schedule"
        return "output"
    def update_from_output(self, output, result):
        if self.fail == "nested":
            self.finish_requests(["a"], "FINISHED_ERROR")
        assert self.fail != "update", "placeholders\\nmore"
        return {}
    def finish_requests(self, request_ids, status):
        if self.fail == "nested":
            return {}[request_ids[0]]
        return []
'''
_VLLM: dict[str, Any] = {"__name__": "vllm.v1.core.sched.scheduler"}      # a module of vLLM's, by name
exec(compile(_SCHEDULER, "vllm/v1/core/sched/scheduler.py", "exec"), _VLLM)


class _Hooks:
    """What the other recorder mixins do around vLLM's calls, in short: an
    update that raised still writes its `complete` (recording.py), and the
    recorder may raise on its own after vLLM returned."""

    def __init__(self, fail: str | None) -> None:
        self.fail, self.flightcheck_step, self.events = fail, 0, []

    def _fc_write(self, event: dict[str, Any]) -> None:
        self.events.append({**event, "step": self.flightcheck_step})

    def schedule(self) -> Any:
        output = super().schedule()  # type: ignore[misc]
        self.flightcheck_step += 1
        if self.fail == "recorder":
            raise RuntimeError("flightcheck recorder: 2 KV cache groups; the trace format has one")
        return output

    def update_from_output(self, output: Any, result: Any) -> Any:
        try:
            return super().update_from_output(output, result)  # type: ignore[misc]
        except Exception:
            self.flightcheck_step += 1
            self._fc_write({"ev": "complete", "batch": 1})
            raise


class _Recorder(RaisedRecording, _Hooks, _VLLM["Scheduler"]):  # type: ignore[misc]
    pass


def test_the_recorder_writes_raised_where_vllms_schedule_raises():
    recorder = _Recorder("schedule")
    with pytest.raises(AssertionError):
        recorder.schedule()
    assert recorder.events == [{"ev": "raised", "in": "schedule", "error": "AssertionError",
                                "at": "vllm/v1/core/sched/scheduler.py:5 in schedule: ", "step": 1}]


def test_an_update_that_raised_writes_its_complete_then_raised_with_the_first_line():
    recorder = _Recorder("update")
    with pytest.raises(AssertionError):
        recorder.update_from_output("output", None)
    assert [(e["ev"], e.get("in"), e.get("error"), e["step"]) for e in recorder.events] == \
           [("complete", None, None, 1), ("raised", "update_from_output", "AssertionError: placeholders", 1)]


def test_a_finish_vllm_calls_inside_its_update_raises_once_for_the_update():
    recorder = _Recorder("nested")
    with pytest.raises(KeyError):
        recorder.update_from_output("output", None)
    assert [(e["ev"], e.get("in"), e.get("error")) for e in recorder.events] == \
           [("complete", None, None), ("raised", "update_from_output", "KeyError: 'a'")]
    # the engine's own call to finish_requests is watched too
    with pytest.raises(KeyError):
        recorder.finish_requests(["a"], "FINISHED_ABORTED")
    assert recorder.events[-1]["in"] == "finish_requests" and len(recorder.events) == 3


def test_the_recorders_own_error_is_not_vllms():
    recorder = _Recorder("recorder")
    with pytest.raises(RuntimeError):
        recorder.schedule()
    assert recorder.events == []
    calm = _Recorder(None)
    assert calm.schedule() == "output" and calm.update_from_output("output", None) == {} and calm.events == []


# -- on vLLM ---------------------------------------------------------------------------

@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version,async_scheduling,workload,assertion", [
    ("0.34.0", True, HUNT / "034_async_padded_admission_cut_by_threshold_seed103_76.workload.json", PADDING),
    ("0.8.4", False, DATA / "raised" / "084_cache_full_blocks_seed305_41.workload.json",
     "assert blk.block_hash is None")])
def test_a_run_vllm_raises_in_is_rejected_as_a_real_bug_at_the_raised_event(version, async_scheduling, workload,
                                                                             assertion):
    require_venv(version)
    from flightcheck.vllm.campaign import ReplayJob, replay_workload
    from flightcheck.vllm.replay import ReplayWorker

    raw = json.loads(workload.read_text())
    with ReplayWorker(version) as worker:
        replayed = replay_workload(worker, ReplayJob(version, async_scheduling, 0, raw, 0))
    assert replayed.result["ending"] == "exception" and assertion in replayed.result["exception"]
    assert replayed.category == "rejected, real bug", replayed.detail
    assert replayed.detail.endswith("scheduler_raised"), replayed.detail
