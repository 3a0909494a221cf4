"""The trace checker's part for drafts handed over at submission (vLLM 0.33
with synchronous scheduling, `Profile.draft_source == "submission"`,
spec/drafts.py): the engine gives the scheduler the drafts proposed for a
batch right after submitting it (`EngineCore.post_step`), an event no trace
writes. The checker takes the spec's `hand_over_drafts` from what the trace
shows of it:

* a completion's `next_drafts` (the drafts each of its requests holds once
  it is applied, read by vLLM's recorder from the requests) are the
  completion's drafts, as for any profile;
* a `schedule` entry with drafts for a request whose sampling entry is
  still in flight schedules drafts handed over before that entry completed.
  The spec then schedules that entry too, and its invariants judge the
  second sampling entry in flight (S6);
* a `schedule` entry of a request with nothing in flight whose drafts
  differ from those it holds: the hand-off after its last completion (the
  engine step's `post_step`) gave it that many.
"""

from __future__ import annotations

from typing import Any

from flightcheck.spec import Config, State
from flightcheck.spec.drafts import hand_over_drafts


class DraftHandOff:
    """A mixin of replay.py's TraceChecker (it reads the checker's state,
    configuration and request slots)."""

    state: State
    cfg: Config
    slot: dict[str, int]

    def _takes_drafts_at_submission(self) -> bool:
        return self.cfg.rules.draft_source == "submission" and self.cfg.num_spec_tokens > 0

    def _hand_over_scheduled_drafts(self, entries: list[dict[str, Any]]) -> None:
        """Before a `schedule`: drafts the trace schedules for a request with
        a sampling entry in flight were handed over at that entry's submission."""
        if not self._takes_drafts_at_submission():
            return
        for x in entries:
            r, drafts = self.slot.get(x.get("req")), x.get("drafts", 0)
            if r is None:
                continue
            if self.state.entries_of(r):
                if drafts:
                    self._hand_over(r, drafts)
            elif drafts != self.state.requests[r].num_drafts:
                # Nothing of r in flight: the last `post_step` may have handed
                # over another count after the completion that wrote r's
                # `next_drafts` (with one stage it runs after
                # `update_from_output`; a request admitted holding drafts
                # keeps them through that completion): the entry shows it.
                self._hand_over(r, drafts)

    def _hand_over(self, r: int, count: int) -> None:
        after = hand_over_drafts(self.state, self.cfg, r, min(count, self.cfg.num_spec_tokens))
        if after is not None:
            self.state = after
