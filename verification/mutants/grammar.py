"""Structured output's bugs, as mutants (docs/request-states.md, "Structured
output"): each a small named edit of the spec function it lives in, named
for the vLLM issue that reports it (`..._NNNNN`) or, for the synthetic ones,
for the rule it breaks; with what broke and the property that kills it.

Hunted under `vllm-0.34-async` on the model `grammar_mutant_model` names
(verification/grammar_models.py).
"""

from __future__ import annotations

from flightcheck.verification.mutants.spec import Mutant, _edit, _mutant

# The profile every grammar mutant is hunted under.
GRAMMAR_PROFILE = "vllm-0.34-async"


def _g(name: str, kind: str, history: str, *edits, killed_by: str, shortest: int) -> Mutant:
    return _mutant(name, kind, history, *edits, killed_by=killed_by, shortest=shortest,  # type: ignore[arg-type]
                   profile=GRAMMAR_PROFILE)


GRAMMAR_BUGS: tuple[Mutant, ...] = (
    _g("stale_fsm_bitmask_29379", "historical",
       "vLLM issue #29379 (async scheduling + structured output: \"Failed to advance FSM\"): a structured "
       "request scheduled again while its previous output was still in flight had its bitmask built at "
       "once, from an FSM not yet advanced by that output; the token sampled under the stale mask was "
       "then refused by the FSM and the request terminated. vLLM defers the batch's sampling until the "
       "oldest output is processed (`pending_structured_output_tokens`). The edit never defers",
       _edit("grammar.mask_of", """
             if q.placeholders - own > 0:
                 return DEFERRED""", ""),
       killed_by="G3_fsm_never_refuses", shortest=6),
    _g("illegal_draft_verified_49694", "historical",
       "vLLM issue #49694 (open; ngram spec decode + structured output + async scheduling): the "
       "scheduler marks a grammar-illegal draft (-1) in its scheduler output, but the model runner "
       "verifies its own copy of the drafts, so the verifier accepts the illegal draft and the FSM "
       "refuses it (\"Failed to advance FSM\", HTTP 500s, silent truncation). The edit lets the "
       "verifier accept drafts past the first illegal one",
       _edit("grammar.verifier_accepts", "return num_accepted <= illegal_from", "return True"),
       killed_by="G3_fsm_never_refuses", shortest=6),
    _g("failed_grammar_left_waiting_pr45012", "historical",
       "vLLM PR #45012 (open; the failure is handled since PR #47312, merged 2026-07-20, in 0.33 and "
       "0.34's `_try_promote_blocked_waiting_request`): a grammar whose background compilation raised "
       "was never recorded as failed, so its request stayed in WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR, "
       "skipped by every waiting loop, and its client waited until it timed out. The edit skips a "
       "failed grammar's request as it skips a compiling one (nothing in `grammar_errors`)",
       _edit("grammar.blocked_on_grammar", "return replace(state, grammar_errors=state.grammar_errors | {r}), True",
             "return state, True"),
       killed_by="L2_no_deadlock", shortest=2),
    _g("compiling_grammar_scheduled", "synthetic",
       "The waiting loop takes a request whose grammar is still compiling for a ready one (it skips "
       "only a failed grammar): the request runs without a grammar",
       _edit("grammar.blocked_on_grammar", "q.grammar is Grammar.READY",
             "q.grammar in (Grammar.READY, Grammar.COMPILING)"),
       killed_by="G1_no_run_while_compiling", shortest=2),
    _g("fsm_advanced_by_drafts_scheduled", "synthetic",
       "The FSM is advanced by every token the output could bring (the sampled token and every draft "
       "scheduled) instead of the tokens accepted: it runs past a rejected draft",
       _edit("grammar.advance_fsm", "return evolve(after, fsm=after.fsm + appended)",
             "return evolve(after, fsm=after.fsm + 1 + e.drafts)"),
       killed_by="G2_fsm_tracks_output", shortest=6),
)
