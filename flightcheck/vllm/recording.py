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

A completion is matched to its batch by the `SchedulerOutput` object that
`update_from_output` receives (the engine keeps that object in its batch
queue), not by counting. The mixin also keeps, for the replay, what vLLM's own
state shows about conformance (`observations`): a token appended to a
request whose incarnation changed since its batch was scheduled; a token
appended for a chunk that did not reach the request's known tokens when it
was scheduled; and (0.8.4) `scheduled_req_ids` disagreeing with the batches
actually in flight.

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

    def to_json(self) -> dict[str, Any]:
        return {"stale_tokens": self.stale_tokens, "partial_chunk_tokens": self.partial_chunk_tokens,
                "in_flight_set_mismatches": self.in_flight_set_mismatches}


def _status(request: Any) -> str:
    return request.status.name


class RecordingMixin:
    """Put in front of a vLLM scheduler class: `class R(RecordingMixin, Scheduler)`."""

    # Set by the concrete class (recorder.py): the vLLM version it runs under.
    vllm_version: str = "unknown"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.flightcheck_step = 0                      # schedule() + update_from_output() calls
        self.flightcheck_observations = Observations()
        self._fc_next_batch = 1
        self._fc_in_flight: dict[int, BatchRecord] = {}   # id(SchedulerOutput) -> its batch
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
            "num_spec_tokens": getattr(self, "num_spec_tokens", 0),
            "prefix_caching": bool(cache_config.enable_prefix_caching),
            "policy": "one-batch-per-request" if hasattr(self, "scheduled_req_ids") else "continue-prefill",
            "num_preallocate_tokens": getattr(self.kv_cache_manager, "num_preallocate_tokens", 0),
            "vllm_version": self.vllm_version, "writer": "flightcheck.vllm.recorder",
        }

    def _fc_write(self, event: dict[str, Any], with_step: bool = True) -> None:
        if self._fc_trace is not None:
            self._fc_trace.write(event, self.flightcheck_step if with_step else None)

    # -- the four calls ------------------------------------------------------------

    def add_request(self, request: Any) -> None:
        super().add_request(request)
        params = request.sampling_params
        self._fc_write({
            "ev": "arrive", "req": request.request_id, "prompt_len": request.num_prompt_tokens,
            "max_tokens": request.max_tokens, "prompt_token_ids": list(request.prompt_token_ids),
            "eos_token_id": request.eos_token_id, "ignore_eos": bool(params.ignore_eos),
            "stop_token_ids": list(params.stop_token_ids or ()),
        })

    def schedule(self) -> Any:
        running_before = list(self.running)
        output = super().schedule()
        self.flightcheck_step += 1
        # vLLM preempts from the tail of `running` (Scheduler.schedule, running loop).
        preempted = [r.request_id for r in reversed(running_before) if _status(r) == "PREEMPTED"]
        entries = self._fc_entries(output)
        batch_id = None
        if output.total_num_scheduled_tokens > 0:
            batch_id = self._fc_next_batch
            self._fc_next_batch += 1
            self._fc_in_flight[id(output)] = BatchRecord(batch_id, output, [e for e, _ in entries])
        if entries or preempted:
            self._fc_write({"ev": "schedule", "batch": batch_id,
                            "entries": [event for _, event in entries], "preempted": preempted})
        self._fc_check_in_flight_set()
        return output

    def _fc_entries(self, output: Any) -> list[tuple[EntrySnapshot, dict[str, Any]]]:
        """Entries in the order vLLM placed them: `num_scheduled_tokens` is
        filled running requests first, then admissions (Scheduler.schedule)."""
        snapshot: dict[str, tuple[int, list[int], bool]] = {}
        for data in output.scheduled_new_reqs:
            snapshot[data.req_id] = (data.num_computed_tokens, list(data.block_ids), True)
        for data in output.scheduled_cached_reqs:
            snapshot[data.req_id] = (data.num_computed_tokens, list(data.new_block_ids),
                                     bool(data.resumed_from_preemption))
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
            result.append((entry, {"req": req_id, "start": start, "n": n,
                                   "cached": start if admitted else 0,
                                   "drafts": len(drafts.get(req_id, ())), "samples": samples,
                                   "block_ids": block_ids}))
        return result

    def _fc_admitted(self, request: Any) -> int:
        """How many times this Request object has been admitted (new or resumed)."""
        known = self._fc_admissions.get(request.request_id)
        return known[1] if known is not None and known[0] is request else 0

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        record = self._fc_in_flight.pop(id(scheduler_output), None)
        index = model_runner_output.req_id_to_index
        sampled = model_runner_output.sampled_token_ids
        # vLLM applies a batch's tokens to whatever request of that id is
        # RUNNING now (Scheduler.update_from_output walks self.running).
        running = {r.request_id: r for r in self.running}
        returned: dict[str, list[int]] = {}
        dropped: list[str] = []
        entries = record.entries if record is not None else []
        for entry in entries:
            row = index.get(entry.req_id)
            tokens = list(sampled[row]) if row is not None else []
            returned[entry.req_id] = tokens
            current = running.get(entry.req_id)
            if current is None:
                dropped.append(entry.req_id)
            elif tokens and (current is not entry.request
                             or self._fc_admitted(current) != entry.incarnation):
                self.flightcheck_observations.stale_tokens.append({
                    "step": self.flightcheck_step + 1, "batch": record.batch_id, "req": entry.req_id,
                    "why": "aborted and re-added" if current is not entry.request else "preempted and resumed"})
            elif tokens and not entry.samples:
                # The model sampled for a chunk that, when it was scheduled, did
                # not reach the request's known tokens: the worker's view of the
                # request's length differed from the scheduler's.
                self.flightcheck_observations.partial_chunk_tokens.append({
                    "step": self.flightcheck_step + 1, "batch": record.batch_id, "req": entry.req_id,
                    "end": entry.start + entry.n})
        unfinished = {e.req_id: e.request for e in entries if not e.request.is_finished()}
        result = super().update_from_output(scheduler_output, model_runner_output)
        self.flightcheck_step += 1
        if record is not None:
            # Without a batch queue (PP = 1) the engine's step() also hands an
            # empty SchedulerOutput back; no batch was in flight, so no event.
            event: dict[str, Any] = {"ev": "complete", "batch": record.batch_id, "tokens": returned}
            if dropped:
                event["dropped"] = dropped
            self._fc_write(event)
        for req_id, request in unfinished.items():
            if request.is_finished():
                self._fc_forget(request)
                self._fc_write({"ev": "finish", "req": req_id,
                                "reason": FINISH_REASONS.get(_status(request), _status(request))})
        self._fc_check_in_flight_set()
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
