"""The trace checker's part for drafts handed over at submission (vLLM 0.33
with synchronous scheduling, `Profile.draft_source == "submission"`,
spec/drafts.py): the engine gives the scheduler the drafts proposed for a
batch right after submitting it (`EngineCore.post_step`), an event no trace
writes. The checker takes the spec's `hand_over_drafts` from what the trace
shows of it:

* a completion's `next_drafts` (the drafts each of its requests holds once
  it is applied, read by vLLM's recorder from the requests) are the
  completion's drafts, as for any profile, but with one batch in flight at
  most (D = 1): the engine step that completes a batch is the one that
  submitted it, and its `post_step` hands the scheduler that batch's drafts
  after the completion, replacing what its requests held when the output
  was applied (`update_draft_token_ids` sets or clears every one that is not
  finished). What they held then is a leftover: a streaming session parked
  by its turn's last token is given that batch's drafts while it waits
  (`update_draft_token_ids` skips only finished requests), the waiting loop
  admits its next turn without reading them, and they are still there when
  that turn's first batch completes. The completion then brings none, and
  the next `schedule` shows post_step's count (`_backfill_drafts`);
* a `schedule` entry with drafts for a request whose sampling entry is
  still in flight schedules drafts handed over before that entry completed.
  The spec then schedules that entry too, and its invariants judge the
  second sampling entry in flight (S6);
* with one batch in flight at most (D = 1), no completion shows the drafts
  `post_step` hands over after it, so a request the next `schedule` leaves
  out shows none: the trace's batch is the only witness. When it preempts
  such a request, which its drafts may have driven there (they are part of
  what `allocate_slots` must find room for, and none was left), the checker
  takes the counts (0..k each, the least first) under which the spec's
  batch and preemptions are the trace's (`_hand_over_unseen_drafts`).
"""

from __future__ import annotations

import itertools
from typing import Any

from flightcheck.spec import Config, State, Status, schedule
from flightcheck.spec.drafts import hand_over_drafts


class DraftHandOff:
    """A mixin of replay.py's TraceChecker (it reads the checker's state,
    configuration and request slots)."""

    state: State
    cfg: Config
    slot: dict[str, int]
    # the unseen counts tried for one schedule at most ((k + 1) ** requests)
    UNSEEN_TRIES = 256

    def _takes_drafts_at_submission(self) -> bool:
        return self.cfg.rules.draft_source == "submission" and self.cfg.num_spec_tokens > 0

    def _drafts_after_completion(self, count: int) -> int:
        """The drafts a sampling entry's completion leaves its request: the
        trace's `next_drafts`, or none where they are replaced right after
        (drafts at submission, D = 1: `post_step` follows the completion)."""
        if self._takes_drafts_at_submission() and self.cfg.queue_depth == 1:
            return 0
        return count

    def _hand_over_unseen_drafts(self, event: dict[str, Any]) -> None:
        """Before a `schedule` that preempts requests whose drafts no event
        showed (drafts at submission, D = 1: a request running with no entry
        in flight, whose last entry sampled): the least counts under which
        the spec forms the trace's batch and preemptions, if any."""
        if not (self._takes_drafts_at_submission() and self.cfg.queue_depth == 1):
            return
        unseen = [r for r in (self.slot.get(name) for name in event.get("preempted", []))
                  if r is not None and self._drafts_unseen(r)]
        k = self.cfg.num_spec_tokens
        if not unseen or (k + 1) ** len(unseen) > self.UNSEEN_TRIES:
            return
        trace_batch = [(x.get("req"), x.get("start"), x.get("n"), x.get("drafts", 0)) for x in event["entries"]]
        for counts in sorted(itertools.product(range(k + 1), repeat=len(unseen)), key=sum):
            state = self.state
            for r, count in zip(unseen, counts):
                state = hand_over_drafts(state, self.cfg, r, count) or state
            scheduled = schedule(state, self.cfg)
            if scheduled is None:
                continue
            batch = [(self._name(e.req), e.start, e.n, e.drafts) for e in scheduled.entries]
            if batch == trace_batch and [self._name(r) for r in scheduled.preempted] == event["preempted"]:
                self.state = state
                return

    def _drafts_unseen(self, r: int) -> bool:
        q = self.state.requests[r]
        return (q.status is Status.RUNNING and q.num_drafts == 0 and q.num_output > 0
                and not q.is_prefill_chunk and not self.state.entries_of(r))

    def _hand_over_scheduled_drafts(self, entries: list[dict[str, Any]]) -> None:
        """Before a `schedule`: drafts the trace schedules for a request with
        a sampling entry in flight were handed over at that entry's submission."""
        if not self._takes_drafts_at_submission():
            return
        for x in entries:
            r, drafts = self.slot.get(x.get("req")), x.get("drafts", 0)
            if r is None or not drafts or not self.state.entries_of(r):
                continue
            self._hand_over(r, drafts)

    def _hand_over(self, r: int, count: int) -> None:
        after = hand_over_drafts(self.state, self.cfg, r, min(count, self.cfg.num_spec_tokens))
        if after is not None:
            self.state = after
