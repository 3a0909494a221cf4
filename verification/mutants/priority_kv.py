"""Where the priority policy meets the KV connector (docs/request-states.md,
"Features together"): its bugs as mutants, each a small named edit of the
spec function it lives in (spec/kv_loads.py), with what broke and the
property that kills it; one is named for the vLLM pull request that
reports it (`..._prNNNNN`).

Each is hunted under `vllm-0.34` on the model
`verification/priority_kv_models.py` names for it, and, like the
connector's and the policy's own, kept out of every run without both
(`PRIORITY_KV_MUTANTS` in registry.py).
"""

from __future__ import annotations

from flightcheck.verification.mutants.spec import Mutant, _edit, _mutant

# The profile every mutant here is hunted under.
PRIORITY_KV_PROFILE = "vllm-0.34"


def _priority_kv(name: str, kind: str, history: str, *edits, killed_by: str, shortest: int) -> Mutant:
    return _mutant(name, kind, history, *edits, killed_by=killed_by, shortest=shortest,
                   profile=PRIORITY_KV_PROFILE)


PRIORITY_KV_BUGS: tuple[Mutant, ...] = (
    _priority_kv(
        "load_ranked_behind_new_request_pr57841", "historical",
        "vLLM PR #57841 (open): its fix keeps a request that holds KV blocks from ever sitting behind "
        "one that holds none in the one queue of skipped requests, and says it holds under FCFS only: "
        "under priority scheduling a later request of a higher priority lands ahead of the loads already "
        "parked, fails to allocate, and stops the scan, so the landed loads that hold the pool are never "
        "promoted (the deadlock of #45388 and #53868). vLLM 0.33 and 0.34 keep the loads in a queue of "
        "their own, drained first under either policy (`kv_holding_waiting`). The edit ranks the loads "
        "with the plain waiting requests: a plain request of a better rank is looked at first",
        _edit("kv_loads.next_candidate", """
              if held is not None:
                  if _holds_load(state, held):        # a session between turns is in no reservation
                      walk.parked.add(held)
                  return held, "holding\"""", """
              better = _head(tuple(r for r in state.waiting if not may_load_async(state, cfg, r)), walk)
              if held is not None and (better is None or priority.rank(state, held) < priority.rank(state, better)):
                  if _holds_load(state, held):
                      walk.parked.add(held)
                  return held, "holding\""""),
        killed_by="L2_no_deadlock", shortest=4),
    _priority_kv(
        "parked_load_joins_tail_under_priority", "synthetic",
        "What the spec did before the pair met: a load started under the priority policy joins the "
        "tail of `kv_holding` (the FCFS queue's `add_request`), where vLLM's `kv_holding_waiting` is a "
        "`PriorityRequestQueue` under the policy (`Scheduler.__init__`: `create_request_queue(self.policy)`) "
        "and pushes it at its rank. The edit leaves the parked load at the tail",
        _edit("kv_loads.park", "return priority.kv_holding_in_rank_order(state, cfg)", "return state"),
        killed_by="PR4_kv_holding_in_priority_order", shortest=4),
)
