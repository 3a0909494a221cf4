"""`update_from_output()`: a completed batch applied entry by entry, in
placement order (a mixin of `Scheduler`, scheduler.py).

Each entry's output is bound to a request (`_bind`): by default to the
incarnation it was scheduled for (`_fate`: live, orphaned or superseded,
completion.py); under vLLM 0.33's counters by id and the counters
(`_fate_by_counters`); as vLLM 0.8.x released, to the RUNNING request of its
id (`outputs_to_running_by_id`). Then the tokens it sampled are taken
(`_tokens_taken`), rejected drafts subtracted, tokens appended with the stop
checks (completion.py), and under async scheduling the output placeholders
settled. Each version's difference is a profile constant (profiles.py),
read once by `Scheduler.__init__` and tested at one step here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from .completion import LIVE, ORPHANED, SUPERSEDED, Fate, append_sampled, count_rejected
from .config import SchedulerConfig
from .kv_cache_manager import KVCacheManager
from .outputs import EngineCoreOutput, ModelRunnerOutput, RequestData, SchedulerOutput
from .request import Request, RequestStatus

RUNNING = RequestStatus.RUNNING               # a global: see completion.LIVE


class OutputUpdate:
    """The steps of `update_from_output`. `Scheduler` holds the state below
    and the steps shared with `schedule()` and `finish_requests`
    (`_free_request`, `_drop_in_flight_mark`)."""

    config: SchedulerConfig
    kv_cache_manager: KVCacheManager
    requests: dict[str, Request]
    waiting: deque[Request]
    running: list[Request]
    scheduled_req_ids: set[str]
    num_steps: int
    _one_batch_per_request: bool
    _stale_output_counters: bool
    _stop_tokens_first: bool
    _async: bool
    _outputs_to_running_by_id: bool
    _worker_decides_sampling: bool
    _drafts_from_every_output: bool
    _outputs_by_id_alone: bool
    _drafts_with_output: bool
    _settles_blocks_with_drafts: bool
    connector: Any
    _handle_stopped: Any

    def fate_of(self, entry: RequestData) -> Fate:
        """What becomes of this in-flight entry's output if it completed now."""
        return self._predicted_fate(entry, self.requests.get(entry.req_id))

    def incarnation_fate_of(self, entry: RequestData) -> Fate:
        """Which incarnation this in-flight entry was scheduled for, read
        without changing anything (`_fate`): LIVE, ORPHANED (its request was
        preempted since and not rescheduled) or SUPERSEDED. Under vLLM 0.33's
        drop mode an orphaned entry's output is discarded (`fate_of` says
        SUPERSEDED) while the entry is still the preempted incarnation's."""
        return self._fate(entry, self.requests.get(entry.req_id))

    def _predicted_fate(self, entry: RequestData, request: Request | None) -> Fate:
        """The fate `update_from_output` will give the entry, read without
        changing anything: by incarnation (`_bound_fate`); under vLLM 0.33's
        counters an orphaned entry of a drop-mode request is discarded. (The
        counters decide in `update_from_output`; in a correct run they agree
        with this reading: a deliver-mode request is not resumed while its
        stale share is in flight, so its stale entries are its orphans.) As
        vLLM 0.33 released (`outputs_by_id_alone`), the counters alone."""
        if self._outputs_by_id_alone:
            return _fate_by_stale_share(request)
        fate = self._bound_fate(entry, request)
        if fate is ORPHANED and self._stale_output_counters and request is not None \
                and request.drop_stale_output:
            return SUPERSEDED
        return fate

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """Apply a completed batch's outputs, entry by entry, in placement order."""
        self.num_steps += 1
        # The KV connector's reports, its failures applied first (kv_transfer.py).
        kv_skipped = self.prepare_kv_reports(scheduler_output) if self.connector is not None else None
        outputs: list[EngineCoreOutput] = []
        finished_running = False
        counters = self._stale_output_counters
        for entry in scheduler_output.entries:
            request = self.requests.get(entry.req_id)
            fate = self._fate_by_counters(entry, request) if counters else self._bound_fate(entry, request)
            if fate is SUPERSEDED or (kv_skipped and entry.req_id in kv_skipped):
                continue                      # rescheduled, aborted or finished since (or failing): dropped
            assert request is not None
            token_ids = self._tokens_taken(entry, request, fate, model_runner_output)
            if fate is LIVE:
                self._settle_live(request, entry)
            if not token_ids:
                if self._drafts_from_every_output:
                    _take_proposed_drafts(request, entry, fate, model_runner_output)
                continue
            was_running = request.status == RUNNING
            # Drafts proposed for the next step, looked up only when the model
            # proposes any and they come with the output (None: they do not,
            # profiles.py `placeholder_drafts`, `drafts_handed_over_at_submission`;
            # the drafts held are left alone).
            proposed_drafts: Sequence[int] | None = None
            if self._drafts_with_output:
                proposed_drafts = model_runner_output.drafts_of(entry.req_id) \
                    if model_runner_output.spec_token_ids is not None else ()
            outputs.append(self._apply_sampled(request, entry, token_ids, fate, proposed_drafts))
            self._advance_grammar(request, entry, outputs[-1])               # grammar.py
            if request.is_finished() and request.resumable and not self._handle_stopped(request, was_running):
                continue                      # a streaming session's turn ended (sessions.py)
            if request.is_finished():
                if was_running:
                    finished_running = True   # leaves `running` in one pass below
                else:
                    self._remove_waiting(request)  # orphaned: finished while PREEMPTED
                self._drop_in_flight_mark(request, was_running)
                self._free_request(request)
        if finished_running:                  # one O(n) pass, not a remove per request
            self.running = [r for r in self.running if not r.is_finished()]
        if kv_skipped is not None:            # errors, landed loads, finished sends
            outputs.extend(self._finish_kv_reports(scheduler_output))
        return outputs + self._finish_grammar_errors()

    def _bound_fate(self, entry: RequestData, request: Request | None) -> Fate:
        """The fate without vLLM 0.33's counters: by incarnation (`_fate`),
        or, as vLLM 0.8.x released (`outputs_to_running_by_id`), LIVE for the
        RUNNING request of the entry's id, whatever its incarnation, and
        SUPERSEDED otherwise (0.8.x `update_from_output` walks `running`)."""
        if self._outputs_to_running_by_id:
            return _fate_of_running(request)
        return self._fate(entry, request)

    def _fate(self, entry: RequestData, request: Request | None) -> Fate:
        """The entry's output is bound to the incarnation it was scheduled for
        (completion.py: live, orphaned or superseded). `request` is the live
        request of the entry's name, None if there is none."""
        if request is None:
            return SUPERSEDED                 # finished or aborted since
        incarnation = entry.incarnation
        if incarnation == request.incarnation:
            return LIVE
        if incarnation == request.orphaned_incarnation:
            return ORPHANED
        return SUPERSEDED                     # rescheduled since, or an older request of its name

    def _fate_by_counters(self, entry: RequestData, request: Request | None) -> Fate:
        """vLLM 0.33 `Scheduler.update_from_output`: the output is looked up by
        request id; the request's in-flight count drops by the entry's tokens,
        and while its stale share is positive the output is stale and the
        share drops too (`assert >= 0`). Stale output is delivered to the
        PREEMPTED request (deliver mode: orphaned) or discarded (drop mode).
        One guard vLLM lacks (reference/README.md, `reused_id_output_dropped`):
        an entry scheduled for an older request of the same id is dropped and
        touches nothing of the request now under that id (vLLM 0.33 as
        released: `outputs_by_id_alone`)."""
        if request is None or (entry.incarnation < request.first_incarnation
                               and not self._outputs_by_id_alone):
            return SUPERSEDED                 # finished, aborted, or an older request of the id
        request.num_in_flight_tokens -= entry.num_new_tokens
        if request.num_stale_output_tokens > 0:
            request.num_stale_output_tokens -= entry.num_new_tokens
            assert request.num_stale_output_tokens >= 0, (
                f"{request.request_id}: stale share below 0 ({request.num_stale_output_tokens})")
            return SUPERSEDED if request.drop_stale_output else ORPHANED
        return LIVE

    def _tokens_taken(self, entry: RequestData, request: Request, fate: Fate,
                      model_runner_output: ModelRunnerOutput) -> list[int]:
        """The entry's sampled tokens; none for a chunk that did not sample
        (a worker that samples every chunk returns a token for it anyway).
        As vLLM 0.8.x released (`worker_decides_sampling`), whatever the
        model runner returned."""
        if self._worker_decides_sampling or self._samples(entry, request, fate):
            return model_runner_output.tokens_of(entry.req_id)
        return []

    def _samples(self, entry: RequestData, request: Request, fate: Fate) -> bool:
        """Whether the entry sampled: its snapshot says (it reached the
        request's known tokens when it was scheduled)."""
        return entry.samples

    def _settle_live(self, request: Request, entry: RequestData) -> None:
        """Bookkeeping every live entry gets, whether or not it sampled: none
        with continue-prefill (the counter moved at schedule time); one batch
        per request frees the request for its next batch."""
        if self._one_batch_per_request:
            self.scheduled_req_ids.discard(request.request_id)

    def _apply_sampled(self, request: Request, entry: RequestData, token_ids: list[int],
                       fate: Fate, proposed_drafts: Sequence[int] | None) -> EngineCoreOutput:
        """Subtract the rejected drafts, then append the tokens (completion.py)."""
        num_rejected = count_rejected(request, entry, token_ids)
        if num_rejected:
            self._subtract_rejections(request, fate, num_rejected)
            if self._async and fate is LIVE:
                self._settle_rejected_placeholders(request, num_rejected)
        if not self._async and not self._settles_blocks_with_drafts:
            return append_sampled(request, token_ids, fate, proposed_drafts, self.config,
                                  self._stop_tokens_first)
        had_placeholders = request.num_output_placeholders > 0
        was_running = request.status == RUNNING
        output = append_sampled(request, token_ids, fate, proposed_drafts, self.config,
                                self._stop_tokens_first)
        if fate is LIVE:
            if len(output.new_token_ids) < len(token_ids):
                # vLLM 0.33 `_update_request_with_output`: at a stop that trims
                # tokens, a not stale output's count is trimmed too ("covers all
                # new tokens but the last one"), before the blocks are cached
                # below: caching the untrimmed count would hash a block whose
                # last token's KV was never computed.
                request.num_computed_tokens -= len(token_ids) - len(output.new_token_ids)
            self._settle_placeholders(request, len(token_ids))
            if was_running and (had_placeholders or self._settles_blocks_with_drafts):
                # vLLM 0.33 `update_from_output`: with placeholders (or drafts)
                # the blocks of the settled tokens are cached now.
                self.kv_cache_manager.cache_blocks(
                    request, request.num_computed_tokens - request.num_in_flight_tokens)
        return output

    def _settle_rejected_placeholders(self, request: Request, num_rejected: int) -> None:
        """vLLM 0.33 `update_from_output`: the placeholders covered a live
        output's drafts too, so its rejected ones are taken back (guarded by
        `> 0`: a request without placeholders has none to give back)."""
        if request.num_output_placeholders > 0:
            request.num_output_placeholders -= num_rejected

    def _settle_placeholders(self, request: Request, num_returned: int) -> None:
        """vLLM 0.33 `_update_request_with_output`: a live output takes every
        returned token (those trimmed at a stop included) off the placeholders
        (`assert >= 0`); a stale one leaves them (preemption reset them)."""
        if request.num_output_placeholders > 0:
            request.num_output_placeholders -= num_returned
            assert request.num_output_placeholders >= 0, (
                f"{request.request_id}: output placeholders below 0")

    def _subtract_rejections(self, request: Request, fate: Fate, num_rejected: int) -> None:
        """Rejected drafts were counted as computed at schedule time; only a
        live entry's count still stands (preemption reset an orphan's). vLLM
        0.33 and 0.34 as released bind outputs by id alone and guard it with
        `> 0` (`update_from_output`): a reused id's new request still waiting,
        handed an older batch's output, keeps its 0."""
        if fate is Fate.LIVE and not (self._outputs_by_id_alone and request.num_computed_tokens <= 0):
            request.num_computed_tokens -= num_rejected


# -- vLLM as released (profiles.py `RELEASED`): read only under a released
# profile, the vLLM differential's conforming run (never the fuzzer's).

def _fate_of_running(request: Request | None) -> Fate:
    """vLLM 0.8.x `update_from_output` walks `running`: the output is live
    for the RUNNING request of its id, whatever its incarnation, and dropped
    otherwise."""
    return LIVE if request is not None and request.status == RUNNING else SUPERSEDED


def _take_proposed_drafts(request: Request, entry: RequestData, fate: Fate,
                          model_runner_output: ModelRunnerOutput) -> None:
    """vLLM 0.8.x `update_from_output`: `request.spec_token_ids =
    spec_token_ids[req_index]` for every running entry, one that took no
    token included (none proposed for it: its drafts are cleared)."""
    if fate is LIVE and model_runner_output.spec_token_ids is not None:
        request.spec_token_ids = tuple(model_runner_output.drafts_of(entry.req_id))


def _fate_by_stale_share(request: Request | None) -> Fate:
    """vLLM 0.33's reading of an output by the counters alone, without
    changing them: stale while the request's stale share is positive
    (delivered, or discarded in drop mode), live otherwise."""
    if request is None:
        return SUPERSEDED
    if request.num_stale_output_tokens > 0:
        return SUPERSEDED if request.drop_stale_output else ORPHANED
    return LIVE
