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
state shows about conformance (`observations`): a token appended to a
request whose incarnation changed since its batch was scheduled; a token
appended for a chunk that did not reach the request's known tokens when it
was scheduled; (0.8.4) `scheduled_req_ids` disagreeing with the batches
actually in flight; (0.33) a negative `num_in_flight_tokens` or
`num_stale_output_tokens`, and `num_in_flight_tokens` disagreeing with the
tokens of that request's batches actually in flight; (0.33 `AsyncScheduler`)
output placeholders breaching their invariants (`_fc_check_placeholders`).

Standard library only: this module never imports vLLM.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from .trace import TraceFile, trace_path_from_env

STAGES_ENV = "FLIGHTCHECK_NUM_STAGES"
FINISH_REASONS = {"FINISHED_STOPPED": "stop", "FINISHED_LENGTH_CAPPED": "length",
                  "FINISHED_ABORTED": "abort", "FINISHED_IGNORED": "length"}


@dataclass
class EntrySnapshot:
    """One request's share of a batch, as it was when the batch was scheduled."""
    req_id: str
    request: Any                 # the vLLM Request object scheduled (its identity matters)
    incarnation: int             # how many times that object had been admitted by then
    start: int
    n: int
    samples: bool


@dataclass
class BatchRecord:
    batch_id: int
    output: Any                  # the SchedulerOutput, kept so its id() stays unique
    entries: list[EntrySnapshot]


@dataclass
class Observations:
    """Ground truth read from vLLM's state, independent of any checker."""
    stale_tokens: list[dict[str, Any]] = field(default_factory=list)
    partial_chunk_tokens: list[dict[str, Any]] = field(default_factory=list)
    in_flight_set_mismatches: list[dict[str, Any]] = field(default_factory=list)
    # vLLM >= 0.33 (requests with num_in_flight_tokens): its per-request counters.
    counts_in_flight: bool = False
    negative_counters: list[dict[str, Any]] = field(default_factory=list)
    in_flight_counter_mismatches: list[dict[str, Any]] = field(default_factory=list)
    # vLLM 0.33's AsyncScheduler (a recorder with records_async_scheduling):
    # its output placeholders against the invariants they should keep.
    counts_placeholders: bool = False
    placeholder_mismatches: list[dict[str, Any]] = field(default_factory=list)
    # Speculative decoding (num_spec_tokens > 0): drafts vLLM kept past an
    # entry that scheduled none of them or through a preemption, then
    # scheduled (or preempted the request trying to); and an entry that
    # samples a request while another sampling entry of the same request is
    # in flight (that position is sampled twice).
    spec_decoding: bool = False
    leftover_drafts: list[dict[str, Any]] = field(default_factory=list)
    double_samples: list[dict[str, Any]] = field(default_factory=list)
    # ... and an entry of fewer than 0 tokens (num_computed_tokens past the
    # known tokens and drafts: 0.8.x's `num_new_tokens == 0` skip misses it).
    negative_schedules: list[dict[str, Any]] = field(default_factory=list)
    # ... and an entry reaching past max_model_len (vLLM 0.8.4 does not clip
    # the running loop to it; 0.8.5 does, "necessary when using spec decoding").
    beyond_max_model_len: list[dict[str, Any]] = field(default_factory=list)
    # ... and a request admitted (resumed) while holding drafts kept through a
    # preemption: 0.8.x's KVCacheManager.allocate_slots leaves
    # `len(spec_token_ids)` tokens out of the blocks it caches and lowers its
    # `num_cached_block` to that; a later allocation caches a block that has
    # a hash already (`assert blk.block_hash is None` in
    # BlockPool.cache_full_blocks) or a later prefix hit is smaller. Nothing
    # in the trace shows it before that.
    drafts_held_at_admission: list[dict[str, Any]] = field(default_factory=list)
    # ... and any allocation of slots while the request holds more drafts than
    # the entry schedules (the same under-caching, for a running request too).
    drafts_held_at_allocation: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "stale_tokens": self.stale_tokens, "partial_chunk_tokens": self.partial_chunk_tokens,
            "in_flight_set_mismatches": self.in_flight_set_mismatches}
        if self.counts_in_flight:
            found.update(negative_counters=self.negative_counters,
                         in_flight_counter_mismatches=self.in_flight_counter_mismatches)
        if self.counts_placeholders:
            found.update(placeholder_mismatches=self.placeholder_mismatches)
        if self.spec_decoding:
            found.update(leftover_drafts=self.leftover_drafts, double_samples=self.double_samples,
                         negative_schedules=self.negative_schedules,
                         beyond_max_model_len=self.beyond_max_model_len,
                         drafts_held_at_admission=self.drafts_held_at_admission,
                         drafts_held_at_allocation=self.drafts_held_at_allocation)
        return found


# vLLM 0.33's per-request counters (`Request.__init__`), checked for sign.
COUNTERS = ("num_in_flight_tokens", "num_stale_output_tokens")


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


def _status(request: Any) -> str:
    return request.status.name


class RecordingMixin:
    """Put in front of a vLLM scheduler class: `class R(RecordingMixin, Scheduler)`."""

    # Set by the concrete class (recorder.py): the vLLM version it runs under,
    # whether that version's engine queues empty batches, and whether the
    # class records the asynchronous scheduler (an AsyncScheduler subclass).
    vllm_version: str = "unknown"
    queues_empty_batches: bool = False
    records_async_scheduling: bool = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # vLLM 0.8.4's Scheduler takes `speculative_config` and keeps only its
        # look-ahead (EAGLE) share; k is read from the argument there.
        self._fc_speculative_config = kwargs.get("speculative_config")
        super().__init__(*args, **kwargs)
        if getattr(self.scheduler_config, "async_scheduling", False) and not self.records_async_scheduling:
            raise RuntimeError(
                f"{type(self).__qualname__} records vLLM's synchronous Scheduler, but this engine runs with "
                f"async scheduling (scheduler_config.async_scheduling), whose AsyncScheduler it would replace "
                f"(a --scheduler-cls is used as given): run with --no-async-scheduling, or use a recorder "
                f"of AsyncScheduler (flightcheck.vllm.recorder.RecordingAsyncScheduler)")
        if self.records_async_scheduling and not getattr(self.scheduler_config, "async_scheduling", False):
            raise RuntimeError(
                f"{type(self).__qualname__} records vLLM's AsyncScheduler, but this engine runs synchronous "
                f"scheduling (scheduler_config.async_scheduling is off): its output placeholders would "
                f"change what the engine decides; use flightcheck.vllm.recorder.RecordingScheduler")
        self.flightcheck_step = 0                      # schedule() + update_from_output() calls
        self.flightcheck_observations = Observations(spec_decoding=self._fc_num_spec_tokens() > 0)
        # ids of the requests whose allocate_slots found no room in the current
        # schedule() call (spec decoding only: the call is passed through).
        self._fc_failed_allocations: set[int] = set()
        if self.flightcheck_observations.spec_decoding:
            self._fc_watch_allocations()
        self._fc_next_empty = 1
        # Empty batches scheduled and completed since the last event written.
        self._fc_empty_log: list[dict[str, Any]] = []
        self._fc_empty_in_flight: dict[int, tuple[int, Any]] = {}   # id(SchedulerOutput) -> (number, it)
        self._fc_negative_seen: set[tuple[int, str]] = set()
        self._fc_placeholder_seen: set[tuple[int, str]] = set()
        self.flightcheck_observations.counts_placeholders = self.records_async_scheduling
        self._fc_mismatch_seen: dict[int, int] = {}
        self._fc_next_batch = 1
        self._fc_in_flight: dict[int, BatchRecord] = {}   # id(SchedulerOutput) -> its batch
        # id(Request) -> why the drafts it holds are left over (not proposed by
        # its latest completion): see Observations.leftover_drafts.
        self._fc_leftover_drafts: dict[int, str] = {}
        # request id -> (the Request object now under that id, times it was admitted)
        self._fc_admissions: dict[str, tuple[Any, int]] = {}
        self._fc_trace: TraceFile | None = None
        path = trace_path_from_env()
        if path is not None:
            self._fc_trace = TraceFile.open(path)
            self._fc_trace.write(self._fc_config_event())

    # -- the configuration, read from vLLM's state ------------------------------

    def _fc_num_stages(self) -> int:
        vllm_config = getattr(self, "vllm_config", None)
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
        k = getattr(self, "num_spec_tokens", None)
        if k is None and self._fc_speculative_config is not None:
            k = self._fc_speculative_config.num_speculative_tokens
        return int(k or 0)

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
            "num_spec_tokens": self._fc_num_spec_tokens(),
            "prefix_caching": bool(cache_config.enable_prefix_caching),
            "policy": "one-batch-per-request" if hasattr(self, "scheduled_req_ids") else "continue-prefill",
            "num_preallocate_tokens": getattr(self.kv_cache_manager, "num_preallocate_tokens", 0),
            "vllm_version": self.vllm_version, "writer": "flightcheck.vllm.recorder",
            **self._fc_async_config(),
        }

    def _fc_async_config(self) -> dict[str, Any]:
        """The async keys (docs/trace-format.md), read from vLLM's objects:
        the engine's queue depth (`VllmConfig.max_concurrent_batches`, K + 1
        with the V2 model runner) and the stagger `AsyncScheduler` applies
        (its `decode_stagger`, in force only with the V2 runner, which alone
        sets `next_decode_eligible_step`)."""
        if not self.records_async_scheduling:
            return {}
        vllm_config = self.vllm_config
        v2 = bool(getattr(self, "use_v2_model_runner", False))
        return {"async_scheduling": True,
                "batch_queue_depth": int(vllm_config.max_concurrent_batches),
                "decode_stagger": int(getattr(self, "decode_stagger", 0)) if v2 else 0,
                # every empty batch is noted (`empty_batches_before`), so a
                # checker counts the stagger's schedule() calls exactly, from
                # the first event on; `step` counts this recorder's calls,
                # not engine steps
                "notes_empty_batches": bool(self.queues_empty_batches)}

    def _fc_write(self, event: dict[str, Any], with_step: bool = True) -> None:
        if self._fc_trace is not None:
            if self._fc_empty_log:
                event["empty_batches_before"] = self._fc_empty_log
                self._fc_empty_log = []
            self._fc_trace.write(event, self.flightcheck_step if with_step else None)

    # -- the four calls ------------------------------------------------------------

    def add_request(self, request: Any) -> None:
        super().add_request(request)
        self.flightcheck_observations.counts_in_flight |= hasattr(request, "num_in_flight_tokens")
        params = request.sampling_params
        # 0.8.x keeps EOS on the request; 0.33 only in the sampling params
        # (check_stop reads sampling_params.eos_token_id).
        eos = request.eos_token_id if hasattr(request, "eos_token_id") else params.eos_token_id
        self._fc_write({
            "ev": "arrive", "req": request.request_id, "prompt_len": request.num_prompt_tokens,
            "max_tokens": request.max_tokens, "prompt_token_ids": list(request.prompt_token_ids),
            "eos_token_id": eos, "ignore_eos": bool(params.ignore_eos),
            "stop_token_ids": list(params.stop_token_ids or ()),
        })

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        # 0.33's schedule(throttle_prefills=False) is passed through as given.
        running_before = list(self.running)
        # Requests holding drafts, and whether only drafts are left to schedule.
        drafts_before = {id(r): r.num_tokens == r.num_computed_tokens for r in running_before
                         if getattr(r, "spec_token_ids", None)}
        output = super().schedule(*args, **kwargs)
        self.flightcheck_step += 1
        # vLLM preempts from the tail of `running` (Scheduler.schedule, running loop).
        preempted = [r.request_id for r in reversed(running_before) if _status(r) == "PREEMPTED"]
        entries = self._fc_entries(output)
        batch_id = None
        empty: int | None = None
        if output.total_num_scheduled_tokens > 0:
            batch_id = self._fc_next_batch
            self._fc_next_batch += 1
            if self.flightcheck_observations.spec_decoding:
                self._fc_watch_drafts(batch_id, entries, running_before, drafts_before)
            self._fc_in_flight[id(output)] = BatchRecord(batch_id, output, [e for e, _ in entries])
        elif self.flightcheck_observations.spec_decoding:
            self._fc_watch_drafts(None, entries, running_before, drafts_before)
        elif self.queues_empty_batches:
            empty = self._fc_next_empty
            self._fc_next_empty += 1
            self._fc_empty_in_flight[id(output)] = (empty, output)
        if entries or preempted:
            event: dict[str, Any] = {"ev": "schedule", "batch": batch_id,
                                     "entries": [event for _, event in entries], "preempted": preempted}
            if empty is not None:
                event["empty_batch"] = empty
            self._fc_write(event)
        elif empty is not None:
            self._fc_empty_log.append({"ev": "schedule", "empty_batch": empty, "step": self.flightcheck_step})
        self._fc_check_in_flight_set()
        self._fc_check_counters()
        self._fc_check_placeholders()
        return output

    def _fc_watch_allocations(self) -> None:
        """Note each request whose `KVCacheManager.allocate_slots` returns
        None (no room: vLLM then preempts from the tail of `running`) for
        slots that reach into its drafts, calling
        vLLM's method with the same arguments and returning its result."""
        manager = self.kv_cache_manager
        allocate = manager.allocate_slots

        def allocate_slots(request: Any, num_tokens: int, *args: Any, **kwargs: Any) -> Any:
            # Only a failure the drafts held caused counts: the known tokens
            # alone would have fit in the table and the free blocks.
            block_size = self.cache_config.block_size
            end = request.num_computed_tokens + num_tokens
            known_end = min(end, request.num_tokens)
            # (0.8.x's manager keeps `req_to_blocks`; a version without it is
            # not judged here: any failure reaching into drafts counts.)
            tables = getattr(manager, "req_to_blocks", None)
            held = len(tables.get(request.request_id, ())) if tables is not None else 0
            known_fits = tables is None or (-(-known_end // block_size) - held
                                            <= manager.block_pool.get_num_free_blocks())
            held_drafts = len(getattr(request, "spec_token_ids", ()) or ())
            if tables is not None and held_drafts > end - known_end:       # 0.8.x's manager
                # 0.8.x leaves every held draft out of the blocks it caches.
                self.flightcheck_observations.drafts_held_at_allocation.append({
                    "step": self.flightcheck_step + 1, "req": request.request_id,
                    "held": held_drafts, "scheduled": end - known_end})
            blocks = allocate(request, num_tokens, *args, **kwargs)
            if blocks is None and end > known_end and known_fits:
                self._fc_failed_allocations.add(id(request))
            return blocks

        manager.allocate_slots = allocate_slots

    def _fc_watch_drafts(self, batch_id: int | None, entries: list[tuple[EntrySnapshot, dict[str, Any]]],
                         running_before: list[Any], drafts_before: dict[int, bool]) -> None:
        """Speculative decoding's ground truth for one schedule() call (see
        Observations): vLLM 0.8.x keeps `spec_token_ids` when an entry
        schedules none of them (Scheduler.schedule trims only when
        `num_scheduled_spec_tokens > 0`) and through a preemption (which resets
        only the status and num_computed_tokens); 0.33 clears them in both."""
        observations = self.flightcheck_observations
        step = self.flightcheck_step
        was_running = {id(r) for r in running_before}
        for entry, written in entries:
            request = entry.request
            if id(request) not in was_running and request.spec_token_ids:
                observations.drafts_held_at_admission.append({"step": step, "batch": batch_id, "req": entry.req_id,
                                                              "drafts": len(request.spec_token_ids)})
            if entry.n < 0:
                observations.negative_schedules.append({"step": step, "req": entry.req_id, "n": entry.n})
            if entry.start + entry.n > self.max_model_len:
                observations.beyond_max_model_len.append({"step": step, "batch": batch_id, "req": entry.req_id,
                                                          "end": entry.start + entry.n})
            why = self._fc_leftover_drafts.get(id(request))
            if why is not None and written["drafts"]:
                observations.leftover_drafts.append({"step": step, "batch": batch_id, "req": entry.req_id,
                                                     "drafts": written["drafts"], "why": why})
            if entry.samples:
                earlier = next((b.batch_id for b in self._fc_in_flight.values() for e in b.entries
                                if e.request is request and e.incarnation == entry.incarnation and e.samples),
                               None)
                if earlier is not None:
                    observations.double_samples.append({"step": step, "batch": batch_id, "req": entry.req_id,
                                                        "in_flight": earlier})
            if id(request) in drafts_before and not written["drafts"] and request.spec_token_ids:
                self._fc_leftover_drafts.setdefault(id(request), f"left over by batch {batch_id}, which "
                                                                 f"scheduled none")
        failed, self._fc_failed_allocations = self._fc_failed_allocations, set()
        for request in running_before:
            if _status(request) != "PREEMPTED":
                continue
            why = self._fc_leftover_drafts.get(id(request))
            # It preempted itself: its own allocation, its leftover drafts
            # counted in, found no room (read from allocate_slots' results).
            if why is not None and id(request) in drafts_before and id(request) in failed:
                observations.leftover_drafts.append({"step": step, "batch": batch_id, "req": request.request_id,
                                                     "drafts": len(request.spec_token_ids),
                                                     "why": why + "; preempted scheduling them"})
            if request.spec_token_ids:
                self._fc_leftover_drafts.setdefault(id(request), "proposed before its preemption")

    def _fc_entries(self, output: Any) -> list[tuple[EntrySnapshot, dict[str, Any]]]:
        """Entries in the order vLLM placed them: `num_scheduled_tokens` is
        filled running requests first, then admissions (Scheduler.schedule)."""
        snapshot: dict[str, tuple[int, list[int], bool]] = {}
        for data in output.scheduled_new_reqs:
            snapshot[data.req_id] = (data.num_computed_tokens, _block_ids(data.block_ids), True)
        cached = output.scheduled_cached_reqs
        if isinstance(cached, list):            # vLLM <= 0.9.1: one CachedRequestData per request
            for data in cached:
                snapshot[data.req_id] = (data.num_computed_tokens, _block_ids(data.new_block_ids),
                                         bool(data.resumed_from_preemption))
        else:                                   # later: one per batch, parallel lists
            for i, req_id in enumerate(cached.req_ids):
                snapshot[req_id] = (cached.num_computed_tokens[i], _block_ids(cached.new_block_ids[i]),
                                    req_id in cached.resumed_req_ids)
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

    def _fc_admitted(self, request: Any) -> int:
        """How many times this Request object has been admitted (new or resumed)."""
        known = self._fc_admissions.get(request.request_id)
        return known[1] if known is not None and known[0] is request else 0

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        record = self._fc_in_flight.pop(id(scheduler_output), None)
        empty = self._fc_empty_in_flight.pop(id(scheduler_output), None)
        index = model_runner_output.req_id_to_index
        sampled = model_runner_output.sampled_token_ids
        entries = record.entries if record is not None else []
        # Where vLLM applies each entry's tokens: 0.8.x to the RUNNING request
        # of that id (Scheduler.update_from_output walks self.running); 0.33 to
        # self.requests[id] whatever its status (a request with
        # num_in_flight_tokens), skipping finished ones and drop-mode stale output.
        running = {r.request_id: r for r in self.running}
        targets: dict[str, Any] = {}
        for entry in entries:
            known = self.requests.get(entry.req_id)
            by_id = known is not None and hasattr(known, "num_in_flight_tokens")
            targets[entry.req_id] = known if by_id else running.get(entry.req_id)
        before = {req_id: (t.num_output_tokens, t.is_finished(), getattr(t, "num_stale_output_tokens", 0))
                  for req_id, t in targets.items() if t is not None}
        # Requests whose finish this output may cause: those its batch was
        # scheduled for, and those vLLM will apply it to (another incarnation
        # under a reused id).
        watched = {id(e.request): (e.req_id, e.request) for e in entries if not e.request.is_finished()}
        watched.update({id(t): (req_id, t) for req_id, t in targets.items() if t is not None and not t.is_finished()})
        returned = {e.req_id: (list(sampled[index[e.req_id]]) if e.req_id in index else []) for e in entries}
        result = super().update_from_output(scheduler_output, model_runner_output)
        self.flightcheck_step += 1
        dropped: list[str] = []
        stale: list[str] = []
        for entry in entries:
            tokens, target = returned[entry.req_id], targets[entry.req_id]
            if target is None:
                dropped.append(entry.req_id)
                continue
            outputs_before, finished_before, stale_before = before[entry.req_id]
            if stale_before > 0:
                stale.append(entry.req_id)     # vLLM counted it against the preempted share
            applied = bool(tokens) and target.num_output_tokens > outputs_before
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
        # The drafts vLLM now holds for each request this output was applied to
        # and that goes on (0.8.x: `update_from_output` sets `spec_token_ids`
        # from the model's output), read from vLLM's requests, not the output.
        next_drafts = {req_id: len(target.spec_token_ids) for req_id, target in targets.items()
                       if target is not None and req_id not in dropped and not target.is_finished()
                       and getattr(target, "spec_token_ids", None)}
        if getattr(model_runner_output, "spec_token_ids", None) is not None:
            for req_id, target in targets.items():          # drafts just proposed replace any left over
                if target is not None and req_id not in dropped:
                    self._fc_leftover_drafts.pop(id(target), None)
        if record is not None:
            event: dict[str, Any] = {"ev": "complete", "batch": record.batch_id, "tokens": returned}
            if dropped:
                event["dropped"] = dropped
            if stale:
                event["stale"] = stale
            if next_drafts:
                event["next_drafts"] = next_drafts
            self._fc_write(event)
        elif empty is not None:
            self._fc_empty_log.append({"ev": "complete", "empty_batch": empty[0], "step": self.flightcheck_step})
        # Without a batch queue (PP = 1) the engine's step() also hands an
        # empty SchedulerOutput back; no batch was in flight, so no event.
        for req_id, request in watched.values():
            if request.is_finished():
                self._fc_forget(request)
                self._fc_write({"ev": "finish", "req": req_id,
                                "reason": FINISH_REASONS.get(_status(request), _status(request))})
        self._fc_check_in_flight_set()
        self._fc_check_counters()
        self._fc_check_placeholders()
        return result

    def finish_requests(self, request_ids: Any, finished_status: Any) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else list(dict.fromkeys(request_ids))
        live = [i for i in ids if i in self.requests and not self.requests[i].is_finished()]
        super().finish_requests(request_ids, finished_status)
        reason = FINISH_REASONS.get(finished_status.name, finished_status.name)
        for req_id in live:
            self._fc_forget(self._fc_admissions.get(req_id, (None, 0))[0])
            if reason == "abort":
                self._fc_write({"ev": "abort", "req": req_id})
            # vLLM reports the request as finished with this status (DESIGN.md:
            # a writer may follow an abort with a finish of reason abort).
            self._fc_write({"ev": "finish", "req": req_id, "reason": reason})
        self._fc_check_in_flight_set()

    def _fc_forget(self, request: Any) -> None:
        known = self._fc_admissions.get(getattr(request, "request_id", None))
        if known is not None and known[0] is request:
            del self._fc_admissions[request.request_id]

    # -- ground truth and the end --------------------------------------------------

    def _fc_check_in_flight_set(self) -> None:
        """vLLM <= 0.8.4 keeps `scheduled_req_ids`, documented as the requests
        being executed; compare it with the unfinished requests that really have
        an entry in a batch in flight."""
        recorded = getattr(self, "scheduled_req_ids", None)
        if recorded is None:
            return
        truth = {e.req_id for batch in self._fc_in_flight.values() for e in batch.entries
                 if e.req_id in self.requests and self.requests[e.req_id] is e.request}
        if set(recorded) != truth:
            mismatches = self.flightcheck_observations.in_flight_set_mismatches
            if not mismatches or mismatches[-1]["extra"] != sorted(set(recorded) - truth) \
                    or mismatches[-1]["missing"] != sorted(truth - set(recorded)):
                mismatches.append({"step": self.flightcheck_step,
                                   "extra": sorted(set(recorded) - truth),
                                   "missing": sorted(truth - set(recorded))})

    def _fc_check_counters(self) -> None:
        """vLLM 0.33 keeps, per request, `num_in_flight_tokens` (the tokens of
        its batches scheduled and not yet processed; += in
        `Scheduler._update_after_schedule`, -= in `update_from_output`, looked
        up by id) and `num_stale_output_tokens` (`_preempt_request`). Record
        each counter that goes negative, and the in-flight counter disagreeing
        with the tokens of this very Request object's batches in flight (it
        fails when an id is reused while the old request's batch is in flight)."""
        observations = self.flightcheck_observations
        for request in self.requests.values():
            if not hasattr(request, "num_in_flight_tokens"):
                return
            observations.counts_in_flight = True
            for name in COUNTERS:
                value = getattr(request, name, 0)
                if value < 0 and (id(request), name) not in self._fc_negative_seen:
                    self._fc_negative_seen.add((id(request), name))
                    observations.negative_counters.append({
                        "step": self.flightcheck_step, "req": request.request_id, "counter": name, "value": value})
            if request.is_finished():
                continue
            truth = sum(e.n for batch in self._fc_in_flight.values() for e in batch.entries
                        if e.request is request)
            if request.num_in_flight_tokens != truth and id(request) not in self._fc_mismatch_seen:
                self._fc_mismatch_seen[id(request)] = self.flightcheck_step
                observations.in_flight_counter_mismatches.append({
                    "step": self.flightcheck_step, "req": request.request_id,
                    "num_in_flight_tokens": request.num_in_flight_tokens, "in_flight": truth})

    def _fc_check_placeholders(self) -> None:
        """vLLM 0.33's AsyncScheduler: for every RUNNING request, its output
        placeholders (`num_output_placeholders`) should equal the tokens of
        its sampling entries in flight (one each, without drafts), its
        counter should be `num_tokens + placeholders - 1` past a prefill
        chunk (`is_prefill_chunk` false, counter moved), and its outputs plus
        placeholders should not pass `max_tokens`. Each first breach per
        request and rule is recorded (read-only; nothing is changed)."""
        if not self.records_async_scheduling:
            return
        in_flight: dict[int, int] = {}
        for batch in self._fc_in_flight.values():
            for entry in batch.entries:
                if entry.samples:
                    in_flight[id(entry.request)] = in_flight.get(id(entry.request), 0) + 1
        spec = bool(getattr(self, "num_spec_tokens", 0))
        for request in list(self.running):
            if _status(request) != "RUNNING":
                continue
            placeholders = int(request.num_output_placeholders)
            breaches = {
                "placeholders = sampling entries in flight": not spec and placeholders != in_flight.get(id(request), 0),
                "num_computed = num_tokens + placeholders - 1": (
                    not spec and not request.is_prefill_chunk and request.num_computed_tokens > 0
                    and request.num_computed_tokens != request.num_tokens + placeholders - 1),
                "outputs + placeholders <= max_tokens": request.num_output_tokens + placeholders > request.max_tokens,
            }
            for rule, broken in breaches.items():
                if broken and (id(request), rule) not in self._fc_placeholder_seen:
                    self._fc_placeholder_seen.add((id(request), rule))
                    self.flightcheck_observations.placeholder_mismatches.append({
                        "step": self.flightcheck_step, "req": request.request_id, "rule": rule,
                        "placeholders": placeholders, "num_computed_tokens": request.num_computed_tokens,
                        "num_tokens": request.num_tokens, "max_tokens": request.max_tokens})

    @property
    def flightcheck_batches_in_flight(self) -> int:
        return len(self._fc_in_flight)

    def flightcheck_end(self, *, complete: bool = True) -> None:
        """Close the trace; `complete`: the run is over and no input is left
        (an `end` event, after which check-trace also checks liveness)."""
        if self._fc_trace is None:
            return
        if complete:
            self._fc_write({"ev": "end"}, with_step=False)
        self._fc_trace.close()
        self._fc_trace = None
