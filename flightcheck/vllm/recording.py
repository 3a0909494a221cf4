"""What a recorder does around vLLM's scheduler, written once for every
version: `RecordingMixin` goes in front of a vLLM scheduler class
(`recorder.py` binds it to `vllm.v1.core.sched.scheduler.Scheduler`; a later
version's `AsyncScheduler` gets the same mixin).

It observes the four calls the engine core makes (`add_request`, `schedule`,
`update_from_output`, `finish_requests`: vLLM 0.8.5
`vllm/v1/engine/core.py`, `EngineCore.add_request`, `abort_requests`,
`step_with_batch_queue`) and writes one trace event per call. It never
changes what vLLM decides: every hook calls vLLM's method with the same
arguments and returns its result unchanged; it only reads vLLM's state
before and after, and copies what it reads (vLLM trims returned token lists
in place).

Everything is read from vLLM's own objects, not from a table of versions:
* the policy: a scheduler with `scheduled_req_ids` (vLLM <= 0.8.4) runs one
  batch per request; without it (0.8.5, "[V1][PP] Continue scheduling
  prefill chunks") continue-prefill;
* `num_preallocate_tokens`: the KV cache manager's own attribute (64 in
  0.8.4's `KVCacheManager.__init__`, absent in 0.8.5);
* the pipeline depth: `vllm_config.parallel_config.pipeline_parallel_size`
  where the scheduler is given the config (0.8.5); 0.8.4's scheduler is not,
  and a deployment names it in FLIGHTCHECK_NUM_STAGES.

* vLLM 0.33 (read from `Scheduler.update_from_output` and `Request`): a
  batch's output is looked up in `self.requests` by id, whatever the
  request's status (a preempted request receives its stale output in
  deliver mode), where 0.8.x walks `running`; a request that has
  `num_in_flight_tokens` is one of those. Its `SchedulerOutput.
  scheduled_cached_reqs` is one batch-level `CachedRequestData` (parallel
  lists, `resumed_req_ids`) rather than a list per request, and block ids
  come per KV cache group (`tuple[list[int], ...]`; the recorder supports one
  full-attention group, as the trace format does).
* Empty batches (0.33's engine queues 0-token outputs and hands them to
  `update_from_output` too: `EngineCore.step_with_batch_queue`): whether the
  engine does is `queues_empty_batches`, set by the concrete class. They are
  written only as optional fields (docs/trace-format.md): `empty_batch` on a
  `schedule` event that preempted and scheduled nothing, and
  `empty_batches_before` on the next event written for the others, so a
  checker that does not model them reads the trace as before.
* A recorder stands in only for the scheduler class it subclasses: vLLM
  0.33's `scheduler_cls` replaces the class `get_scheduler_cls` would pick,
  `AsyncScheduler` included, so a recorder of the synchronous `Scheduler`
  refuses to start when `scheduler_config.async_scheduling` is on (its
  accounting has no output placeholders); an `AsyncScheduler` recorder sets
  `records_async_scheduling`.

A completion is matched to its batch by the `SchedulerOutput` object that
`update_from_output` receives (the engine keeps that object in its batch
queue), not by counting. The mixin also keeps, for the replay, what vLLM's own
state shows about conformance (`observations`): its checks are
`GroundTruthMixin` (ground_truth.py), which says what each one reads.

Where the events go (a file, a streamed sink, both) is sinks.py's
`open_trace_from_env`; the recorder only calls `write`.

Standard library only: this module never imports vLLM.
"""

from __future__ import annotations

import os
from typing import Any

from . import compat, drafter_recording, grammar_recording, lora_recording
from .ground_truth import BatchRecord, EntrySnapshot, GroundTruthMixin, status_name
from .reset_pause_recording import ResetPauseRecording
from .sinks import TraceWriter, open_trace_from_env

STAGES_ENV = "FLIGHTCHECK_NUM_STAGES"
SESSIONS_ENV = "FLIGHTCHECK_STREAMING_SESSIONS"     # "1": the engine serves streaming sessions
FINISH_REASONS = {"FINISHED_STOPPED": "stop", "FINISHED_LENGTH_CAPPED": "length",
                  "FINISHED_ABORTED": "abort", "FINISHED_IGNORED": "length",
                  # a KV load failed under kv_load_failure_policy "fail" (kv_recording.py)
                  "FINISHED_ERROR": "error"}


def _turn_ended(request: Any, stale_before: int, dropping_before: bool) -> bool:
    """A streaming session's (vLLM 0.33, 0.34 resumable request) output that
    ended its turn: applied, though the request's outputs were then cleared
    for its next input or it parked (docs/request-states.md): a live output, or
    a deliver-mode stale one (`_update_request_with_output(is_stale=True)`
    appends it, and `check_stop` may stop the preempted session there)."""
    delivered = stale_before <= 0 or not dropping_before
    return (bool(getattr(request, "resumable", False)) and delivered and not request.is_finished()
            and status_name(request) in ("WAITING", "WAITING_FOR_STREAMING_REQ"))


def _block_ids(value: Any) -> list[int]:
    """Block ids as the trace has them: vLLM <= 0.8 gives a list; later
    versions a tuple with one list per KV cache group (None: no new blocks)."""
    if value is None:
        return []
    value = list(value)
    if value and isinstance(value[0], (list, tuple)):
        if len(value) != 1:
            raise RuntimeError(f"flightcheck recorder: {len(value)} KV cache groups; the trace format has one")
        return list(value[0])
    return value


class RecordingMixin(ResetPauseRecording, GroundTruthMixin):
    """Put in front of a vLLM scheduler class: `class R(RecordingMixin, Scheduler)`."""

    # Set by the concrete class (recorder.py): the vLLM version it runs under,
    # whether that version's engine queues empty batches, and whether the
    # class records the asynchronous scheduler (an AsyncScheduler subclass).
    vllm_version: str = "unknown"
    queues_empty_batches: bool = False
    records_async_scheduling: bool = False
    # The engine-step number, set by an engine that numbers its steps (the
    # replay's, flightcheck/vllm/engine.py) before each step and before the
    # inputs it hands over ahead of it; written on every event as
    # `engine_step` (docs/trace-format.md, "Engine steps"). None (a
    # deployment): no `engine_step`.
    flightcheck_engine_step: int | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # vLLM 0.8.4's Scheduler takes `speculative_config` and keeps only its
        # look-ahead (EAGLE) share; k is read from the argument there.
        self._fc_speculative_config = kwargs.get("speculative_config")
        # Everything read from vLLM's classes is there (compat.py), or one line says what is not.
        compat.check_vllm(self.records_async_scheduling)
        super().__init__(*args, **kwargs)
        if compat.async_scheduling(self.scheduler_config) and not self.records_async_scheduling:
            raise RuntimeError(
                f"{type(self).__qualname__} records vLLM's synchronous Scheduler, but this engine runs with "
                f"async scheduling (scheduler_config.async_scheduling), whose AsyncScheduler it would replace "
                f"(a --scheduler-cls is used as given): run with --no-async-scheduling, or use a recorder "
                f"of AsyncScheduler (flightcheck.vllm.recorder.RecordingAsyncScheduler)")
        if self.records_async_scheduling and not compat.async_scheduling(self.scheduler_config):
            raise RuntimeError(
                f"{type(self).__qualname__} records vLLM's AsyncScheduler, but this engine runs synchronous "
                f"scheduling (scheduler_config.async_scheduling is off): its output placeholders would "
                f"change what the engine decides; use flightcheck.vllm.recorder.RecordingScheduler")
        self.flightcheck_step = 0                      # schedule() + update_from_output() calls
        self._fc_start_ground_truth(spec_decoding=self._fc_num_spec_tokens() > 0)
        self._fc_next_empty = 1
        self._fc_grammars_reported: set[str] = set()     # grammar events written (grammar_recording.py)
        # Empty batches scheduled and completed since the last event written.
        self._fc_empty_log: list[dict[str, Any]] = []
        self._fc_empty_in_flight: dict[int, tuple[int, Any]] = {}   # id(SchedulerOutput) -> (number, it)
        self._fc_next_batch = 1
        self._fc_in_flight: dict[int, BatchRecord] = {}   # id(SchedulerOutput) -> its batch
        # request id -> (the Request object now under that id, times it was admitted)
        self._fc_admissions: dict[str, tuple[Any, int]] = {}
        # requests whose finish finish_requests wrote during the update in
        # progress (vLLM 0.33/0.34 finish a KV load's errors inside
        # update_from_output): the update writes no second finish for them
        self._fc_finish_written: set[int] = set()
        # inside a streaming session's input (add_request under a live id)
        self._fc_in_session_input = False
        # FLIGHTCHECK_TRACE's file and/or FLIGHTCHECK_TRACE_SINK's stream (sinks.py)
        self._fc_trace: TraceWriter | None = open_trace_from_env()
        if self._fc_trace is not None:
            self._fc_trace.write(self._fc_config_event())

    # -- the configuration, read from vLLM's state ------------------------------

    def _fc_num_stages(self) -> int:
        vllm_config = compat.vllm_config(self)
        if vllm_config is not None:
            return int(vllm_config.parallel_config.pipeline_parallel_size)
        named = os.environ.get(STAGES_ENV)
        if named is None:
            raise RuntimeError(f"flightcheck recorder: this vLLM ({self.vllm_version}) does not give the "
                               f"scheduler its parallel config; set {STAGES_ENV} to the pipeline size")
        return int(named)

    def _fc_num_spec_tokens(self) -> int:
        """k: `Scheduler.num_spec_tokens` (0.8.5, 0.33), else the
        `speculative_config` argument's `num_speculative_tokens` (0.8.4)."""
        return compat.num_spec_tokens(self, self._fc_speculative_config)

    def _fc_config_event(self) -> dict[str, Any]:
        scheduler_config, cache_config = self.scheduler_config, self.cache_config
        num_blocks = int(self.kv_cache_config.num_blocks)
        return {
            "ev": "config", "num_stages": self._fc_num_stages(),
            "max_num_batched_tokens": scheduler_config.max_num_batched_tokens,
            "max_num_seqs": scheduler_config.max_num_seqs, "block_size": cache_config.block_size,
            # vLLM's block pool keeps one null block back (BlockPool.__init__).
            "num_blocks": num_blocks, "usable_blocks": num_blocks - 1,
            "max_model_len": self.max_model_len,
            "long_prefill_token_threshold": scheduler_config.long_prefill_token_threshold,
            "num_spec_tokens": self._fc_num_spec_tokens(), **drafter_recording.config_fields(self),
            "prefix_caching": bool(cache_config.enable_prefix_caching),
            "policy": "one-batch-per-request" if compat.one_batch_per_request(self) else "continue-prefill",
            "num_preallocate_tokens": compat.num_preallocate_tokens(self.kv_cache_manager),
            "vllm_version": self.vllm_version, "writer": "flightcheck.vllm.recorder",
            **self._fc_async_config(), **self._fc_admission_config(), **self._fc_policy_config(),
            **grammar_recording.config_fields(), **lora_recording.config_fields(self),
            # an engine serving streaming sessions says so (its `input` events)
            **({"streaming_sessions": True} if os.environ.get(SESSIONS_ENV) == "1" else {}),
        }

    def _fc_policy_config(self) -> dict[str, Any]:
        """The scheduling policy, written only when it is not FCFS (0.33+: `Scheduler.policy`)."""
        policy = compat.scheduling_policy(self)
        return {"scheduling_policy": policy} if policy != "fcfs" else {}

    def _fc_admission_config(self) -> dict[str, Any]:
        """Chunked prefill off, and vLLM 0.34's cache-aware admission window
        as the scheduler keeps it (`cache_aware_window`: 0 without FCFS or
        prefix caching); each written only when it is not vLLM's default."""
        event: dict[str, Any] = {}
        if not getattr(self.scheduler_config, "enable_chunked_prefill", True):
            event["enable_chunked_prefill"] = False
        interval = int(getattr(self, "local_prefill_interval", 1) or 1)
        if interval > 1:
            # its capacity bound is recorded in empty schedule() calls too: every one is noted
            event.update(prefill_schedule_interval=interval, notes_empty_batches=bool(self.queues_empty_batches))
        window = int(getattr(self, "cache_aware_window", 0) or 0)
        if window:
            # the reorder runs in empty schedule() calls too: every one is noted
            event.update(cache_aware_admission_window=window,
                         cache_aware_admission_threshold=float(self.cache_aware_threshold),
                         notes_empty_batches=bool(self.queues_empty_batches))
        return event

    def _fc_async_config(self) -> dict[str, Any]:
        """The async keys (docs/trace-format.md), read from vLLM's objects:
        the engine's queue depth (`VllmConfig.max_concurrent_batches`, K + 1
        with the V2 model runner) and the stagger `AsyncScheduler` applies
        (its `decode_stagger`, in force only with the V2 runner, which alone
        sets `next_decode_eligible_step`)."""
        if not self.records_async_scheduling:
            return {}
        return {"async_scheduling": True,
                "batch_queue_depth": compat.max_concurrent_batches(self.vllm_config),
                # (0.33.0: with the V2 runner only; 0.34.0: always)
                "decode_stagger": compat.decode_stagger(self) if compat.stagger_in_force(self) else 0,
                # every empty batch is noted (`empty_batches_before`), so a
                # checker counts the stagger's schedule() calls exactly, from
                # the first event on; `step` counts this recorder's calls,
                # not engine steps
                "notes_empty_batches": bool(self.queues_empty_batches)}

    def _fc_write(self, event: dict[str, Any], with_step: bool = True) -> None:
        self._fc_note_event(event)                   # the livelock watch's count of the environment's events
        if self._fc_trace is not None:
            if self._fc_empty_log:
                event["empty_batches_before"] = self._fc_empty_log
                self._fc_empty_log = []
            if with_step and self.flightcheck_engine_step is not None:
                event["engine_step"] = self.flightcheck_engine_step
            self._fc_trace.write(event, self.flightcheck_step if with_step else None)

    # -- the four calls ------------------------------------------------------------

    def _fc_in_preemption_order(self, running: list[Any]) -> list[Any]:
        """The order vLLM's running loop preempts in: from the tail of
        `running`; under the priority policy the largest (priority,
        arrival_time) first (`max` keeps the first of equal keys)."""
        if compat.scheduling_policy(self) == "priority":
            return sorted(running, key=lambda r: (-r.priority, -r.arrival_time))
        return list(reversed(running))

    def add_request(self, request: Any) -> None:
        if getattr(self.requests.get(request.request_id), "resumable", False):
            self._fc_session_input(request)              # a live streaming session's next input
            return
        super().add_request(request)
        # a new request under an id used before (a session's input after a failed grammar finished it)
        # has a grammar of its own to report
        self._fc_grammars_reported.discard(request.request_id)
        self.flightcheck_observations.counts_in_flight |= compat.counts_in_flight(request)
        params = request.sampling_params
        eos = compat.eos_token_id(request)
        event = {
            "ev": "arrive", "req": request.request_id, "prompt_len": request.num_prompt_tokens,
            "max_tokens": request.max_tokens, "prompt_token_ids": list(request.prompt_token_ids),
            "eos_token_id": eos, "ignore_eos": bool(params.ignore_eos),
            "stop_token_ids": list(params.stop_token_ids or ()), **grammar_recording.arrive_fields(request),
            **lora_recording.arrive_fields(request),
            **({"priority": compat.request_priority(request)} if compat.request_priority(request) else {}),
        }
        if getattr(request, "resumable", False):
            event["resumable"] = True                    # a streaming session's first input
        self._fc_write(event)

    def _fc_session_input(self, request: Any) -> None:
        """vLLM 0.33/0.34 `Scheduler.add_request` under a live id: a streaming
        session's next input (`StreamingUpdate`; not resumable: the end of
        the session). Written first; the finish the end may cause at once
        (`finish_requests`) is written by nothing else (docs/trace-format.md)."""
        if getattr(request, "resumable", False):
            self._fc_write({"ev": "input", "req": request.request_id, "num_tokens": request.num_prompt_tokens,
                            "max_tokens": request.max_tokens, **lora_recording.input_fields(request)})
        else:
            self._fc_write({"ev": "input", "req": request.request_id, "end_of_session": True})
        self._fc_check_input_reaches_session(request)          # ground_truth.py
        self._fc_in_session_input = True
        try:
            super().add_request(request)
        finally:
            self._fc_in_session_input = False
        self._fc_check_priority_heaps(request.request_id)     # ground_truth.py

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        # 0.33's schedule(throttle_prefills=False) is passed through as given.
        running_before = list(self.running)
        # Requests holding drafts, and whether only drafts are left to schedule.
        drafts_before = {id(r): r.num_tokens == r.num_computed_tokens for r in running_before
                         if getattr(r, "spec_token_ids", None)}
        for event in grammar_recording.settled_grammars(self.requests, self._fc_grammars_reported):
            self._fc_write(event)
        output = super().schedule(*args, **kwargs)
        self.flightcheck_step += 1
        # vLLM preempts from the tail of `running` (Scheduler.schedule, running loop), or by priority.
        preempted = [r.request_id for r in self._fc_in_preemption_order(running_before)
                     if status_name(r) == "PREEMPTED"]
        entries = self._fc_entries(output)
        batch_id = None
        empty: int | None = None
        if output.total_num_scheduled_tokens > 0:
            batch_id = self._fc_next_batch
            self._fc_next_batch += 1
            if self.flightcheck_observations.spec_decoding:
                self._fc_watch_drafts(batch_id, entries, running_before, drafts_before)
            self._fc_in_flight[id(output)] = BatchRecord(batch_id, output, [e for e, _ in entries])
        else:
            if self.flightcheck_observations.spec_decoding:
                self._fc_watch_drafts(None, entries, running_before, drafts_before)
            if self.queues_empty_batches:       # with drafts too: the async stagger counts them
                empty = self._fc_next_empty
                self._fc_next_empty += 1
                self._fc_empty_in_flight[id(output)] = (empty, output)
        if entries or preempted or self._fc_has_kv_loads():
            event: dict[str, Any] = {"ev": "schedule", "batch": batch_id,
                                     "entries": [event for _, event in entries], "preempted": preempted,
                                     **drafter_recording.schedule_fields(output)}
            if empty is not None:
                event["empty_batch"] = empty
            self._fc_write(event)
        elif empty is not None:
            self._fc_empty_log.append({"ev": "schedule", "empty_batch": empty, "step": self.flightcheck_step})
        self._fc_check_state(preempted=preempted)             # ground_truth.py
        return output

    def _fc_entries(self, output: Any) -> list[tuple[EntrySnapshot, dict[str, Any]]]:
        """Entries in the order vLLM placed them: `num_scheduled_tokens` is
        filled running requests first, then admissions (Scheduler.schedule)."""
        snapshot: dict[str, tuple[int, list[int], bool]] = {}
        for data in output.scheduled_new_reqs:
            snapshot[data.req_id] = (data.num_computed_tokens, _block_ids(data.block_ids), True)
        # (0.34.0 sends a resumed request as new-request data: admitted above)
        for req_id, start, new_block_ids, resumed in compat.cached_rows(output.scheduled_cached_reqs):
            snapshot[req_id] = (start, _block_ids(new_block_ids), resumed)
        drafts = output.scheduled_spec_decode_tokens
        result = []
        for req_id, n in output.num_scheduled_tokens.items():
            request = self.requests[req_id]
            start, block_ids, admitted = snapshot[req_id]
            if admitted:
                self._fc_admissions[req_id] = (request, self._fc_admitted(request) + 1)
            # Outputs are appended only in update_from_output, so num_tokens is
            # still what it was when this batch was built: the entry samples iff
            # it reaches the end of the known tokens (as the model runner decides).
            samples = start + n >= request.num_tokens
            entry = EntrySnapshot(req_id, request, self._fc_admitted(request), start, n, samples)
            written = {"req": req_id, "start": start, "n": n, "cached": start if admitted else 0,
                       "drafts": len(drafts.get(req_id, ())), "samples": samples, "block_ids": block_ids}
            if self.records_async_scheduling:
                # After AsyncScheduler._update_after_schedule (schedule() has returned).
                written["placeholders"] = int(request.num_output_placeholders)
            result.append((entry, written))
        return result

    def _fc_has_kv_loads(self) -> bool:
        """Whether this schedule() call parked a request for an async KV load
        (kv_recording.py writes those; a recorder without it: never)."""
        return False

    def _fc_admitted(self, request: Any) -> int:
        """How many times this Request object has been admitted (new or resumed)."""
        known = self._fc_admissions.get(request.request_id)
        return known[1] if known is not None and known[0] is request else 0

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        record = self._fc_in_flight.pop(id(scheduler_output), None)
        empty = self._fc_empty_in_flight.pop(id(scheduler_output), None)
        entries = record.entries if record is not None else []
        targets = self._fc_targets(entries)
        before = {req_id: (t.num_output_tokens, t.is_finished(), getattr(t, "num_stale_output_tokens", 0),
                           bool(getattr(t, "drop_stale_output", False)))
                  for req_id, t in targets.items() if t is not None}
        # Requests whose finish this output may cause: those its batch was
        # scheduled for, and those vLLM will apply it to (another incarnation
        # under a reused id).
        watched = {id(e.request): (e.req_id, e.request) for e in entries if not e.request.is_finished()}
        watched.update({id(t): (req_id, t) for req_id, t in targets.items() if t is not None and not t.is_finished()})
        index, sampled = compat.output_index(model_runner_output), model_runner_output.sampled_token_ids
        returned = {e.req_id: (list(sampled[index[e.req_id]]) if e.req_id in index else []) for e in entries}
        self._fc_finish_written = set()
        self._fc_grammar_finishes: list[dict[str, Any]] | None = []    # written after the complete event
        self._fc_check_grammar_errors()                                # ground_truth.py
        try:
            result = super().update_from_output(scheduler_output, model_runner_output)
        except Exception:
            # vLLM raised mid-update (0.34: a reused id's older batch, bound to
            # the new request, trips `_update_request_with_output`'s assert on
            # its placeholders after appending its tokens): what it applied is written.
            self.flightcheck_step += 1
            if record is not None:
                self._fc_write_completion(record.batch_id, returned, *self._fc_applied(record, returned, targets,
                                                                                         before), {})
            # and the counters it moved before raising (0.33, 0.34: the older batch drained
            # the new request's stale share below 0, `num_stale_output_tokens >= 0`)
            self._fc_check_counters(targets.values())          # ground_truth.py
            raise
        grammar_finishes, self._fc_grammar_finishes = self._fc_grammar_finishes, None
        self.flightcheck_step += 1
        dropped, stale = self._fc_applied(record, returned, targets, before) if record is not None else ([], [])
        # a drop-mode stale output (a reset request's) reaches nothing, its drafts included
        discarded = dropped + [r for r in stale if getattr(targets.get(r), "drop_stale_output", False)]
        next_drafts = self._fc_drafts_after(targets, discarded, model_runner_output)
        if record is not None:
            self._fc_write_completion(record.batch_id, returned, dropped, stale, next_drafts)
        elif empty is not None:
            self._fc_empty_log.append({"ev": "complete", "empty_batch": empty[0], "step": self.flightcheck_step})
        for event in grammar_finishes:
            self._fc_write(event)
        # Without a batch queue (PP = 1) the engine's step() also hands an
        # empty SchedulerOutput back; no batch was in flight, so no event.
        for req_id, request in watched.values():
            if request.is_finished() and id(request) not in self._fc_finish_written:
                self._fc_forget(request)
                self._fc_write({"ev": "finish", "req": req_id,
                                "reason": FINISH_REASONS.get(status_name(request), status_name(request))})
        self._fc_check_state(targets.values())             # ground_truth.py
        return result

    def _fc_targets(self, entries: list[EntrySnapshot]) -> dict[str, Any]:
        """The request vLLM applies each entry's tokens to (None: none).
        0.8.x: the RUNNING request of that id (Scheduler.update_from_output
        walks self.running); 0.33: self.requests[id] whatever its status (a
        request with num_in_flight_tokens), skipping finished ones and
        drop-mode stale output."""
        running = {r.request_id: r for r in self.running}
        targets: dict[str, Any] = {}
        for entry in entries:
            known = self.requests.get(entry.req_id)
            by_id = known is not None and compat.counts_in_flight(known)
            targets[entry.req_id] = known if by_id else running.get(entry.req_id)
        return targets

    def _fc_applied(self, record: BatchRecord, returned: dict[str, list[int]], targets: dict[str, Any],
                    before: dict[str, tuple[int, bool, int, bool]]) -> tuple[list[str], list[str]]:
        """After vLLM applied a batch's output: its entries whose tokens vLLM
        dropped, and those it counted against a preempted share (stale); a
        token applied to another incarnation, or for a chunk that did not
        sample, is noted in the observations."""
        dropped: list[str] = []
        stale: list[str] = []
        for entry in record.entries:
            tokens, target = returned[entry.req_id], targets[entry.req_id]
            if target is None:
                dropped.append(entry.req_id)
                continue
            outputs_before, finished_before, stale_before, dropping_before = before[entry.req_id]
            if stale_before > 0:
                stale.append(entry.req_id)     # vLLM counted it against the preempted share
            applied = bool(tokens) and (target.num_output_tokens > outputs_before
                                        or _turn_ended(target, stale_before, dropping_before))
            if finished_before or (tokens and not applied):
                dropped.append(entry.req_id)
            elif applied and (target is not entry.request or self._fc_admitted(target) != entry.incarnation):
                self.flightcheck_observations.stale_tokens.append({
                    "step": self.flightcheck_step, "batch": record.batch_id, "req": entry.req_id,
                    "why": "aborted and re-added" if target is not entry.request else "preempted and resumed"})
            elif applied and not entry.samples:
                # The model sampled for a chunk that, when it was scheduled, did
                # not reach the request's known tokens: the worker's view of the
                # request's length differed from the scheduler's.
                self.flightcheck_observations.partial_chunk_tokens.append({
                    "step": self.flightcheck_step, "batch": record.batch_id, "req": entry.req_id,
                    "end": entry.start + entry.n})
        return dropped, stale

    def _fc_write_completion(self, batch_id: int, returned: dict[str, list[int]], dropped: list[str],
                             stale: list[str], next_drafts: dict[str, int]) -> None:
        # the optional keys only when non-empty, in the format's order
        optional = (("dropped", dropped), ("stale", stale), ("next_drafts", next_drafts))
        self._fc_write({"ev": "complete", "batch": batch_id, "tokens": returned,
                        **{key: value for key, value in optional if value}})

    def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
        ids = [request_ids] if isinstance(request_ids, str) else list(dict.fromkeys(request_ids))
        unordered = isinstance(request_ids, (set, frozenset)) and len(ids) > 1
        if unordered:
            ids = self._fc_scan_order(ids)
        live = [i for i in ids if i in self.requests and not self.requests[i].is_finished()]
        self._fc_finish_written.update(id(self.requests[i]) for i in live)
        reason = FINISH_REASONS.get(finished_status.name, finished_status.name)
        # a failed grammar's finish, inside an update: written after its complete event
        deferred = getattr(self, "_fc_grammar_finishes", None)
        grammar_errors = {i for i in live if deferred is not None
                          and grammar_recording.is_grammar_error(self.requests[i], reason)}
        # vLLM's result is returned as is (0.34's update_from_output iterates
        # the requests it finished with FINISHED_ERROR on a KV load failure).
        # A set (a KV load failure's requests) vLLM frees in the set's order,
        # which string hashing makes differ from run to run, and with it the
        # free queue: they are finished one by one in the order
        # `_handle_invalid_blocks` found them, one of the orders vLLM may take.
        if not unordered:
            finished = super().finish_requests(request_ids, finished_status)
        else:
            finished = []
            for req_id in ids:             # (no super() inside a comprehension before Python 3.12)
                finished.extend(super().finish_requests(req_id, finished_status))
        for req_id in live:
            self._fc_forget(self._fc_admissions.get(req_id, (None, 0))[0])
            if self._fc_in_session_input:
                continue                    # the end of a session: its `input` event stands for it
            if reason == "abort":
                self._fc_write({"ev": "abort", "req": req_id})
            # vLLM reports the request as finished with this status (docs/trace-format.md, `finish`:
            # a writer may follow an abort with a finish of reason abort).
            if req_id in grammar_errors:
                deferred.append({"ev": "finish", "req": req_id, "reason": reason})
                continue
            self._fc_write({"ev": "finish", "req": req_id, "reason": reason})
        self._fc_check_in_flight_set()
        return finished

    def _fc_scan_order(self, ids: list[str]) -> list[str]:
        """`ids` as `_handle_invalid_blocks` scans requests: parked loads
        (`kv_holding_waiting`, 0.33 on), then `running`, then any other by name."""
        queue = [r.request_id for r in compat.queued_requests(getattr(self, "kv_holding_waiting", ()))]
        order = {req_id: i for i, req_id in enumerate(queue + [r.request_id for r in self.running])}
        return sorted(ids, key=lambda i: (order.get(i, len(order)), i))

    def _fc_forget(self, request: Any) -> None:
        known = self._fc_admissions.get(getattr(request, "request_id", None))
        if known is not None and known[0] is request:
            del self._fc_admissions[request.request_id]

    # -- the end ---------------------------------------------------------------------

    def flightcheck_end(self, *, complete: bool = True) -> None:
        """Close the trace; `complete`: the run is over and no input is left
        (an `end` event, after which check-trace also checks liveness)."""
        if self._fc_trace is None:
            return
        if complete:
            self._fc_write({"ev": "end"}, with_step=False)
        self._fc_trace.close()
        self._fc_trace = None
