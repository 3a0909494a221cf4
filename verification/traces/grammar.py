"""check-trace's reading of structured output (docs/trace-format.md,
`grammar_compiled`, `grammar_failed`; spec/grammar.py): a mixin of
`TraceChecker`.

A trace whose config says `structured_output: true` is checked with the
spec's grammars: an arrival with `structured: true` waits for its grammar,
`grammar_compiled` / `grammar_failed` are the backend's events (written
before the `schedule()` call that may first see them), and a failed
grammar's finish by "error" follows the `complete` event of the update that
finished it. An empty `schedule()` call the trace only notes
(`empty_batches_before`, synchronous scheduling) may still meet a failed
grammar: its record is taken from the spec's step (`note_grammar_errors`);
and the noted completion of an empty batch finishes those recorded
(`finish_grammar_errors_at_empty_completion`). Under async scheduling the
checker moves empty batches itself: a finish by "error" of a request whose
grammar failed is caught up with the empty call and completion that
finished it (`catch_up_grammar_error`), unless a noted empty call whose
spec step forms nothing too met it first
(`note_grammar_errors_at_async_empty_call`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from flightcheck.spec.actions import after_output
from flightcheck.spec.schedule import Scheduled, is_empty_step, schedule
from flightcheck.spec.state import Grammar, State
from flightcheck.spec.transitions import CompileGrammar, FailGrammar, step


class GrammarEvents:
    state: State
    cfg: Any

    def _on_grammar_compiled(self, event: dict) -> None:
        self._grammar_event(event, CompileGrammar)

    def _on_grammar_failed(self, event: dict) -> None:
        self._grammar_event(event, FailGrammar)

    def _grammar_event(self, event: dict, kind: type) -> None:
        r = self._req(event)                                     # type: ignore[attr-defined]
        action = kind(r)
        self._apply(action, step(self.state, self.cfg, action), event["ev"])   # type: ignore[attr-defined]

    def note_grammar_errors(self, scheduled: Scheduled | None) -> None:
        """An empty schedule() call the trace notes but the checker does not
        replay: the failed grammars its waiting loop met are recorded."""
        if scheduled is not None and scheduled.state.grammar_errors != self.state.grammar_errors:
            self.state = replace(self.state, grammar_errors=scheduled.state.grammar_errors)

    def note_grammar_errors_at_async_empty_call(self) -> None:
        """An empty schedule() call noted under async scheduling: where the
        spec's step at this state forms nothing too, the failed grammars its
        waiting loop meets are recorded then, as vLLM's call recorded them
        (under the priority policy a request arriving later may rank ahead
        of the failed one, so that the catch-up at the finish would no longer
        reach it). Otherwise the catch-up at the finish decides."""
        if not self.cfg.structured_output or not any(q.grammar is Grammar.FAILED and q.status.is_active
                                                     for q in self.state.requests):
            return
        scheduled = schedule(self.state, self.cfg)
        if scheduled is not None and is_empty_step(scheduled):
            self.note_grammar_errors(scheduled)

    def complete_noted_empty_batch(self) -> None:
        """A noted empty batch's completion. Under async scheduling, where
        the spec's oldest batch in flight is an empty one the checker queued,
        it completes here, as vLLM's did (else a later drain would finish a
        grammar failed meanwhile an update too early); otherwise the failed
        grammars recorded are finished as its update would, and under async
        scheduling the empty batch the checker queues for that call later
        completes as soon as it is queued (`_catch_up_empty_calls`)."""
        if self.cfg.rules.output_placeholders:
            if self.state.in_flight and not self.state.in_flight[0]:
                self._drain_empty_batches(oldest_only=True)      # type: ignore[attr-defined]
                return
            self.pending_empty_completions += 1                  # type: ignore[attr-defined]
        self.finish_grammar_errors_at_empty_completion()

    def finish_grammar_errors_at_empty_completion(self) -> None:
        """A noted empty batch's completion (synchronous scheduling): the end
        of its `update_from_output` finishes the failed grammars recorded."""
        if not self.state.grammar_errors:
            return
        before, after = self.state, after_output(self.state, self.cfg)
        self.state = after
        for r, (b, a) in enumerate(zip(before.requests, after.requests)):
            if a.status.is_finished and not b.status.is_finished:
                self.finished_now[r] = a.status                  # type: ignore[attr-defined]

    def catch_up_grammar_error(self, event: dict) -> None:
        """A finish by "error" the spec has not made yet, of a request whose
        grammar failed: an empty schedule() call met it and an empty batch's
        completion finished it (calls the checker does not replay one by
        one); taken here if the spec's waiting loop reaches the request."""
        r = self.slot.get(event["req"])                          # type: ignore[attr-defined]
        if event["reason"] != "error" or not self.cfg.structured_output or r is None \
                or r in self.finished_now:                       # type: ignore[attr-defined]
            return
        q = self.state.requests[r]
        if q.grammar is not Grammar.FAILED or not q.status.is_active:
            return
        if r not in self.state.grammar_errors:
            self.note_grammar_errors(schedule(self.state, self.cfg))
        self.finish_grammar_errors_at_empty_completion()
