"""The trace checker's property of `skip_drafts` (docs/trace-format.md), a
`schedule` event's mark that the model runner proposes no drafts after its
batch (vLLM 0.34 `SchedulerOutput.skip_drafts`, set by `Scheduler.schedule`
when `can_skip_drafts` and `_drafts_unused` holds for every entry):

* SD1_skip_drafts_only_when_unused: every entry of a batch marked
  `skip_drafts` is one whose drafts are sure to go unused, judged on the
  spec's state before the batch: a non-final prefill chunk (its start plus
  its tokens fall short of the request's known tokens), or the entry that
  samples the request's last token under max_tokens even if every draft is
  rejected (its outputs plus the one it samples, plus one for a sampling
  entry still in flight under async scheduling, reach max_tokens); and the
  next entry of each of those requests schedules no drafts (the drafts
  skipped were never needed), but a streaming session's.

A streaming session is the exception to the second half, as vLLM 0.33 and
0.34 run it: `_drafts_unused`'s second case assumes that a request reaching
max_tokens finishes, but a resumable request's turn parks it instead
(`_handle_stopped_request`), and under async scheduling it keeps the k
placeholder drafts `AsyncScheduler._update_after_schedule` gave its last
entry; its next turn's first entry schedules them, so drafts the runner
skipped proposing are verified after all (campaign `--all-features
--spec-tokens 2 --lookahead` seed 12, async, indices 15, 21, 39, 58 and 61
on both versions; tests/data/vllm/lookahead). Not an output bug (rejection
sampling keeps the target's tokens), so vLLM's ground truth calls those runs
correct; the checker does not judge that half for sessions, and the
finding stays open (flightcheck/vllm/README.md, "Lookahead slots").

The mark is read only when present (a writer without lookahead slots writes
none, and its absence is not judged: vLLM sets it only with
`can_skip_drafts`, which the spec does not model).
"""

from __future__ import annotations

from typing import Any

from flightcheck.spec import Config, State
from flightcheck.spec.state import Request

SD1 = "SD1_skip_drafts_only_when_unused"


def drafts_sure_unused(q: Request, start: int, n: int) -> bool:
    """vLLM 0.34 `Scheduler._drafts_unused` on the spec's request before the entry."""
    if start + n < q.num_tokens:
        return True                                  # a non-final prefill chunk samples nothing
    least_outputs = q.num_output + 1 + (1 if q.placeholders > 0 else 0)
    return least_outputs >= q.max_tokens             # it samples the last token: no step verifies them


class SkipDrafts:
    """A mixin of replay.py's TraceChecker (its state, names and `_violation`)."""

    state: State
    cfg: Config

    def _check_skip_drafts(self, event: dict[str, Any], entries: Any) -> None:
        """Before the spec applies the `schedule` (`entries`: the spec's, equal to the trace's)."""
        skipped: set[int] = getattr(self, "_skipped_drafts", set())
        for e in entries:
            if e.req in skipped and e.drafts:
                raise self._violation(SD1, f"{self._name(e.req)} schedules {e.drafts} drafts in the batch after "
                                           "one marked skip_drafts: its drafts were needed")
        skipped = skipped - {e.req for e in entries}
        if event.get("skip_drafts"):
            for e in entries:
                if not drafts_sure_unused(self.state.requests[e.req], e.start, e.n):
                    q = self.state.requests[e.req]
                    raise self._violation(SD1, f"a batch marked skip_drafts schedules {self._name(e.req)} "
                                               f"from {e.start} for {e.n} tokens of {q.num_tokens}, "
                                               f"{q.num_output} of {q.max_tokens} outputs: its drafts may be used")
            skipped |= {e.req for e in entries if not self.state.requests[e.req].resumable}
        self._skipped_drafts = skipped

    @staticmethod
    def _violation(prop: str, message: str) -> Exception:        # replay.py's
        raise NotImplementedError

    def _name(self, r: int) -> str:                              # replay.py's
        raise NotImplementedError
