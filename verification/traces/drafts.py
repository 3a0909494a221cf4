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
* a `schedule` entry of a request with nothing in flight whose drafts
  differ from those it holds: the hand-off after its last completion (the
  engine step's `post_step`) gave it that many;
* a request the `schedule` preempts, with nothing in flight or with its
  sampling entry in flight: the hand-off may have given it drafts whose
  slots found no room (it preempted itself, or another), which no entry
  shows; the checker takes the first count (0..k each, the least first)
  under which the spec's schedule is the trace's (`_hand_over_to_preempted`).
  With two stages the next `schedule()` counts the drafts proposed for the
  entry in flight (0.33.0/0.34.0 `Scheduler.schedule`'s running loop:
  `num_tokens_with_spec - num_computed_tokens`), `allocate_slots` finds no
  room for them and their lookahead slots, and the loop preempts
  `self.running[-1]`, the request itself (`_preempt_request`); the token in
  flight comes back stale (seed 392 index 47, tests/test_vllm_hunt402_cases.py).
"""

from __future__ import annotations

from itertools import product
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
    names: list[str]
    block_map: dict[int, int]       # replay.py's: trace block id -> spec block id
    # (and, from the mixins after this one in TraceChecker's order, connector.py's
    # `_parked_table` and sessions.py's `_session_table`: no stubs here, which would
    # shadow them)

    def _takes_drafts_at_submission(self) -> bool:
        return self.cfg.rules.draft_source == "submission" and self.cfg.num_spec_tokens > 0

    def _drafts_after_completion(self, count: int) -> int:
        """The drafts a sampling entry's completion leaves its request: the
        trace's `next_drafts`, or none where they are replaced right after
        (drafts at submission, D = 1: `post_step` follows the completion)."""
        if self._takes_drafts_at_submission() and self.cfg.queue_depth == 1:
            return 0
        return count

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

    def _hand_over_to_preempted(self, event: dict[str, Any]) -> None:
        """Before a `schedule` that preempts requests: if the spec's schedule
        is not the trace's, the least counts handed over to the preempted
        RUNNING requests that make it so, if any (their drafts may have
        driven them there: they are part of what `allocate_slots` must find
        room for). One with an entry in flight qualifies where that entry
        samples (`hand_over_drafts`' guard refuses the others)."""
        if not self._takes_drafts_at_submission():
            return
        held = [r for r in (self.slot.get(name) for name in event.get("preempted", ()))
                if r is not None and self.state.requests[r].status is Status.RUNNING]
        k = self.cfg.num_spec_tokens
        if not held or (k + 1) ** len(held) > self.UNSEEN_TRIES or self._schedules_as(self.state, event):
            return
        for counts in sorted(product(range(k + 1), repeat=len(held)), key=sum):
            state: State | None = self.state
            for r, count in zip(held, counts):
                state = hand_over_drafts(state, self.cfg, r, count) if state is not None else None
            if state is not None and self._schedules_as(state, event):
                self.state = state
                return

    def _schedules_as(self, state: State, event: dict[str, Any]) -> bool:
        """Whether the spec's schedule from `state` has the trace's entries
        (request, start, tokens, drafts), preemptions and, where the trace
        names them, blocks: drafts a preempted request was handed, that no
        entry shows (a priority victim's entry is taken back), can change
        nothing but the blocks its own allocation took before the preemption
        freed them back to the head of the free queue with its table (0.34.0
        `campaign --versions 0.34.0 --all-features --spec-tokens 3
        --lookahead --stages 1 --seed 391` index 14: r2's 3 drafts and 3
        lookahead slots took 2 blocks, not 1, and r3 was given them first)."""
        scheduled = schedule(state, self.cfg)
        if scheduled is None:
            return False
        want = [(self.names[e.req], e.start, e.n, e.drafts) for e in scheduled.entries]
        got = [(x["req"], x["start"], x["n"], x.get("drafts", 0)) for x in event["entries"]]
        return want == got and [self.names[r] for r in scheduled.preempted] == list(event.get("preempted", ())) \
            and self._blocks_as(scheduled.entries, event["entries"])

    def _blocks_as(self, spec_entries: list[Any], trace_entries: list[dict[str, Any]]) -> bool:
        """Whether the spec's entries take the trace's blocks under the
        checker's renaming so far (replay.py `_check_block_ids`, without
        raising); true where the trace names no blocks."""
        if any("block_ids" not in x for x in trace_entries):
            return True
        renaming = dict(self.block_map)
        for e, x in zip(spec_entries, trace_entries):
            ours = (self._parked_table(e.req) or self._session_table(e.req)) + tuple(e.block_ids)  # type: ignore[attr-defined]
            if len(ours) != len(x["block_ids"]) or any(renaming.setdefault(t, b) != b
                                                       for t, b in zip(x["block_ids"], ours)):
                return False
        return True
