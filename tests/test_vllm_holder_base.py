"""vLLM's ground truth for a request sharing a failed sync load's blocks
(kv_recording.py `_fc_check_holder_base`): vLLM 0.33.0 and 0.34.0's
`_update_requests_with_invalid_blocks` sets such a holder, whose invalid
blocks an earlier request in the pass marked, back to
`num_computed_tokens` less the failing batch's tokens, which counts its
later batches still in flight (`kv_rollback_base_assumes_one_batch`).

The recorder looked only for a later entry starting below that base, which
there is only when the later entries carry more tokens than the failing
one: with a chunk of equal size after it (long_prefill_token_threshold 4,
two stages) vLLM kept r2's 4 tokens computed over the invalid block, the
ground truth said nothing, and check-trace's KV3 at the rollback was
counted a false rejection (the case the async run of `campaign --versions
0.33.0 --all-features --spec-tokens 2 --seed 11`, index 41, has too: r2's
failing entry and its later one both 3 tokens; there the placeholders
flag the run). The recorder now reads which requests the pass set back so
(`_fc_kv_reverted`) and counts each later entry of their admission
(tests/data/kv/vllm/*_sharer_rollback_base_counts_later_batch_of_equal_chunk.jsonl:
check-trace's verdict, tests/test_trace_kv_vllm.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from flightcheck.vllm.ground_truth import BatchRecord, EntrySnapshot, Observations
from flightcheck.vllm.kv_recording import KVRecordingMixin

from .vllm_support import require_venv

pytestmark = pytest.mark.usefixtures("both_checkers")   # the vLLM test checks its trace

WORKLOAD = Path(__file__).parent / "data" / "kv" / "vllm" / "sharer_rollback_base_counts_later_batch_of_equal_chunk.workload.json"
INVALID = 1                                   # r0's loaded block, r2's first through its prefix hit


class _VllmScan:
    """vLLM's scan as far as the recorder sees it: r0 (the loader) first
    cut at the block, r2 set back by its failing batch's tokens."""

    def _update_requests_with_invalid_blocks(self, requests: Any, invalid: Any, scheduled: Any,
                                             evict_blocks: bool = True) -> tuple[set[str], int, set[int]]:
        for request in requests:
            request.num_computed_tokens = 0 if request.request_id == "r0" else 6
        return {"r0", "r2"}, 0, set()


class _Recorder(KVRecordingMixin, _VllmScan):
    """The mixin on stand-ins for the equal-chunk run at r0's failure:
    r2's entries [2, 6) in the failing batch 1 and [6, 10) in batch 2."""

    block_size = 2

    def __init__(self) -> None:
        self.r2 = SimpleNamespace(request_id="r2", num_computed_tokens=10)
        self.tables = {"r0": [INVALID, 2], "r2": [INVALID, 3, 4, 5, 6]}
        self._fc_in_flight = {2: BatchRecord(2, None, [EntrySnapshot("r2", self.r2, 1, 6, 4, False)])}
        self._fc_kv_computed_before = {"r2": (self.r2, 10)}
        self.flightcheck_step = 3
        self.flightcheck_observations = Observations(spec_decoding=False)

    def _fc_block_table(self, req_id: str) -> list[int]:
        return self.tables[req_id]

    def _fc_admitted(self, request: Any) -> int:
        return 1


def test_a_holder_set_back_by_its_failing_batch_counts_a_later_entry_starting_at_its_base() -> None:
    recorder = _Recorder()
    r0 = SimpleNamespace(request_id="r0", num_computed_tokens=3)
    recorder._update_requests_with_invalid_blocks(iter([r0, recorder.r2]), {INVALID}, {"r0": 1, "r2": 4})
    assert recorder._fc_kv_reverted == {"r2"}          # r0 marked the block; r2 held it only
    recorder._fc_check_holder_base("r2", recorder.r2, frozenset())
    assert recorder.flightcheck_observations.kv_holder_base_counts_later_batches == [
        {"step": 3, "req": "r2", "computed": 6, "batches": [2]}]
    assert recorder._fc_holder_bases["r2"][0] == 2      # valid up to its failing entry's start


def test_a_later_entry_an_earlier_rollback_superseded_counts_nothing() -> None:
    recorder = _Recorder()
    recorder._fc_kv_reverted = frozenset({"r2"})
    recorder._fc_check_holder_base("r2", recorder.r2, frozenset({(2, "r2")}))
    assert recorder.flightcheck_observations.kv_holder_base_counts_later_batches == []


def test_a_holder_cut_at_its_own_first_invalid_block_keeps_the_start_rule() -> None:
    recorder = _Recorder()                               # not set back by the pass: r2 marked the block itself
    r0 = SimpleNamespace(request_id="r0", num_computed_tokens=3)
    recorder._update_requests_with_invalid_blocks([recorder.r2, r0], {INVALID}, {"r0": 1, "r2": 4})
    assert recorder._fc_kv_reverted == {"r0"}
    recorder._fc_kv_reverted = frozenset()
    recorder._fc_check_holder_base("r2", recorder.r2, frozenset())
    assert recorder.flightcheck_observations.kv_holder_base_counts_later_batches == []   # batch 2 starts at 6


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_the_equal_chunk_holder_rollback_is_a_real_bug_on_vllm(version: str) -> None:
    require_venv(version)
    from flightcheck.vllm.campaign import ReplayJob, replay_workload
    from flightcheck.vllm.replay import ReplayWorker

    raw = json.loads(WORKLOAD.read_text())
    with ReplayWorker(version) as worker:
        replayed = replay_workload(worker, ReplayJob(version, False, 0, raw, 11))
    # before: "rejected, FALSE" (false rejection: KV3_rollback_restores_counters)
    assert replayed.category == "rejected, real bug", replayed.detail
    assert "KV3_rollback_restores_counters" in replayed.detail and "r2, sharing" in replayed.detail
