"""What `flightcheck vllm campaign --all-features --spec-tokens 2 --stages 1`
found on vLLM's real scheduler: one-stage engines, where vLLM's
double-sampling finding (S5, a sync trace with batches in flight) no longer
ends a trace before a false rejection later in it can be seen.

* 0.34.0 sync, seed 2 index 45 (`034_sync_drafts_rejected_beside_failed_receive`):
  r2's async load fails whole (`failed_recving`, `_handle_failed_recving`
  resets r2 alone) in the output where r1's two drafts are rejected
  (`update_from_output` takes them off r1's `num_computed_tokens`). The
  recorder took every request whose counter fell in that update for one the
  failure rolled back, and wrote r1 as a `holders` entry of r2's `kv_failed`:
  check-trace rejected it (KV3, a false rejection). Ours: a holder is now
  only a request vLLM's `_update_requests_with_invalid_blocks` reports
  affected (kv_recording.py). The trace the recorder wrote before the fix is
  kept beside the workload: the checker still rejects a holder the spec
  does not roll back.
* 0.33.0 and 0.34.0 async, seed 3 index 53 (`*_async_cadence_hold_at_preemption`):
  prefill cadence (interval 2), priority, grammar, streaming sessions and
  drafts. At line 36 the waiting queue is backed up (prefill_capacity_bound,
  so the hold of 1 defers nothing): `Scheduler.schedule` schedules r1, a
  running prefill chunk (18 of 20), then r3's decode finds no block and the
  priority preemption takes r1 back out of the batch
  (`scheduled_running_reqs.remove`), leaving `prefill_scheduled` set, so
  `last_prefill_step` restarts from a batch without a prefill. The spec's
  action does the same (spec/schedule.py: `carried_prefill` stays set), but
  CAD3's `_carries_prefill` (spec/cadence_properties.py) read only the
  batch's final entries and wanted the hold one less: a false
  CAD3_hold_restarts_after_prefill (vLLM's ground truth has no finding).
  Fixed: the action records what it took back (`Scheduled.taken_back`,
  filled by `priority.hand_back`) and CAD3 counts a running chunk among
  them; cadence-prio-k2 (verification/cadence_models.py) reaches such a
  step, and the mutant `cadence_stamp_undone_by_hand_back` (the hold aged
  where vLLM restarts it) is killed by CAD3 there (tests/test_prefill_cadence.py).
  The Z3 encoding of the cadence refuses the priority policy, and under
  FCFS nothing is taken back (cadence_invariants.py says why).
* 0.8.5 and 0.8.4 sync with drafts, seed 2 index 14 and 25 of
  `--versions 0.8.5,0.8.4 --spec-tokens 2 --stages 1`: vLLM crashes inside
  `schedule()` (0.8.5: `assert blk.block_hash is None` in
  `BlockPool.cache_full_blocks`; 0.8.4: the assertion in
  `KVCacheManager.allocate_slots`). The trace used to stop before that call
  (no `end`), and check-trace accepted it naming liveness unchecked: a miss.
  vLLM's recorder now ends it with a `raised` event (the traces here are
  re-recorded so: the same events, one line more), rejected there as
  `scheduler_raised`; the trace cut before it is still accepted, as before.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from flightcheck.verification.traces.stream import check_lines, open_lines
from flightcheck.vllm.kv_recording import KVRecordingMixin

from .vllm_support import require_venv

pytestmark = pytest.mark.usefixtures("both_checkers")   # check-trace on vLLM's traces

DATA = Path(__file__).parent / "data" / "vllm" / "stages1"
REJECTED_DRAFTS = "034_sync_drafts_rejected_beside_failed_receive_seed2_45"
CADENCE_AT_PREEMPTION = ["033_async_cadence_hold_at_preemption_seed3_53",
                         "034_async_cadence_hold_at_preemption_seed3_53"]


def _verdict(path: Path) -> dict[str, Any]:
    with open_lines(str(path)) as lines:
        final = list(check_lines(lines, None))[-1]
    assert final.result is not None, final.malformed
    return final.result.to_json()


def test_drafts_rejected_beside_a_failed_receive_are_accepted():
    assert _verdict(DATA / f"{REJECTED_DRAFTS}.jsonl")["ok"]
    before = _verdict(DATA / f"{REJECTED_DRAFTS}.recorder_before_fix.jsonl")
    assert (before["ok"], before["property"], before["line"]) == (False, "KV3_rollback_restores_counters", 18)


class _Recorder(KVRecordingMixin):
    """The mixin's failure writing alone, on requests stood in for."""
    recompute_kv_load_failures = True
    records_async_scheduling = False
    _fc_in_flight: dict = {}

    def __init__(self, computed: dict[str, tuple[int, int]], scanned_back: frozenset[str]) -> None:
        self.requests = {r: SimpleNamespace(num_computed_tokens=after, is_finished=lambda: False)
                         for r, (_, after) in computed.items()}
        self._fc_kv_computed_before = {r: (self.requests[r], before) for r, (before, _) in computed.items()}
        self._fc_kv_scanned_back = scanned_back
        self._fc_kv_failures = [{"ev": "kv_failed", "req": "r2", "from_block": 0}]
        self.written: list[dict[str, Any]] = []

    def _fc_write(self, event: dict[str, Any]) -> None:
        self.written.append(event)

    def _fc_check_holder_base(self, req_id: str, request: Any, superseded: frozenset) -> None:
        pass


def test_a_holder_is_a_request_vllms_scan_rolled_back_not_one_that_lost_drafts():
    # r2's receive failed (25 -> 0); r1 lost two rejected drafts (29 -> 27)
    lost_drafts = _Recorder({"r1": (29, 27), "r2": (25, 0)}, frozenset())
    lost_drafts._fc_write_failures()
    assert lost_drafts.written == [{"ev": "kv_failed", "req": "r2", "from_block": 0, "computed": 0}]
    # the same fall, reported affected by `_update_requests_with_invalid_blocks`: a holder
    shares = _Recorder({"r1": (29, 24), "r2": (25, 0)}, frozenset({"r1"}))
    shares._fc_write_failures()
    assert shares.written[0]["holders"] == [{"req": "r1", "computed": 24}]


@pytest.mark.parametrize("stem", CADENCE_AT_PREEMPTION)
def test_cadence_hold_at_a_preemption_is_accepted(stem):
    verdict = _verdict(DATA / f"{stem}.jsonl")
    assert verdict["ok"], (verdict["property"], verdict["line"])


@pytest.mark.parametrize("stem", ["085_sync_drafts_crash_in_cache_full_blocks_seed2_14",
                                  "084_sync_drafts_crash_in_allocate_slots_seed2_25"])
def test_a_crash_of_0_8_with_drafts_and_one_stage_is_rejected(stem, tmp_path):
    trace = DATA / f"{stem}.jsonl"
    lines = trace.read_text().splitlines()
    assert json.loads(lines[-1])["ev"] == "raised"
    verdict = _verdict(trace)
    assert (verdict["ok"], verdict["property"], verdict["line"]) == (False, "scheduler_raised", len(lines))
    # without the raised line the trace is the prefix it used to be: accepted, liveness unchecked
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(lines[:-1]) + "\n")
    before = _verdict(cut)
    assert before["ok"] and before["unchecked"] == ["liveness at the end (the trace has no end event)"]


@pytest.mark.vllm
@pytest.mark.slow
def test_drafts_rejected_beside_a_failed_receive_replayed_on_vllm_write_no_holder():
    require_venv("0.34.0")
    from flightcheck.vllm.campaign import ReplayJob, replay_workload
    from flightcheck.vllm.replay import ReplayWorker

    raw = json.loads((DATA / f"{REJECTED_DRAFTS}.workload.json").read_text())
    with ReplayWorker("0.34.0") as worker:
        replayed = replay_workload(worker, ReplayJob("0.34.0", False, 45, raw, 2))
    assert replayed.category == "accepted, correct run", replayed.detail
    assert replayed.comparison is not None and replayed.comparison.explained, replayed.comparison.describe()
