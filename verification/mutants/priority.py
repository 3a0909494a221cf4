"""The priority policy's historical bugs, as mutants (docs/request-states.md,
"Priority scheduling"): each a small named edit of the spec function the bug
lives in (spec/schedule.py's `_preempt_victim`, spec/priority.py's
`hand_back`), named for the vLLM issue or pull request that reports it
(`..._prNNNNN`), with what broke and the property that kills it.

Every one is hunted under `vllm-0.34` (synchronous scheduling: under K = 2 a
decode whose token is in flight is visited and skipped, the victim #49097
needs) on the model `verification/priority_models.py` names for it, and is
kept out of the runs without the policy (`PRIORITY_MUTANTS` in registry.py).
"""

from __future__ import annotations

from flightcheck.verification.mutants.spec import Mutant, _edit, _mutant

# The profile every priority mutant is hunted under.
PRIORITY_PROFILE = "vllm-0.34"


def _priority(name: str, history: str, *edits, killed_by: str, shortest: int) -> Mutant:
    return _mutant(name, "historical", history, *edits, killed_by=killed_by, shortest=shortest,
                   profile=PRIORITY_PROFILE)


PRIORITY_BUGS: tuple[Mutant, ...] = (
    _priority("victim_kept_in_batch_pr23347",
              "vLLM issue #23347 (fixed by PR #23713): under the priority policy the running loop's victim, "
              "the lowest-priority running request, could be one the loop had already scheduled in the same "
              "call; it was removed from `running` but stayed in `scheduled_running_reqs` with its scheduled "
              "tokens and budget, and schedule() failed its assertion (more scheduled requests than running "
              "ones). The edit preempts the victim without handing anything back: its entry stays in the batch",
              _edit("schedule._preempt_victim", "priority.hand_back(step, victim)", "pass"),
              killed_by="PR2_victim_leaves_no_trace", shortest=7),
    _priority("preempted_drafts_kept_pr28558",
              "vLLM PR #28558: the hand-back of a victim scheduled earlier in the call restored its tokens "
              "and budget but left its entry in `scheduled_spec_decode_tokens`: the batch carried draft "
              "tokens for a request it did not schedule. The edit hands the entry back but leaves its drafts "
              "in the batch (an entry of no tokens carrying them)",
              _edit("priority.hand_back", "step.entries[:] = kept", """
                    step.entries[:] = kept + [replace(e, n=0, cached=0, samples=False, block_ids=())
                                              for e in step.entries if e.req == victim and e.drafts]"""),
              killed_by="PR2_victim_leaves_no_trace", shortest=7),
    _priority("victim_index_not_adjusted_pr49097",
              "vLLM issue #49097 (fixed in 0.34's `victim_index < req_index`): the loop's index moved back "
              "only when the victim had been scheduled in the same call; a victim visited and skipped "
              "before the index (under PP, a running request whose tokens are all in flight) was removed "
              "without it, so the next running request was passed over for the step with budget and blocks "
              "to spare. The edit moves the index back only for a victim already in the batch",
              _edit("schedule._preempt_victim", "i = priority.index_after_removal(step.state, victim, i)",
                    "i = priority.index_after_removal(step.state, victim, i) "
                    "if any(e.req == victim for e in step.entries) else i"),
              killed_by="PR3_running_loop_skips_nothing", shortest=13),
)
