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
  skipped were never needed), but a padded admission's.

A padded admission is the one exception to the second half, and it is no
use of the skipped drafts: vLLM 0.33/0.34 `Scheduler.schedule`'s waiting
loop pads a request admitted with exactly one token left past its computed
ones (when some are computed, `num_computed_tokens > 0`, as a streaming
session's next turn of one token has, or a running request is already in
the batch) to `1 + k` tokens with k placeholder drafts (`pad_spec_decode`, vLLM PR #55126, "Pad resumed
speculative decode requests"), for the cudagraph's uniform shape. Those
placeholders are not the drafts a runner would have proposed after the
marked batch: a session's stopped turn drops its drafts and placeholders
(`Scheduler._handle_stopped_request`: `spec_token_ids = []`,
`num_output_placeholders = 0`), and the V2 runner re-adds the admitted
request (`GPUModelRunner.add_requests`: `_remove_request`, then
`RequestState.add_request` zeroes its draft row), so the padding is
verified whether or not the batch before was marked: a verify wasted by
design, no output changed. The campaign's session runs that showed it
(`--all-features --spec-tokens 2 --lookahead` seed 12, async, indices 15,
21, 39, 58 and 61: a turn ending at max_tokens, marked, then a next turn
of one token) are vLLM's correct runs, as its ground truth says;
tests/data/vllm/lookahead keeps one, and the minimal workload that shows
it under sync and async scheduling alike (session-padded-turn.workload.json;
tests/test_vllm_skip_drafts_padded_turn.py). Any other entry of a session
after a marked one that schedules drafts is rejected as any request's.

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
            if e.req in skipped and e.drafts and not self._padded_admission(e):
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
            skipped |= {e.req for e in entries}
        self._skipped_drafts = skipped

    def _padded_admission(self, e: Any) -> bool:
        """An entry admitted from the waiting queue (not running before this
        batch) with the k placeholder drafts vLLM 0.33/0.34's waiting loop
        pads it with (`Scheduler.schedule`, `pad_spec_decode`): no drafts a
        runner proposed, so none the marked batch skipped (module docstring)."""
        return e.req not in self.state.running_set and e.drafts == self.cfg.num_spec_tokens

    @staticmethod
    def _violation(prop: str, message: str) -> Exception:        # replay.py's
        raise NotImplementedError

    def _name(self, r: int) -> str:                              # replay.py's
        raise NotImplementedError
