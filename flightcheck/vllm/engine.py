"""The engine around vLLM's scheduler in a replay: our own copy of each
version's batch-queue step and busy loop, and a fabricated model.

vLLM's batch queue lives in the engine core, not in the scheduler
(`EngineCore.step_with_batch_queue`, `vllm/v1/engine/core.py`), so a program
that drives the real scheduler must reproduce that loop; this is our own
code, written from the behaviour of:

* 0.8.5 `step_with_batch_queue`: call `schedule()` whenever the queue has
  room; enqueue the output only if it has tokens; if nothing was enqueued and
  the queue is not empty, block on the oldest batch and hand its output to
  `update_from_output`.
* 0.8.4 `step_with_batch_queue`: the same, but `schedule()` is called only
  while `get_num_unscheduled_requests() > 0` (requests not in
  `scheduled_req_ids`).
* both `EngineCoreProc.run_busy_loop` / `_process_input_queue`: input (adds,
  aborts) is handled between steps; while `scheduler.has_requests()` is false
  the engine blocks on its input queue, whatever is still in the batch queue.
* 0.33.0 `EngineCore.step_with_batch_queue` (`vllm/v1/engine/core.py`,
  `BatchQueueEngineV033` below): `schedule()` whenever the scheduler
  `has_requests()`, and the output is queued **even with 0 tokens** (an empty
  batch takes a slot: it carries `finished_req_ids` to the workers); the step
  returns without blocking iff the queue still has room and it ran the model
  or requests are left; otherwise it pops the **oldest** batch, applies the
  aborts that arrived meanwhile (`EngineCore._process_aborts_queue`) and
  calls `update_from_output`, empty batches included. Its busy loop keeps
  stepping while batches are in flight (`EngineCoreProc.has_work`:
  `scheduler.has_requests() or bool(batch_queue)`), so 0.8.5's "blocked with
  a batch in flight" cannot happen; a request that can never be scheduled
  again makes it spin on empty batches (the run ends `stuck`).

The model is fabricated, like vLLM's model runner as far as the scheduler can
tell (`GPUModelRunner._update_states` and `execute_model`, 0.8.5): it keeps
per request the number of tokens it has been told of (the prompt, then
`num_computed_tokens + len(new_token_ids)` of each cached-request entry),
drops that state for `finished_req_ids`, and samples one token for an entry
exactly when `num_computed_tokens + num_scheduled_tokens` reaches it; a
partial prefill chunk returns no token. Tokens are seeded per request and
position (workload.sampled_token). Standard library only.
"""

from __future__ import annotations

import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from .draft_handler import DraftHandler
from .engine_truth import note_gated_completion, note_wait
from .inputs import InputQueue
from .run_endings import (IDLE_STEPS_FOR_STUCK, IdleCount, idle_an_input_ends, idle_ending, stall_stepped_through,
                          stalled_until_input, unfinished_requests)
from .workload import RequestSpec, Workload, draft_outcome, sampled_token


class FabricatedModel:
    """Returns, per batch, what vLLM's model runner would return: the
    sampled tokens of the entries that reach their known tokens."""

    def __init__(self, workload: Workload, make_output: Callable[..., Any],
                 caches_sampled_tokens: bool = False) -> None:
        self._workload = workload
        # vLLM 0.33's V1 runner on the last rank (the one that samples) appends
        # each token it samples to its own request state at once
        # (GPUModelRunner._bookkeeping_sync, "Cache the sampled tokens in the
        # model runner"), learns nothing from new_token_ids there, and cuts its
        # outputs back to the scheduler's num_output_tokens when those are fewer
        # (_update_states, the is_last_rank branch). 0.8.x: see the module doc.
        self._caches_sampled_tokens = caches_sampled_tokens
        self._prompt_lengths: dict[str, int] = {}
        # vLLM id -> the request now under that id: a request that reuses an
        # id takes it over when it is added (bind), so each batch samples the
        # tokens of the request it was scheduled for (execute runs at schedule time).
        self._specs = {spec.req_id: spec for spec in workload.requests if not spec.reuses_id}
        self._make_output = make_output
        self._known_tokens: dict[str, int] = {}
        self.latest_drafts: tuple[list[str], list[list[int]]] | None = None
        # The V2 runner's drafts for a deferred grammar bitmask (draft_handler.py;
        # the engine sets it with drafts on 0.33 and 0.34, else None).
        self.draft_handler: DraftHandler | None = None

    def bind(self, spec: RequestSpec) -> None:
        """The request about to be added under `spec.req_id`."""
        self._specs[spec.req_id] = spec

    def execute(self, scheduler_output: Any) -> Any:
        self._forget_finished(scheduler_output)
        starts: dict[str, int] = {}
        for data in scheduler_output.scheduled_new_reqs:
            # 0.33 with the V2 runner sends resumed requests as new ones, with
            # all their tokens in prefill_token_ids; otherwise the prompt.
            prefill = getattr(data, "prefill_token_ids", None)
            self._known_tokens[data.req_id] = len(prefill if prefill is not None else data.prompt_token_ids)
            self._prompt_lengths[data.req_id] = len(data.prompt_token_ids)
            starts[data.req_id] = data.num_computed_tokens
        cached = scheduler_output.scheduled_cached_reqs
        if isinstance(cached, list):            # vLLM <= 0.9.1: one CachedRequestData per request
            rows = [(d.req_id, d.num_computed_tokens, d.new_token_ids) for d in cached]
        else:                                   # later: one per batch, parallel lists (new_token_ids with PP)
            rows = [(req_id, cached.num_computed_tokens[i],
                     cached.new_token_ids[i] if cached.new_token_ids else [])
                    for i, req_id in enumerate(cached.req_ids)]
        for i, (req_id, num_computed_tokens, new_token_ids) in enumerate(rows):
            starts[req_id] = num_computed_tokens
            if self._caches_sampled_tokens:
                outputs = self._prompt_lengths[req_id] + cached.num_output_tokens[i]
                self._known_tokens[req_id] = min(self._known_tokens[req_id], outputs)
                continue
            # GPUModelRunner._update_states (0.8.5): the runner learns the
            # tokens the scheduler sends and never forgets one.
            told = num_computed_tokens + len(new_token_ids)
            self._known_tokens[req_id] = max(self._known_tokens.get(req_id, 0), told)
        req_ids = list(scheduler_output.num_scheduled_tokens)
        scheduled_drafts = getattr(scheduler_output, "scheduled_spec_decode_tokens", None) or {}
        sampled: list[list[int]] = []
        proposed: list[list[int]] = []
        next_index: dict[str, int] = {}          # per request, the index its next token will have
        for req_id in req_ids:
            end = starts[req_id] + scheduler_output.num_scheduled_tokens[req_id]
            next_index[req_id] = end
            # The runner compares with its known tokens, drafts excluded
            # (GPUModelRunner.execute_model, 0.8.5: `seq_len < req_state.num_tokens`
            # discards; `num_scheduled_tokens` counts the drafts).
            if end >= self._known_tokens[req_id]:
                tokens, next_drafts = self._sample(req_id, end, len(scheduled_drafts.get(req_id, ())))
                sampled.append(tokens)
                proposed.append(next_drafts)
                next_index[req_id] = end - len(scheduled_drafts.get(req_id, ())) + len(tokens)
                if self._caches_sampled_tokens:
                    self._known_tokens[req_id] += len(tokens)
            else:
                sampled.append([])              # a partial prefill: nothing sampled
                proposed.append([])             # ... and nothing proposed (the n-gram proposer's [])
        skip = bool(getattr(scheduler_output, "skip_drafts", False))   # vLLM 0.33+: V2 execute_model drafts K=0
        if skip:
            proposed = [[] for _ in req_ids]
        # vLLM 0.33 (sync): the engine takes the drafts of the batch it has just run (EngineCore.post_step
        # -> take_draft_token_ids; the runner answers with its latest batch's `req_ids` and drafts).
        self.latest_drafts = (req_ids, proposed)
        if self.draft_handler is not None and req_ids:
            self.draft_handler.submitted({r: [] if skip else self._drafter_row(r, next_index[r]) for r in req_ids})
        return self._make_output(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                 sampled_token_ids=sampled,
                                 spec_token_ids=proposed if self._workload.config.num_spec_tokens else None,
                                 logprobs=None, prompt_logprobs_dict={})

    def _forget_finished(self, scheduler_output: Any) -> None:
        """The runner drops the batch's finished requests (and, from its
        drafts, the preempted ones: the V2 runner's `finish_requests`)."""
        for req_id in scheduler_output.finished_req_ids:
            self._known_tokens.pop(req_id, None)
        if self.draft_handler is not None:
            for req_id in [*scheduler_output.finished_req_ids, *getattr(scheduler_output, "preempted_req_ids", ())]:
                self.draft_handler.discard(req_id)

    def _drafter_row(self, req_id: str, start: int) -> list[int]:
        """The V2 runner's row of drafts for a request of a batch: k wide,
        the request's own tokens from index `start` on (what the fabricated
        proposer would offer in full)."""
        spec = self._specs[req_id]
        return [sampled_token(self._workload, spec, start + i) for i in range(self._workload.config.num_spec_tokens)]

    def _sample(self, req_id: str, end: int, num_drafts: int) -> tuple[list[int], list[int]]:
        """An entry that samples, ending at token index `end` with `num_drafts`
        drafts among its tokens: the accepted drafts and the bonus token (the
        rejection sampler's output), and the drafts proposed for the next
        step. Drafts are the request's own future tokens (`sampled_token` at
        their index), so the output is that of plain decoding, faster."""
        spec = self._specs[req_id]
        first = end - num_drafts                 # the index of the first draft (or of the token sampled)
        if not self._workload.config.num_spec_tokens:
            return [sampled_token(self._workload, spec, first)], []
        accepted, num_proposed = draft_outcome(self._workload, spec, first, num_drafts)
        tokens = [sampled_token(self._workload, spec, first + i) for i in range(accepted + 1)]
        after = first + accepted + 1
        return tokens, [sampled_token(self._workload, spec, after + i) for i in range(num_proposed)]


class BatchQueueEngine:
    """One engine core with a batch queue of `depth` (= pipeline stages)."""

    def __init__(self, scheduler: Any, model: FabricatedModel, depth: int,
                 schedules_only_unscheduled: bool) -> None:
        self.scheduler = scheduler
        self.model = model
        self.depth = depth
        # 0.8.4's gate: schedule only while some request is not in flight.
        self.schedules_only_unscheduled = schedules_only_unscheduled
        self.batch_queue: deque[tuple[Any, Any]] = deque()
        self.outputs: list[tuple[str, tuple[int, ...], str | None]] = []
        self.batches: list[dict[str, int]] = []
        # The engine-step number run_busy_loop is at, and the engine's own
        # ground truth about its choices (engine_truth.py).
        self.current_step = 0
        self.grammars_compiling: Callable[[], int] = lambda: 0     # unsettled (grammar_workload.py)
        self.waits_in_flight: list[dict[str, Any]] = []
        self.gated_completions: list[dict[str, Any]] = []
        self.copy_errors: list[str] = []

    def step_with_batch_queue(self) -> bool:
        """One engine step; True when it scheduled or completed a batch."""
        scheduled = False
        may_schedule = len(self.batch_queue) < self.depth
        gate_closed = False
        if may_schedule and self.schedules_only_unscheduled:
            may_schedule = self.scheduler.get_num_unscheduled_requests() > 0
            gate_closed = not may_schedule
        if gate_closed and self.batch_queue:
            note_gated_completion(self)
        if may_schedule:
            scheduler_output = self.scheduler.schedule()
            if scheduler_output.total_num_scheduled_tokens > 0:
                # The model reads the batch when it is submitted, as a real
                # executor does; it must not see later schedule() calls.
                result = self.model.execute(scheduler_output)
                self.batch_queue.append((scheduler_output, result))
                self.batches.append(dict(scheduler_output.num_scheduled_tokens))
                scheduled = True
        if scheduled or not self.batch_queue:
            return scheduled
        scheduler_output, result = self.batch_queue.popleft()
        self._record_outputs(self.scheduler.update_from_output(scheduler_output, result))
        return True

    # 0.8.x: the engine waits for input while has_requests() is false,
    # whatever is in its queue; every queued batch has tokens.
    busy_while_in_flight = False

    def batches_in_flight(self) -> int:
        """Batches with tokens in the queue."""
        return len(self.batch_queue)

    def _record_outputs(self, engine_outputs: Any) -> None:
        # 0.8.x returns one EngineCoreOutputs; 0.33 a dict client index -> EngineCoreOutputs.
        groups = engine_outputs.values() if isinstance(engine_outputs, dict) else [engine_outputs]
        for group in groups:
            for out in group.outputs:
                reason = out.finish_reason
                self.outputs.append((out.request_id, tuple(out.new_token_ids),
                                     None if reason is None else str(reason)))


class BatchQueueEngineV033(BatchQueueEngine):
    """vLLM 0.33.0's engine core with a batch queue of `depth`
    (`VllmConfig.max_concurrent_batches`: the pipeline size when scheduling
    is synchronous). Our copy of `EngineCore.step_with_batch_queue`: the
    queue is appended on the left and popped on the right (oldest first), as
    there; a structured-output batch whose sampling is deferred
    (`pending_structured_output_tokens`) waits for the oldest output first;
    pooling is not modelled (a replay has none)."""

    busy_while_in_flight = True      # EngineCoreProc.has_work counts the batch queue
    # The V2 runner's `DraftTokensHandler` (draft_handler.py): 0.33 keeps the
    # latest sampled batch's rows only; 0.34 each live request's latest row.
    drafts_retained_per_request = False

    def __init__(self, scheduler: Any, model: FabricatedModel, depth: int,
                 abort: Callable[[list[str]], None],
                 draft_token_ids: Callable[[list[str], list[list[int]]], Any] | None = None,
                 deferred_draft_token_ids: Callable[[list[str], list[list[int]]], Any] | None = None) -> None:
        super().__init__(scheduler, model, depth, schedules_only_unscheduled=False)
        self._abort = abort
        # Speculative decoding (sync): builds vLLM's DraftTokenIds for `update_draft_token_ids`
        # after every step that ran the model (EngineCore.post_step); None without drafts.
        self._draft_token_ids = draft_token_ids
        # With drafts (`check_for_draft_tokens`, sync or async): the DraftTokenIds for a deferred
        # batch (`deferred_drafts`); None without, or on the reference's side (no such call).
        self._deferred_draft_token_ids = deferred_draft_token_ids
        self.deferred_drafts_handed = 0      # calls made, over the run
        if deferred_draft_token_ids is not None:
            model.draft_handler = DraftHandler(self.drafts_retained_per_request)
        # Aborts that arrived while the current step runs the model
        # (EngineCore.aborts_queue); drained right before update_from_output.
        self.aborts_queue: list[str] = []
        # Per call: what it scheduled (None: nothing; {}: an empty batch),
        # whether it completed a batch, and the queue's length after it.
        self.steps: list[dict[str, Any]] = []
        # The fabricated KV connector's worker side (kv_replay.KVWorker), or
        # None: it fills each output's kv_connector_output right before
        # update_from_output, and its transfers in flight keep the run going.
        self.kv_worker: Any = None

    def batches_in_flight(self) -> int:
        return sum(1 for output, _ in self.batch_queue if output.total_num_scheduled_tokens > 0)

    def step_with_batch_queue(self) -> bool:
        """One call; True when it scheduled or completed a batch with tokens,
        or its output reported a KV transfer (else it only moved empty batches). Then
        `post_step`: with drafts, and when this step ran the model, the
        drafts of the batch just run go to `update_draft_token_ids`."""
        self._model_executed = False
        progressed = self._step_with_batch_queue()
        self.post_step(self._model_executed)
        return progressed

    def post_step(self, model_executed: bool) -> None:
        """`EngineCore.post_step` (0.33, sync scheduling only: under async
        the drafts are placeholders the worker fills in): when this step ran
        the model, the drafts it proposed for the batch just submitted
        (`take_draft_token_ids`: the runner's latest batch) go to the
        scheduler's `update_draft_token_ids`, before that batch completes."""
        if self._draft_token_ids is None or not model_executed or self.model.latest_drafts is None:
            return
        req_ids, drafts = self.model.latest_drafts
        self.scheduler.update_draft_token_ids(self._draft_token_ids(req_ids, drafts))

    def _step_with_batch_queue(self) -> bool:
        record: dict[str, Any] = {"scheduled": None, "completed": None}
        self.steps.append(record)
        model_executed, deferred, scheduled = False, False, None
        assert len(self.batch_queue) < self.depth
        if self.scheduler.has_requests():
            scheduler_output = self.scheduler.schedule()
            # The model reads the batch when it is submitted (execute_model
            # with non_block=True): it must not see later schedule() calls.
            result = self.model.execute(scheduler_output)
            model_executed = scheduler_output.total_num_scheduled_tokens > 0
            self._model_executed = model_executed
            record["scheduled"] = dict(scheduler_output.num_scheduled_tokens)
            if model_executed:
                self.batches.append(dict(scheduler_output.num_scheduled_tokens))
            self.batch_queue.appendleft((scheduler_output, result))      # empty or not
            # A batch whose sampling waits for a structured request's earlier
            # output (`pending_structured_output_tokens`, async) never returns
            # early: the oldest output is processed first, then its bitmask built.
            deferred = getattr(scheduler_output, "pending_structured_output_tokens", False)
            scheduled = scheduler_output
            if model_executed and not deferred:
                self.grammar_bitmask(scheduler_output)
            if len(self.batch_queue) < self.depth and (model_executed or self.scheduler.has_requests()) \
                    and not deferred:
                record["queue"] = len(self.batch_queue)
                return model_executed
        elif not self.batch_queue:
            record["queue"] = 0
            return False
        scheduler_output, result = self.batch_queue.pop()                 # the oldest
        self.wait_for_output()
        self.process_aborts_queue()
        completed = dict(scheduler_output.num_scheduled_tokens)
        reported = self.kv_worker is not None and self.kv_worker.attach(scheduler_output, result)
        self._record_outputs(self.scheduler.update_from_output(scheduler_output, result))
        reported = reported or getattr(self.scheduler, "kv_reported", False)     # the reference's connector
        if deferred:
            self.deferred_drafts(scheduled)
            self.grammar_bitmask(scheduled)      # the deferred batch's bitmask, from the FSM as it now is
        record["completed"] = completed
        record["queue"] = len(self.batch_queue)
        return model_executed or bool(completed) or reported

    def deferred_drafts(self, scheduler_output: Any) -> None:
        """`EngineCore.step_with_batch_queue` (0.33, 0.34), a deferred batch
        with `check_for_draft_tokens`: after the oldest output, before the
        bitmask, the runner's drafts (`take_draft_token_ids`, never None from
        the V2 runner) go to `Scheduler.update_draft_token_ids_in_output`."""
        handler = self.model.draft_handler
        if self._deferred_draft_token_ids is None or handler is None:
            return
        req_ids, drafts = handler.take(scheduler_output)
        self.deferred_drafts_handed += 1
        self.scheduler.update_draft_token_ids_in_output(self._deferred_draft_token_ids(req_ids, drafts),
                                                        scheduler_output)

    def grammar_bitmask(self, scheduler_output: Any) -> None:
        """`EngineCore`: the batch's grammar bitmask before it samples
        (`Scheduler.get_grammar_bitmask`; the fabricated model samples
        without it). The reference's side has no bitmask to build."""
        build = getattr(self.scheduler, "get_grammar_bitmask", None)
        if build is not None:
            build(scheduler_output)

    def transfers_in_flight(self) -> int:
        """KV transfers the fabricated connector has not reported yet (the
        bridge's worker; on the reference's side its scheduler's connector)."""
        if self.kv_worker is not None:
            return self.kv_worker.pending()
        pending = getattr(self.scheduler, "kv_transfers_pending", None)
        return pending() if pending is not None else 0

    def wait_for_output(self) -> None:
        """EngineCore._wait_for_output (0.33): it blocks, handling no input."""

    def process_aborts_queue(self) -> None:
        """EngineCore._process_aborts_queue: all pending aborts at once."""
        if self.aborts_queue:
            pending, self.aborts_queue = self.aborts_queue, []
            self._abort(pending)


class BatchQueueEngineV034(BatchQueueEngineV033):
    """vLLM 0.34.0's engine core: 0.33's `step_with_batch_queue`, but the
    wait for the oldest batch's output is `EngineCoreProc._wait_for_output`,
    which, while it spins before a deadline, takes inputs off the input
    queue and handles ADD and ABORT at once (others are deferred to the next
    `_process_input_queue`). So a request can arrive, or be aborted, between
    a step's `schedule()` and that batch's `update_from_output`, even with
    one batch in flight. `wait_inputs`: the inputs that arrive during the
    current step's wait (run_busy_loop sets them), handed over in order if
    the step waits; those left (the step only scheduled) go to the input
    queue, as an input after the spin deadline does."""

    drafts_retained_per_request = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.wait_inputs: list[Callable[[], None]] = []
        self.inputs_during_wait = 0          # handed over inside a wait, over the run

    def wait_for_output(self) -> None:
        while self.wait_inputs:
            self.inputs_during_wait += 1
            self.wait_inputs.pop(0)()


@dataclass
class RunOutcome:
    """How a replay ended, read from vLLM's and the engine's state."""
    ending: str                       # done | stuck | blocked_in_flight | exception | step_limit
    steps: int
    batches_in_flight: int
    exception: str | None = None
    unfinished: list[str] = field(default_factory=list)
    # idles an input ended: {step, until, unfinished[, parked]} (`stalled_until_input`)
    stalls: list[dict] = field(default_factory=list)
    # shorter idles an input ended: a stall if vLLM stays idle without it (run_endings.py `short_idle`)
    short_idles: list[dict] = field(default_factory=list)


def run_busy_loop(engine: BatchQueueEngine, workload: Workload,
                  add_request: Callable[[RequestSpec], None], abort_request: Callable[[str], None],
                  call_event: Callable[[Any], None] | None = None, inputs_before: int | None = None) -> RunOutcome:
    """vLLM's busy loop, with input delivered at the workload's steps
    (`InputQueue`). An abort `abort_via` the aborts queue (0.33) is handed
    to the engine while that step runs (`BatchQueueEngineV033.aborts_queue`);
    one the step did not apply is applied from the input queue before the
    next step. Inputs that arrive during a step's wait for output (0.34)
    are handed to an engine that handles them there (`wait_inputs`); the
    rest are handed over from the input queue before the next step.
    `inputs_before`: the inputs due from that step on never come."""
    inputs, step, idle = InputQueue(workload, inputs_before), 0, IdleCount()
    stalls: list[dict] = []
    short_idles: list[dict] = []
    scheduler, bind = engine.scheduler, getattr(engine.model, "bind", None)
    during_step: list[str] = []
    waiting: list[Callable[[], None]] = []                # arrived during the last wait, not handled there
    try:
        while True:
            _stamp_engine_step(engine, step)
            for req_id in during_step:                     # the input queue's copy of those aborts
                abort_request(req_id)
            for handover in waiting:                       # from the input queue, in order
                handover()
            waiting = []
            stalls.extend(stall_stepped_through(engine, inputs, step, idle))        # async: idles stepped through
            short_idles.extend(idle_an_input_ends(engine, inputs, step, idle))
            due, during_step = len(inputs.pending), inputs.deliver(step, add_request, abort_request, bind, waiting,
                                                                   call_event)
            in_flight = engine.busy_while_in_flight and bool(engine.batch_queue)
            if not scheduler.has_requests() and not in_flight and not during_step:
                if waiting:                                # no step to wait in: the input queue has them
                    continue
                if inputs.pending:                         # blocks on the input queue
                    note_wait(engine, step, inputs.next_step())
                    step = inputs.next_step()
                    continue
                ending = "blocked_in_flight" if engine.batch_queue else "done"
                return RunOutcome(ending, step, engine.batches_in_flight(), stalls=stalls, short_idles=short_idles)
            in_step = bool(during_step or waiting)          # handed to the step, after its schedule()
            progressed, during_step, waiting = _step_with_inputs(engine, during_step, waiting)
            step += 1
            idle.after_step(engine, progressed, len(inputs.pending) < due, in_step)
            if idle.steps >= IDLE_STEPS_FOR_STUCK and engine.batches_in_flight() == 0:
                if not (inputs.pending or during_step or waiting):     # vLLM would spin for ever
                    ending, unfinished = idle_ending(scheduler, engine.batches_in_flight())
                    return RunOutcome(ending, step, engine.batches_in_flight() if unfinished else 0,
                                      unfinished=unfinished, stalls=stalls, short_idles=short_idles)
                # to the next input, once each queued empty batch took its step (0.33/0.34 EngineCoreProc.has_work)
                if not (engine.busy_while_in_flight and engine.batch_queue):
                    until = max(step, inputs.next_step() if inputs.pending else step)
                    stalls.extend(stalled_until_input(scheduler, step - idle.quiet, until))
                    step, idle = until, IdleCount()
                    continue
            if step >= workload.max_steps:
                return RunOutcome("step_limit", step, engine.batches_in_flight(), unfinished=unfinished_requests(scheduler),
                                  stalls=stalls, short_idles=short_idles)
    except Exception as err:  # an exception inside vLLM ends the run, as it kills an engine core
        return RunOutcome("exception", step, engine.batches_in_flight(), exception=_where(err),
                          unfinished=unfinished_requests(scheduler), stalls=stalls, short_idles=short_idles)


def _step_with_inputs(engine: BatchQueueEngine, during_step: list[str], waiting: list[Callable[[], None]]
                      ) -> tuple[bool, list[str], list[Callable[[], None]]]:
    """One engine step with the inputs that arrive while it runs: aborts for
    the aborts queue (0.33) and inputs during its wait for output (0.34,
    handled there by an engine with `wait_inputs`). Returns whether it
    progressed, and the aborts and the inputs it did not handle."""
    if not hasattr(engine, "wait_inputs"):
        return (*_step_with_aborts(engine, during_step), waiting)
    arrived = len(waiting)
    engine.wait_inputs = waiting                   # the wait pops what it hands over
    progressed, during_step = _step_with_aborts(engine, during_step)
    left, engine.wait_inputs = engine.wait_inputs, []
    # An input handed over inside the wait is new work: a step that only
    # completed empty batches but took an arrival there has not idled (else
    # the idle count ends the run `stuck` before the arrival is scheduled).
    return progressed or len(left) < arrived, during_step, left


def _stamp_engine_step(engine: BatchQueueEngine, step: int) -> None:
    """The engine-step number the recorder stamps on what it writes from
    now on (`engine_step`: inputs handed over before step `step`, then the
    step's own events); a scheduler without a recorder has no such field."""
    engine.current_step = step
    if hasattr(engine.scheduler, "flightcheck_engine_step"):
        engine.scheduler.flightcheck_engine_step = step


def _step_with_aborts(engine: BatchQueueEngine, during_step: list[str]) -> tuple[bool, list[str]]:
    """One engine step with the aborts that arrived for the aborts queue
    handed to it; returns whether it progressed and the aborts it did not
    apply (those it applied are gone; applying them again is a no-op in vLLM)."""
    if during_step:
        engine.aborts_queue.extend(during_step)    # type: ignore[attr-defined]
    progressed = engine.step_with_batch_queue()
    if during_step:
        during_step = list(engine.aborts_queue)    # type: ignore[attr-defined]
        engine.aborts_queue.clear()                # type: ignore[attr-defined]
    return progressed, during_step


def _where(err: Exception) -> str:
    """The exception and the innermost line that raised it (an assert's
    message is often empty: the line says which one failed)."""
    frames = traceback.extract_tb(err.__traceback__)
    text = f"{type(err).__name__}: {err}".rstrip(": ")
    if not frames:
        return text
    last = frames[-1]
    path = last.filename.split("site-packages/")[-1]
    return f"{text} at {path}:{last.lineno} in {last.name}: {(last.line or '').strip()}"
