"""The prefill cadence's bugs, as mutants (spec/cadence.py): each a small
named edit of the spec function the bug lives in, named for the vLLM pull
request that reports it, with what broke and the property that kills it.
Hunted on the cadence models (verification/cadence_models.py) only, as
the other features' mutants are on theirs: each on cadence-k2, but one
that needs the priority policy on cadence-prio-k2 (`CADENCE_MUTANT_MODELS`).
"""

from __future__ import annotations

from flightcheck.verification.mutants.spec import Mutant, _edit, _mutant

# The profile every cadence mutant is hunted under.
CADENCE_PROFILE = "vllm-0.34"


def _cad(name: str, kind: str, history: str, *edits, killed_by: str, shortest: int) -> Mutant:
    return _mutant(name, kind, history, *edits, killed_by=killed_by, shortest=shortest,  # type: ignore[arg-type]
                   profile=CADENCE_PROFILE)


CADENCE: tuple[Mutant, ...] = (
    _cad("cadence_holds_backed_up_queue_pr44558", "historical",
         "vLLM PR #44558 (the prefill cadence): measured without a guard, a saturated engine held "
         "prefill (admissions and in-flight chunks) for interval - 1 of every interval steps, "
         "capping prefill near one budget per interval while its waiting queue grew without bound; "
         "the merged PR added the capacity-bound guard (`prefill_capacity_bound`). The edit drops "
         "the guard from the deferral",
         _edit("cadence.defers_prefills", "not is_on(cfg) or state.prefill_capacity_bound or state.prefill_hold == 0",
               "not is_on(cfg) or state.prefill_hold == 0"),
         killed_by="CAD2_backed_up_queue_not_held", shortest=4),
    _cad("cadence_stamps_on_prompt_length_pr54627", "historical",
         "vLLM PR #54627 (the local cadence, outside data parallelism), as its code says: stamping "
         "`prefill_admitted` on `num_computed_tokens < num_prompt_tokens` instead of the deferral's "
         "own test (`< num_tokens - 1`) let a request with one token left (a full prefix-cache hit, "
         "a remote-KV resume) pass the gate on a held step and still restart the interval. The edit "
         "tests against the prompt length",
         _edit("cadence.carries_prefill", "computed < state.requests[r].num_tokens - 1",
               "computed < state.requests[r].prompt_len"),
         killed_by="CAD3_hold_restarts_after_prefill", shortest=2),
    _cad("cadence_stamp_undone_by_hand_back", "synthetic",
         "vLLM 0.33/0.34 `Scheduler.schedule` sets `prefill_scheduled` as the running loop schedules a "
         "prefill chunk; when a priority preemption later takes that request back out of the batch "
         "(`scheduled_running_reqs.remove`) the flag stays set and `last_prefill_step` is stamped all "
         "the same. The edit recomputes the flag from what stays in the batch after the hand-back, as "
         "a scheduler reading only the final batch would: the hold ages where vLLM restarts it. Hunted "
         "on cadence-prio-k2 (the priority policy: under FCFS no scheduled request is a victim)",
         _edit("schedule._preempt_victim", "priority.hand_back(step, victim)", """
               priority.hand_back(step, victim)
               step.carried_prefill = any(step.state.requests[e.req].is_prefill_chunk for e in step.entries)"""),
         killed_by="CAD3_hold_restarts_after_prefill", shortest=9),
)
