"""Reset and pause's bugs, as mutants (spec/reset_pause.py, docs/request-states.md):
each a small named edit of the spec function the bug lives in, named for
the vLLM pull request that reports it (`..._prNNNNN`) or, where no release
had it, synthetic; with what broke and the property that kills it.

Every one is hunted under `vllm-0.34-async` on the reset-and-pause models
(verification/reset_pause_models.py), kept out of the mutants of a run
without reset and pause as the KV connector's are.
"""

from __future__ import annotations

from flightcheck.verification.mutants.spec import Mutant, _edit, _mutant

# The profile every reset-and-pause mutant is hunted under.
RESET_PAUSE_PROFILE = "vllm-0.34-async"


def _rp(name: str, kind: str, history: str, *edits, killed_by: str, shortest: int) -> Mutant:
    return _mutant(name, kind, history, *edits, killed_by=killed_by, shortest=shortest,  # type: ignore[arg-type]
                   profile=RESET_PAUSE_PROFILE)


RESET_PAUSE: tuple[Mutant, ...] = (
    _rp("placeholders_kept_on_preemption_pr38624", "historical",
        "vLLM PR #38624: `num_output_placeholders = 0` (and the discard of the tokens in flight) was "
        "done only by `reset_prefix_cache`'s forced preemption; a preemption of the running loop "
        "(memory pressure, priority) went through `_preempt_request` without it, so the resumed "
        "request kept placeholders no entry stands for. The edit leaves the reset path as it is "
        "and drops the reset of the placeholders from the running loop's preemption",
        _edit("schedule._mark_stale_output", "_reset_placeholders(step, victim)", "pass"),
        killed_by="IA1_placeholders", shortest=8),
    _rp("reset_discards_drained_output_pr42117", "historical",
        "vLLM PR #42117 (issue #42043): `reset_prefix_cache` marked every preempted request to discard "
        "its latest async output whether or not one was in flight; after `pause_generation(mode="
        "'keep', clear_cache=True)` had drained the engine, the first token sampled after the resume "
        "was thrown away. The edit counts one stale token at the reset even with nothing in flight",
        _edit("reset_pause._preempt_dropping_output", "num_stale=req.num_in_flight",
              "num_stale=max(req.num_in_flight, 1)"),
        killed_by="RP2_reset_drops_in_flight", shortest=4),
    _rp("pause_clear_cache_keeps_running_pr34382", "historical",
        "vLLM PR #34382: a pause that clears the cache called `reset_prefix_cache()` without "
        "`reset_running_requests`, so in keep mode the requests still running held their blocks and "
        "the reset failed, the cache kept. The edit ignores `running`",
        _edit("reset_pause.reset", "running", "False"),
        killed_by="RP2_reset_drops_in_flight", shortest=3),
    _rp("stale_rejections_settled_pr46066", "historical",
        "vLLM PR #46066 (merged 2026-06-30): under async scheduling with speculative decoding, "
        "`reset_prefix_cache(reset_running_requests=True)` zeroed the reset requests' placeholders and "
        "marked their frames in flight for discard, but `update_from_output` took a returning stale "
        "frame's rejected drafts back (`num_computed_tokens -= num_rejected`, `num_output_placeholders "
        "-= num_rejected`, each behind its `> 0` guard) before the discard: from the resumed request's "
        "fresh counters, which went negative. vLLM 0.33/0.34 skip a drop-mode stale output first "
        "(`if output_is_stale and request.drop_stale_output: continue`) and guard the adjustment with "
        "`if not output_is_stale`. The edit takes a dropped output's drafts back as rejected (every "
        "draft rejected: one outcome the verifier may return) before dropping it",
        _edit("actions._complete_by_name", """
              if not has_output:
                  continue""", """
              if not has_output:
                  req = state.requests[holder]
                  if stale and req.drop_stale and e.drafts:
                      state = state.with_request(
                          holder, num_computed=req.num_computed - e.drafts if req.num_computed > 0 else req.num_computed,
                          placeholders=req.placeholders - e.drafts if req.placeholders > 0 else req.placeholders)
                  continue"""),
        killed_by="IA1_placeholders", shortest=9),
    _rp("reset_delivers_stale_output", "synthetic",
        "`reset_prefix_cache` preempts in deliver mode (`_preempt_request` without "
        "`drop_stale_output=True`): the reset requests' outputs in flight are appended, though their "
        "positions will be recomputed",
        _edit("reset_pause._preempt_dropping_output", "drop_stale=True", "drop_stale=False"),
        killed_by="RP2_reset_drops_in_flight", shortest=3),
    _rp("drop_mode_output_applied", "synthetic",
        "`update_from_output` applies a stale output in drop mode (the `drop_stale_output` test "
        "left out): a reset request's output in flight is appended as an orphan's",
        _edit("actions._output_applied", "not (_drains_stale(req) and req.drop_stale)", "True"),
        killed_by="RP3_reset_output_never_applied", shortest=4),
    _rp("paused_all_runs_running_loop", "synthetic",
        "PAUSED_ALL leaves the running loop its token budget (`token_budget = 0` left out): a paused "
        "engine goes on decoding its running requests",
        _edit("reset_pause.runs_running_loop", "state.pause is not Pause.PAUSED_ALL", "True"),
        killed_by="RP1_paused_schedules_nothing", shortest=5),
    _rp("paused_new_admits_waiting", "synthetic",
        "PAUSED_NEW takes the waiting queue too (the `_pause_state == UNPAUSED` test of the waiting "
        "loop left out): a paused engine admits new requests",
        _edit("reset_pause.takes_waiting_queue", "state.pause is Pause.UNPAUSED",
              "state.pause is not Pause.PAUSED_ALL"),
        killed_by="RP1_paused_schedules_nothing", shortest=3),
)
