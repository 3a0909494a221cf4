"""Streaming sessions' historical bugs, as mutants (docs/request-states.md,
"Streaming sessions"): each a small named edit of the spec function it lives
in (spec/sessions.py, or the waiting loop's seat in spec/schedule.py), named
for the vLLM (or vllm-omni) pull request or issue that reports it
(`..._prNNNNN`, `..._omniNNNN`), with what broke and the property that kills
it; one synthetic, to show that SS4 carries weight.

Every one is hunted under `vllm-0.34-async` on the model
`session_models.SESSION_MUTANT_MODELS` names, by tests/test_spec_sessions.py.
"""

from __future__ import annotations

from flightcheck.verification.mutants.spec import Mutant, _edit, _mutant

# The profile every session mutant is hunted under.
SESSION_PROFILE = "vllm-0.34-async"


def _ss(name: str, kind: str, history: str, *edits, killed_by: str, shortest: int) -> Mutant:
    return _mutant(name, kind, history, *edits, killed_by=killed_by, shortest=shortest,  # type: ignore[arg-type]
                   profile=SESSION_PROFILE)


SESSION_MUTANTS: tuple[Mutant, ...] = (
    _ss("continuation_applied_while_running_pr52693", "historical",
        "vLLM issue #52693 (PR #52717): an input sent while the session's previous turn was still RUNNING was "
        "applied at once and the session enqueued for waiting, so it sat in `running` and a waiting queue at "
        "once (the waiting loop then raised 'Invalid request status: RUNNING' and killed the engine core). "
        "The edit applies an input sent to a running session and appends it to `waiting`",
        _edit("sessions.send_input", """
              if q.status is not Status.WAITING_FOR_STREAMING_REQ:
                  return state.with_request(r, queued_inputs=q.queued_inputs + (sent,))""", """
              if q.status is Status.RUNNING and sent != END_OF_SESSION:
                  state = replace(state, waiting=state.waiting + (r,))
                  return state.with_request(r, prompt_len=q.num_tokens - 1 + sent[0], num_output=0, max_tokens=sent[1])
              if q.status is not Status.WAITING_FOR_STREAMING_REQ:
                  return state.with_request(r, queued_inputs=q.queued_inputs + (sent,))"""),
        killed_by="S10_queues_and_budgets", shortest=3),
    _ss("turn_output_not_dropped_pr52765", "historical",
        "vLLM PR #52765 (the async half of #52693): at a turn's end the batches of the old turn still in "
        "flight were not marked stale, so their outputs, returned after the next input was taken, were "
        "appended to the new turn (and drove `num_output_placeholders` below 0). The edit leaves the stale "
        "counter and drop mode as they were at the stop",
        _edit("sessions.stop_session", "drop_stale=True", "drop_stale=q.drop_stale"),
        _edit("sessions.stop_session", "num_stale=q.num_in_flight", "num_stale=q.num_stale"),
        killed_by="SS1_old_output_never_bound", shortest=7),
    _ss("session_keeps_drafts_pr42655", "historical",
        "vLLM issue #42655 (PR #43683): a session rebuilt for its next input kept the draft tokens of its "
        "previous turn, so the scheduler sent drafts for a request the worker no longer had (a KeyError in "
        "the model runner). The edit keeps the drafts at the stop",
        _edit("sessions.stop_session", "num_drafts=0", "num_drafts=q.num_drafts"),
        killed_by="SS3_waiting_session_holds_blocks", shortest=3),
    _ss("stop_keeps_optimistic_tokens_omni5183", "historical",
        "vllm-omni PR #5183: a segment stop under async scheduling cleared the output placeholders without "
        "taking their optimistic tokens back from num_computed_tokens, so the resumed session had nothing "
        "left to schedule (and vLLM's `keep_end >= num_computed_tokens` assertion fails on its next input). "
        "The edit clears the placeholders but keeps num_computed",
        _edit("sessions.stop_session", "num_computed=q.num_computed - q.placeholders", "num_computed=q.num_computed"),
        killed_by="SS3_waiting_session_holds_blocks", shortest=5),
    _ss("waiting_session_seat_freed", "synthetic",
        "the waiting loop counts only `running` against max_num_seqs, not the sessions waiting for input "
        "(`num_waiting_for_streaming_input`): a request is admitted into the seat a parked session holds",
        _edit("schedule._has_free_seat", """
              if step.cfg.streaming_sessions and sessions.seats_taken(step.state) >= step.cfg.max_num_seqs:
                  return False""", ""),
        killed_by="SS4_waiting_session_keeps_seat", shortest=5),
)
