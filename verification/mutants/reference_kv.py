"""The KV connector's historical bugs in the reference scheduler
(reference/kv_transfer.py, kv_waiting.py, the running loop's fence guard),
named as the spec's (verification/mutants/kv_connector.py); registered in
reference.py (`KV_MUTANTS`), which the reference's other mutants live in.
"""

from __future__ import annotations

from flightcheck.verification.mutants.reference_base import ReferenceMutant, _edit, _mutant

# The KV connector's historical bugs in the reference (reference/kv_transfer.py),
# named as the spec's (verification/mutants/kv_connector.py). The fuzzer has
# no connector, so they are not fuzzed: each is caught by the reference's own
# checks on random connector runs (reference/consistency.py and the step
# fence's KV1: tests/test_kv_mutants.py pins the seed and the check).
KV_CONNECTOR: tuple[ReferenceMutant, ...] = (
    _mutant("fence_ignored_pr45357",
            "blocks of a finished or preempted request freed while an overlapping step still writes "
            "them: the step fence left out (vLLM PR #45357)",
            _edit("kv_transfer.KvTransfers._request_blocks_can_be_freed",
                  "not self._defer_block_free or request.last_sched_seq <= self.processed_step_seq", "True"),
            profile="vllm-0.34-async"),
    _mutant("aborted_load_freed_at_once_pr32255",
            "a request aborted during its async load has its blocks freed at once, the load still "
            "writing them (vLLM PR #32255)",
            _edit("kv_transfer.KvTransfers._load_outlives_abort",
                  "self._kv_aborted_load_held and req_id not in self.finished_recving_kv_req_ids", "False"),
            profile="vllm-0.34-async"),
    _mutant("waiting_head_blocks_promotion_pr45388",
            "a plain WAITING head that cannot allocate is looked at before the landed loads, which are "
            "never promoted: the engine schedules nothing for ever (vLLM issue #45388)",
            _edit("kv_waiting.KvWaiting._next_candidate",
                  "held = next((r for r in self.kv_holding_waiting if r not in skipped), None)", """
                  plain_first = next((r for r in self.waiting if r not in skipped and not self._may_load_async(r)), None)
                  held = None if plain_first is not None else next(
                      (r for r in self.kv_holding_waiting if r not in skipped), None)"""),
            profile="vllm-0.34-async"),
    _mutant("fenced_victim_preempted_pr49674",
            "a victim whose free the step fence defers is preempted anyway: the preemption frees nothing "
            "for the request it makes room for (vLLM issue #49674)",
            _edit("scheduler.Scheduler._allocate_or_preempt", """
                  if self._defer_block_free and not self._request_blocks_can_be_freed(victim):
                      return None""", ""),
            profile="vllm-0.34-async"),
    _mutant("rollback_keeps_placeholders_pr49250",
            "a recompute rollback of a failed load leaves num_output_placeholders under async scheduling "
            "(vLLM issue #49250, open, unchanged in 0.34.0)",
            _edit("kv_transfer.KvTransfers._roll_back", "request.num_output_placeholders = 0", ""),
            profile="vllm-0.34-async"),
    _mutant("spec_step_blocks_not_reserved_pr57104",
            "with drafts, an async load is admitted without reserving a decode step's draft blocks "
            "(`_spec_decode_step_blocks`, its share of `_request_remaining_blocks`): loads fill the pool "
            "and the landed one can never allocate its first decode (vLLM PR #57104)",
            _edit("kv_transfer.KvTransfers._remaining_blocks",
                  "(1 + k + self.config.num_lookahead_tokens if k else 0)", "0"),
            _edit("kv_transfer.KvTransfers._reserved_blocks",
                  "return sum(self._remaining_blocks(r) for r in holders) + spec_step_blocks",
                  "return sum(self._remaining_blocks(r) for r in holders)"),
            profile="vllm-0.34-async"),
)
