"""vLLM V1's scheduler with several batches in flight (v0.8.5 semantics, with
the later fixes for requests preempted, aborted or finished while in flight).

* `schedule()` forms one batch: running requests first, in order, each
  skipped when `num_new_tokens == 0` (its known tokens are all in flight, or
  it waits for its sampled token); the last running request is preempted when
  blocks run out; then, only if nothing was preempted, FCFS admission with
  prefix-cache hits. Each scheduled request's entry records its pre-batch
  counts (batch.py); once the batch is formed every `num_computed_tokens` is
  advanced, so the next prefill chunk of a request can go into the very next
  batch.
* `update_from_output()` walks the entries of the completed batch (not
  `running`) and binds each output to the incarnation it was scheduled for:
  live (appended, spec-decode rejections subtracted), orphaned (preempted
  since, not rescheduled: appended, counter untouched) or superseded (dropped)
  (completion.py).

Deliberate deviations from vLLM are listed in reference/README.md.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable

from . import mutants as M
from .batch import Batch, cached_request_data, new_request_data
from .block_pool import KVCacheBlock
from .completion import Fate, apply_sampled, entry_fate
from .config import SchedulerConfig
from .kv_cache_manager import KVCacheManager
from .outputs import (CachedRequestData, EngineCoreOutput, ModelRunnerOutput, RequestData,
                      SchedulerOutput)
from .request import Request, RequestStatus
from .trace import TraceWriter

__all__ = ["Fate", "Scheduler"]


class Scheduler:
    def __init__(self, config: SchedulerConfig, trace: TraceWriter | None = None) -> None:
        self.config = config
        self.kv_cache_manager = KVCacheManager(config.num_blocks, config.block_size,
                                               config.enable_prefix_caching)
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # One-batch-per-request policy only: requests with a batch in flight.
        self.scheduled_req_ids: set[str] = set()
        # Finished since the last batch was built; sent to the workers with it.
        self.finished_req_ids: set[str] = set()
        # shared_snapshot mutant only: the one CachedRequestData per request.
        self._cached_reqs_data: dict[str, CachedRequestData] | None = \
            {} if config.mutant == M.SHARED_SNAPSHOT else None
        self._incarnations = itertools.count()
        self._next_batch_id = 1
        self.num_steps = 0            # schedule() + update_from_output() calls
        self._mutant = config.mutant
        self._one_batch_per_request = not config.continue_prefill
        # Whether a live entry needs bookkeeping at completion (it does not in
        # the correct continue-prefill scheduler: the counter moved at schedule time).
        self._settles_live = (self._one_batch_per_request
                              or config.mutant == M.ADVANCE_AT_COMPLETION)
        self.trace = trace
        if trace is not None:
            trace.config(config)

    # ------------------------------------------------------------------
    # Requests in and out
    # ------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        """Queue a new request; a bad one raises ValueError and changes nothing."""
        self._validate_new_request(request)
        request.incarnation = request.first_incarnation = next(self._incarnations)
        self.requests[request.request_id] = request
        self.waiting.append(request)
        if self.trace is not None:
            self.trace.arrive(request, self.num_steps)

    def _validate_new_request(self, request: Request) -> None:
        if not isinstance(request, Request):
            raise TypeError(f"expected a Request, got {type(request).__name__}")
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if request.incarnation != -1:
            raise ValueError(f"request {request.request_id!r} was already added to a scheduler")
        if not request.prompt_token_ids:
            raise ValueError(f"request {request.request_id!r} has an empty prompt")
        # One token must fit after the prompt (vLLM accepts == max_model_len and
        # then finishes on the length check; we refuse a prompt that cannot
        # produce a token within max_model_len).
        limit = self.config.max_model_len - 1
        if request.num_prompt_tokens > limit:
            raise ValueError(f"prompt of request {request.request_id!r} has "
                             f"{request.num_prompt_tokens} tokens; at most {limit} "
                             f"(max_model_len - 1) fit")
        if request.max_tokens < 1:
            raise ValueError(f"max_tokens of request {request.request_id!r} must be at least 1, "
                             f"got {request.max_tokens}")

    def finish_requests(self, request_ids: str | Iterable[str],
                        finished_status: RequestStatus) -> None:
        """Finish requests from outside (abort). Unknown or finished ids are a no-op."""
        if not RequestStatus.is_finished(finished_status):
            raise ValueError(f"{finished_status!r} is not a finished status")
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        for req_id in request_ids:
            request = self.requests.get(req_id)
            if request is None:
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)          # O(n), but aborts are rare
            else:
                self.waiting.remove(request)
            request.status = finished_status
            request.incarnation = next(self._incarnations)
            request.orphaned_incarnation = None
            self._free_request(request)
            if self.trace is not None:
                if finished_status == RequestStatus.FINISHED_ABORTED:
                    self.trace.abort(req_id, self.num_steps)
                else:
                    self.trace.finish(req_id, request.get_finished_reason(), self.num_steps)

    def _free_request(self, request: Request) -> None:
        req_id = request.request_id
        self.kv_cache_manager.free(request)
        self.scheduled_req_ids.discard(req_id)
        if self._cached_reqs_data is not None:
            self._cached_reqs_data.pop(req_id, None)
        del self.requests[req_id]
        self.finished_req_ids.add(req_id)

    def get_num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def get_num_unscheduled_requests(self) -> int:
        """vLLM <= 0.8.4's engine gate for the one-batch-per-request policy."""
        return len(self.waiting) + len(self.running) - len(self.scheduled_req_ids)

    # ------------------------------------------------------------------
    # schedule()
    # ------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        self.num_steps += 1
        batch = Batch(self.config.max_num_batched_tokens)
        self._schedule_running(batch)
        if not batch.preempted:               # no admission in a step that preempted
            self._schedule_waiting(batch)
        output = self._make_output(batch)
        self._update_after_schedule(batch)
        if self.trace is not None and (batch.entries or batch.preempted):
            self.trace.schedule(output, self.num_steps)
        return output

    def _schedule_running(self, batch: Batch) -> None:
        req_index = 0
        while req_index < len(self.running) and batch.token_budget > 0:
            request = self.running[req_index]
            num_new_tokens = self._num_new_tokens_running(request, batch.token_budget)
            if num_new_tokens == 0:
                req_index += 1                # nothing to schedule: tokens in flight
                continue
            num_drafts = self._num_scheduled_drafts(request, num_new_tokens) \
                if request.spec_token_ids else 0
            new_blocks = self._allocate_or_preempt(request, num_new_tokens, num_drafts, batch)
            if new_blocks is None:
                return                        # the request preempted itself
            self._add_to_batch(batch, request, self._make_running_entry(
                request, num_new_tokens, num_drafts, new_blocks))
            req_index += 1

    def _num_new_tokens_running(self, request: Request, token_budget: int) -> int:
        if self._one_batch_per_request and request.request_id in self.scheduled_req_ids:
            return 0                          # one batch per request
        num_computed = request.num_computed_tokens
        num_new_tokens = request.num_tokens_with_spec - num_computed
        if num_new_tokens > 0:
            return self._clip(num_new_tokens, num_computed, token_budget)
        if (self._mutant == M.DECODE_WHILE_TOKEN_IN_FLIGHT
                and request.num_tokens <= num_computed < self.config.max_model_len):
            return 1
        return 0

    def _clip(self, num_new_tokens: int, num_computed: int, token_budget: int) -> int:
        threshold = self.config.long_prefill_token_threshold
        if 0 < threshold < num_new_tokens:
            num_new_tokens = threshold
        return max(0, min(num_new_tokens, token_budget,
                          self.config.max_model_len - num_computed))

    @staticmethod
    def _num_scheduled_drafts(request: Request, num_new_tokens: int) -> int:
        """Drafts are the tokens past the known ones; the budget may clip them."""
        overshoot = request.num_computed_tokens + num_new_tokens - request.num_tokens
        return max(0, min(len(request.spec_token_ids), overshoot))

    def _allocate_or_preempt(self, request: Request, num_new_tokens: int, num_drafts: int,
                             batch: Batch) -> list[KVCacheBlock] | None:
        """Blocks for the request, preempting the last running request until
        they fit; None if the request itself had to go."""
        while True:
            new_blocks = self.kv_cache_manager.allocate_slots(
                request, num_new_tokens, num_draft_tokens=num_drafts)
            if new_blocks is not None:
                return new_blocks
            victim = self.running.pop()
            self._preempt(victim)
            batch.preempted.append(victim.request_id)
            if victim is request:
                return None

    def _preempt(self, request: Request) -> None:
        """Recompute preemption: blocks freed, back to the head of `waiting`.
        Its in-flight entries become orphaned (a new incarnation begins)."""
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.spec_token_ids = ()
        request.orphaned_incarnation = request.incarnation
        request.incarnation = next(self._incarnations)
        self.waiting.appendleft(request)
        if self._mutant != M.INFLIGHT_SET_NOT_CLEARED_ON_PREEMPTION:
            self.scheduled_req_ids.discard(request.request_id)

    def _schedule_waiting(self, batch: Batch) -> None:
        """FCFS admission: the head of `waiting` blocks everything behind it."""
        kv = self.kv_cache_manager
        while self.waiting and batch.token_budget > 0:
            if len(self.running) >= self.config.max_num_seqs:
                break
            request = self.waiting[0]
            computed_blocks, num_hit_tokens = kv.get_computed_blocks(request)
            num_new_tokens = self._clip(request.num_tokens - num_hit_tokens,
                                        request.num_computed_tokens, batch.token_budget)
            if num_new_tokens == 0:
                break
            new_blocks = kv.allocate_slots(request, num_new_tokens, computed_blocks)
            if new_blocks is None:
                break
            self.waiting.popleft()
            self._add_to_batch(batch, request,
                               self._admit(request, num_hit_tokens, num_new_tokens, new_blocks))

    def _admit(self, request: Request, num_hit_tokens: int, num_new_tokens: int,
               new_blocks: list[KVCacheBlock]) -> RequestData:
        was_preempted = request.status == RequestStatus.PREEMPTED
        self.running.append(request)
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = num_hit_tokens
        request.num_cached_tokens = num_hit_tokens
        request.orphaned_incarnation = None   # rescheduled: old entries are superseded
        start = num_hit_tokens
        if num_hit_tokens and self._mutant == M.SNAPSHOT_OMITS_PREFIX_HIT:
            start = 0
        if was_preempted:
            return cached_request_data(request, start, num_new_tokens, 0, new_blocks,
                                       num_hit_tokens, resumed=True, shared=self._cached_reqs_data)
        return new_request_data(request, start, num_hit_tokens, num_new_tokens, new_blocks)

    def _make_running_entry(self, request: Request, num_new_tokens: int, num_drafts: int,
                            new_blocks: list[KVCacheBlock]) -> CachedRequestData:
        entry = cached_request_data(request, request.num_computed_tokens, num_new_tokens,
                                    num_drafts, new_blocks, 0, resumed=False,
                                    shared=self._cached_reqs_data)
        # Drafts the budget clipped are dropped (vLLM keeps them when none was
        # scheduled; the spec drops them always, so a clipped decode cannot
        # leave drafts behind to form a second sampling entry).
        if len(request.spec_token_ids) != num_drafts:
            request.spec_token_ids = request.spec_token_ids[:num_drafts]
        return entry

    def _add_to_batch(self, batch: Batch, request: Request, entry: RequestData) -> None:
        batch.add(request, entry)
        if self._one_batch_per_request:
            self.scheduled_req_ids.add(request.request_id)

    def _make_output(self, batch: Batch) -> SchedulerOutput:
        batch_id = None
        finished_req_ids: set[str] = set()
        if batch.total_num_scheduled_tokens:
            batch_id, self._next_batch_id = self._next_batch_id, self._next_batch_id + 1
            # Only a batch that reaches the workers carries the finished ids.
            finished_req_ids, self.finished_req_ids = self.finished_req_ids, set()
        return batch.to_output(batch_id, finished_req_ids)

    def _update_after_schedule(self, batch: Batch) -> None:
        """The PR's move: advance num_computed_tokens now, at schedule time,
        once every entry holds its pre-batch counts, so the next prefill chunk
        can go into the very next batch."""
        if self._mutant == M.ADVANCE_AT_COMPLETION:
            return                            # the bug: advanced in update_from_output instead
        for request, entry in zip(batch.requests, batch.entries):
            request.num_computed_tokens += entry.num_new_tokens

    # ------------------------------------------------------------------
    # update_from_output()
    # ------------------------------------------------------------------

    def fate_of(self, entry: RequestData) -> Fate:
        """What becomes of this in-flight entry's output if it completed now."""
        return entry_fate(entry, self.requests.get(entry.req_id), self._mutant)

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """Apply a completed batch's outputs, entry by entry, in placement order."""
        self.num_steps += 1
        tracing = self.trace is not None
        taken: dict[str, list[int]] = {}
        dropped: list[str] = []
        next_drafts: dict[str, int] = {}
        outputs: list[EngineCoreOutput] = []
        finished_running = False
        index = model_runner_output.req_id_to_index
        sampled = model_runner_output.sampled_token_ids
        proposed = model_runner_output.spec_token_ids
        for entry in scheduler_output.entries:
            req_id = entry.req_id
            row = index.get(req_id)
            generated = sampled[row] if row is not None else []
            request = self.requests.get(req_id)
            if request is not None and entry.incarnation == request.incarnation:
                fate = Fate.LIVE              # the common case, without a call
            else:
                fate = entry_fate(entry, request, self._mutant)
            if fate is Fate.SUPERSEDED:
                if tracing:
                    taken[req_id] = list(generated)
                    dropped.append(req_id)
                continue
            assert request is not None
            samples = entry.samples
            if self._mutant == M.FINAL_CHUNK_FROM_LIVE_COUNTER and fate is Fate.LIVE:
                samples = request.num_computed_tokens >= request.num_tokens
            if not samples:
                generated = []                # a non-final chunk: nothing was sampled
            if fate is Fate.LIVE and self._settles_live:
                self._settle_live(request, entry)
            if tracing:
                taken[req_id] = list(generated)
            if not generated:
                continue
            drafts = proposed[row] if proposed is not None and row is not None else ()
            was_running = request.status == RequestStatus.RUNNING
            outputs.append(apply_sampled(request, entry, generated, fate, drafts, self.config))
            if request.is_finished():
                if was_running:
                    finished_running = True   # leaves `running` in one pass below
                else:
                    self.waiting.remove(request)  # orphaned: finished while PREEMPTED
                self._free_request(request)
            elif fate is Fate.LIVE and request.spec_token_ids:
                next_drafts[req_id] = len(request.spec_token_ids)
        if finished_running:                  # one O(n) pass, not a remove per request
            self.running = [r for r in self.running if not r.is_finished()]
        if tracing:
            self._trace_complete(scheduler_output, taken, dropped, next_drafts, outputs)
        return outputs

    def _settle_live(self, request: Request, entry: RequestData) -> None:
        """Bookkeeping every live entry gets, whether or not it sampled."""
        if self._one_batch_per_request:
            self.scheduled_req_ids.discard(request.request_id)
        if self._mutant == M.ADVANCE_AT_COMPLETION:
            request.num_computed_tokens += entry.num_new_tokens

    def _trace_complete(self, scheduler_output: SchedulerOutput, taken: dict[str, list[int]],
                        dropped: list[str], next_drafts: dict[str, int],
                        outputs: list[EngineCoreOutput]) -> None:
        assert self.trace is not None
        self.trace.complete(scheduler_output.batch_id, self.num_steps, taken, dropped, next_drafts)
        for out in outputs:
            if out.finish_reason is not None:
                self.trace.finish(out.request_id, out.finish_reason, self.num_steps)
