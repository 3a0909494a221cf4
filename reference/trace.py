"""Trace writing in the format of docs/trace-format.md (JSON Lines, one event per line).

The scheduler writes nothing itself. `TracingScheduler` is a `Scheduler`
whose public calls are observed: after each one it reads what the trace
needs from the call's result and the scheduler's state, and hands it to a
`TraceWriter`, which writes each event as one `json.dumps` of a small dict
to a buffered text stream. `make_scheduler(config, trace)` builds one or
the other, so a plain run pays nothing for tracing.

Events this writer produces (every one carries `"step"`, the number of
`schedule()` + `update_from_output()` calls made so far):
* `config` once, with the scheduler's knobs (its `profile`, and the profile's
  constants a reader may override with: `policy`, `num_preallocate_tokens`,
  `release_order`; no reserved blocks; the keys of the writer's `extra`, when
  its harness gives some (`mutant`: the mutant it runs, verification/mutants);
  under the `vllm-0.33-async` profile also `async_scheduling: true`,
  `batch_queue_depth` (K + 1) and `decode_stagger` (K), docs/trace-format.md);
* `arrive` per added request, with `prompt_token_ids`, `eos_token_id`,
  `ignore_eos` and `stop_token_ids`;
* `schedule` per schedule() call that scheduled or preempted anything
  (`"batch": null` and no entries when it only preempted), entries with
  `block_ids` (and, under async scheduling, `placeholders`: the request's
  output placeholders after the call's update);
* `complete` per update_from_output(): `tokens` per entry as the scheduler
  took them (after the non-final-chunk filter, before stop trimming),
  `dropped` (entries whose tokens were not applied because their request
  finished, was aborted or was rescheduled since), and `next_drafts` (draft
  tokens proposed per request, only when some were);
* `finish` (reason `stop` or `length`) after the `complete` that caused it;
* `abort` for every abort that changed something (an abort is not also
  written as a `finish`);
* `input` per later input of a streaming session (its first, an `arrive`
  with `resumable: true`); the end of a session that finishes it at once
  writes no `finish` or `abort` besides;
* `end` when the writer is told the run is over.
Under async scheduling (`vllm-0.33-async`) every empty batch the engine
queues is noted as vLLM's recorder notes it (`notes_empty_batches: true` in
`config`; `empty_batch` on a `schedule` that only preempted; the others in
`empty_batches_before` of the next event written): the decode stagger counts
every schedule() call, and `step` here counts calls, not engine steps, so a
checker could not recover them from step gaps.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, TextIO

from .completion import Fate
from .config import SchedulerConfig
from .outputs import EngineCoreOutput, ModelRunnerOutput, SchedulerOutput
from .request import Request, RequestStatus
from .reset_pause import PauseState
from .scheduler import Scheduler


class TraceWriter:
    def __init__(self, sink: TextIO, *, eos_token_id: int | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        self._sink = sink
        self._eos_token_id = eos_token_id
        # Keys a harness adds to the config event (a mutant run: {"mutant": NAME}).
        self._extra = dict(extra or {})
        self._dumps = json.JSONEncoder(separators=(",", ":")).encode
        # empty batches scheduled or completed since the last event written
        self._empty_batches_before: list[dict[str, Any]] = []

    @classmethod
    def to_path(cls, path: str, **kwargs: Any) -> "TraceWriter":
        return cls(open(path, "w", buffering=1 << 16), **kwargs)

    def _write(self, event: dict[str, Any]) -> None:
        if self._empty_batches_before:
            event["empty_batches_before"] = self._empty_batches_before
            self._empty_batches_before = []
        self._sink.write(self._dumps(event))
        self._sink.write("\n")

    def config(self, cfg: SchedulerConfig) -> None:
        event: dict[str, Any] = {
            "ev": "config", "num_stages": cfg.num_pipeline_stages,
            "max_num_batched_tokens": cfg.max_num_batched_tokens,
            "max_num_seqs": cfg.max_num_seqs, "block_size": cfg.block_size,
            "num_blocks": cfg.num_blocks, "max_model_len": cfg.max_model_len,
            "long_prefill_token_threshold": cfg.long_prefill_token_threshold,
            "num_spec_tokens": cfg.num_spec_tokens,
            "prefix_caching": cfg.enable_prefix_caching, "policy": cfg.policy,
            "profile": cfg.profile, "num_preallocate_tokens": cfg.num_preallocate_tokens,
            "release_order": cfg.release_order, "writer": "flightcheck.reference",
        }
        if self._eos_token_id is not None:
            event["eos_token_id"] = self._eos_token_id
        if cfg.num_lookahead_tokens or cfg.draft_input_slots:      # a drafter with its own forward pass
            event.update(num_lookahead_tokens=cfg.num_lookahead_tokens, draft_input_slots=cfg.draft_input_slots)
        event.update(self._extra)
        if not cfg.enable_chunked_prefill:
            event["enable_chunked_prefill"] = False
        if cfg.prefill_schedule_interval > 1 and cfg.version_profile.prefill_cadence:
            event.update(prefill_schedule_interval=cfg.prefill_schedule_interval, notes_empty_batches=True)
        if cfg.cache_aware_admission_window:
            event.update(cache_aware_admission_window=cfg.cache_aware_admission_window,
                         cache_aware_admission_threshold=cfg.cache_aware_admission_threshold)
        if reorders_admission(cfg):
            event["notes_empty_batches"] = True
        if cfg.async_scheduling:
            event.update(async_scheduling=True, batch_queue_depth=cfg.batch_queue_depth,
                         decode_stagger=cfg.decode_stagger, notes_empty_batches=True)
        if cfg.kv_connector is not None:
            event["kv_connector"] = cfg.kv_connector.to_json()
        if cfg.scheduling_policy != "fcfs":
            event["scheduling_policy"] = cfg.scheduling_policy
        if cfg.max_loras:
            event["max_loras"] = cfg.max_loras            # a LoRA config (lora.py)
        if cfg.prompt_logprobs:
            event["prompt_logprobs"] = True
        self._write(event)

    def arrive(self, request: Request, step: int, kv_connector: bool = False) -> None:
        """`kv_connector`: also what the connector offers the request."""
        params = request.sampling_params
        event = {
            "ev": "arrive", "req": request.request_id, "step": step,
            "prompt_len": request.num_prompt_tokens, "max_tokens": params.max_tokens,
            "prompt_token_ids": request.prompt_token_ids,
            "eos_token_id": request.eos_token_id, "ignore_eos": params.ignore_eos,
            "stop_token_ids": list(params.stop_token_ids),
        }
        if kv_connector:
            offer = request.kv_offer
            event.update(external_hit=offer.hit if offer is not None else 0,
                         load_async=bool(offer is not None and offer.load_async))
        if request.priority:
            event["priority"] = request.priority
        if request.lora_int_id:
            event["lora"] = request.lora_int_id              # its LoRA (lora.py)
        if request.prompt_logprobs:
            event["prompt_logprobs"] = True
        if request.resumable:
            event["resumable"] = True          # a streaming session's first input
        self._write(event)

    def session_input(self, request: Request, step: int) -> None:
        """A streaming session's next input: `request` added under the
        session's live id (its new tokens and max_tokens; not resumable: the
        end of the session)."""
        event: dict[str, Any] = {"ev": "input", "req": request.request_id, "step": step}
        if request.resumable:
            event.update(num_tokens=request.num_prompt_tokens, max_tokens=request.sampling_params.max_tokens)
            if request.prompt_logprobs:
                event["prompt_logprobs"] = True      # its sampling parameters ask for them (lora.py)
        else:
            event["end_of_session"] = True
        self._write(event)

    def empty_batch(self, ev: str, number: int, step: int) -> None:
        """An empty batch scheduled (`ev` "schedule") or completed
        ("complete") with no event of its own: noted on the next event."""
        self._empty_batches_before.append({"ev": ev, "empty_batch": number, "step": step})

    def schedule(self, output: SchedulerOutput, step: int,
                 placeholders: dict[str, int] | None = None, empty_batch: int | None = None,
                 kv_connector: bool = False) -> None:
        """`placeholders`: under async scheduling, each scheduled request's
        output placeholders after the call (written per entry); `empty_batch`:
        the number of the empty batch a call that only preempted queued."""
        entries = [{
            "req": e.req_id, "start": e.num_computed_tokens, "n": e.num_new_tokens,
            "cached": e.num_cached_tokens, "drafts": len(e.spec_token_ids),
            "samples": e.samples, "block_ids": list(e.new_block_ids),
        } for e in output.entries]
        if placeholders is not None:
            for entry in entries:
                entry["placeholders"] = placeholders[entry["req"]]
        if kv_connector:
            for entry, data in zip(entries, output.entries):
                entry["external"] = data.external
        event: dict[str, Any] = {"ev": "schedule", "batch": output.batch_id, "step": step,
                                 "entries": entries, "preempted": list(output.preempted_req_ids)}
        if output.kv_loads:
            event["kv_loads"] = [{"req": req_id, "start": start} for req_id, start in output.kv_loads]
        if empty_batch is not None:
            event["empty_batch"] = empty_batch
        self._write(event)

    def complete(self, batch_id: int | None, step: int, tokens: dict[str, list[int]],
                 dropped: list[str], next_drafts: dict[str, int]) -> None:
        event: dict[str, Any] = {"ev": "complete", "batch": batch_id, "step": step,
                                 "tokens": tokens}
        if dropped:
            event["dropped"] = dropped
        if next_drafts:
            event["next_drafts"] = next_drafts
        self._write(event)

    def finish(self, req_id: str, reason: str, step: int, held: bool = False) -> None:
        """`held`: its blocks stay held for a KV transfer (a send)."""
        event = {"ev": "finish", "req": req_id, "reason": reason, "step": step}
        if held:
            event["held"] = True
        self._write(event)

    def abort(self, req_id: str, step: int, held: bool = False) -> None:
        """`held`: its blocks stay held for its KV load's report."""
        event = {"ev": "abort", "req": req_id, "step": step}
        if held:
            event["held"] = True
        self._write(event)

    def kv_report(self, kind: str, req_id: str, from_block: int, step: int) -> None:
        """A KV connector report as the scheduler processed it: `kv_received`,
        `kv_failed` (with `from_block`) or `kv_sent`."""
        event: dict[str, Any] = {"ev": kind, "req": req_id, "step": step}
        if kind == "kv_failed":
            event["from_block"] = from_block
        self._write(event)

    def reset(self, running: bool, connector: bool, preempted: list[str], ok: bool, step: int) -> None:
        """`reset_prefix_cache` (reset_pause.py): the running requests it
        preempted, tail first, whether the KV connector's cache was reset
        too, and whether the cache was reset."""
        self._write({"ev": "reset", "running": running, "connector": connector, "preempted": preempted, "ok": ok,
                     "step": step})

    def pause(self, state: str, step: int) -> None:
        """`set_pause_state`: "none", "new" or "all"."""
        self._write({"ev": "pause", "state": state, "step": step})

    def end(self) -> None:
        self._write({"ev": "end"})
        self._sink.flush()

    def close(self) -> None:
        self._sink.close()


def reorders_admission(cfg: SchedulerConfig) -> bool:
    """Whether vLLM 0.34's cache-aware reorder is in force: it runs in every
    schedule() call, empty ones too, so the trace notes those calls."""
    return bool(cfg.cache_aware_admission_window and cfg.enable_prefix_caching
                and cfg.version_profile.cache_aware_admission)


class TracingScheduler(Scheduler):
    """A `Scheduler` whose public calls are written to `trace`. Each override
    calls the policy unchanged, then writes what happened, read from the
    call's result and the scheduler's state. For `update_from_output` the
    entries' fates and tokens are read just before the call, with the
    scheduler's own steps (`_fate`, `_tokens_taken`), since applying the batch
    changes them; a batch holds one entry per request, so applying one entry
    changes no other entry's fate or tokens, and reading them all first gives
    what the call itself finds entry by entry."""

    def __init__(self, config: SchedulerConfig, trace: TraceWriter) -> None:
        super().__init__(config)
        self.trace = trace
        trace.config(config)
        # async, vLLM 0.34's admission reorder or the prefill cadence (whose
        # capacity bound an empty call's waiting loop records: the config
        # event says so): the empty batches in flight, by their output, and the next number
        cadenced = config.prefill_schedule_interval > 1 and config.version_profile.prefill_cadence
        self._notes_empty_batches = config.async_scheduling or reorders_admission(config) or cadenced
        self._empty_batch_numbers: dict[int, int] = {}
        self._next_empty_batch = 1
        # Inside update_from_output: finishes are written from its outputs.
        self._in_update = False
        # Inside a session input's add_request: its event stands for a finish.
        self._in_session_input = False

    def add_request(self, request: Request) -> None:
        if self.session_under(request.request_id) is None:
            super().add_request(request)
            self.trace.arrive(request, self.num_steps, self.connector is not None)
            return
        # a live session's next input: its `input` event stands for the finish
        # the end of the session may cause (docs/trace-format.md)
        self.trace.session_input(request, self.num_steps)
        self._in_session_input = True
        try:
            super().add_request(request)
        finally:
            self._in_session_input = False

    def finish_requests(self, request_ids: str | Iterable[str],
                        finished_status: RequestStatus) -> None:
        request_ids = (request_ids,) if isinstance(request_ids, str) else tuple(request_ids)
        # The requests this call finishes: known ids, each once, in order.
        finishing = [self.requests[req_id] for req_id in dict.fromkeys(request_ids)
                     if req_id in self.requests]
        super().finish_requests(request_ids, finished_status)
        if self._in_update or self._in_session_input:
            return                            # a KV load's error: written with the outputs
        for request in finishing:
            if finished_status == RequestStatus.FINISHED_ABORTED:
                self.trace.abort(request.request_id, self.num_steps,
                                 self.kv_held.get(request.request_id) is request)
            else:
                self.trace.finish(request.request_id, request.get_finished_reason(),
                                  self.num_steps)

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        preempted = [r.request_id for r in reversed(self.running)] if reset_running_requests else []
        try:
            ok = super().reset_prefix_cache(reset_running_requests, reset_connector)
        except RuntimeError:              # raised after the preemptions: the reset happened, not ok
            self.trace.reset(reset_running_requests, reset_connector, preempted, False, self.num_steps)
            raise
        self.trace.reset(reset_running_requests, reset_connector, preempted, ok, self.num_steps)
        return ok

    def set_pause_state(self, pause_state: PauseState | int) -> None:
        super().set_pause_state(pause_state)
        self.trace.pause(("none", "new", "all")[int(pause_state)], self.num_steps)

    def schedule(self) -> SchedulerOutput:
        output = super().schedule()
        empty_batch = None
        if self._notes_empty_batches and not output.entries:
            empty_batch, self._next_empty_batch = self._next_empty_batch, self._next_empty_batch + 1
            self._empty_batch_numbers[id(output)] = empty_batch
        if output.entries or output.preempted_req_ids or output.kv_loads:
            placeholders = None
            if self.config.async_scheduling:
                placeholders = {e.req_id: self.requests[e.req_id].num_output_placeholders
                                for e in output.entries}
            self.trace.schedule(output, self.num_steps, placeholders, empty_batch,
                                self.connector is not None)
        elif empty_batch is not None:
            self.trace.empty_batch("schedule", empty_batch, self.num_steps)
        return output

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        taken: dict[str, list[int]] = {}
        dropped: list[str] = []
        live: list[Request] = []
        kept: list[Request] = []              # every entry's request its output reached
        kv_skipped: set[str] = set()
        if self.connector is not None:
            self._in_update = True            # a failure's error finish: written with the outputs
            try:
                kv_skipped = self.prepare_kv_reports(scheduler_output)
            finally:
                self._in_update = False
        for entry in scheduler_output.entries:
            request = self.requests.get(entry.req_id)
            fate = self._predicted_fate(entry, request)
            if fate is Fate.SUPERSEDED or entry.req_id in kv_skipped:
                taken[entry.req_id] = list(model_runner_output.tokens_of(entry.req_id))
                dropped.append(entry.req_id)
                if entry.req_id in kv_skipped and not taken[entry.req_id] and request is not None:
                    kept.append(request)      # rolled back in place, nothing to drop: its drafts stay
                continue
            assert request is not None
            taken[entry.req_id] = list(self._tokens_taken(entry, request, fate,
                                                          model_runner_output))
            kept.append(request)
            if fate is Fate.LIVE and taken[entry.req_id]:
                live.append(request)
        self._in_update = True
        try:
            outputs = super().update_from_output(scheduler_output, model_runner_output)
        finally:
            self._in_update = False
        if not scheduler_output.entries:
            # An empty batch (vLLM 0.33's engine queues them) applies nothing:
            # no event, as vLLM's recorder writes none for it (async: noted);
            # a KV connector's reports may come with it.
            number = self._empty_batch_numbers.pop(id(scheduler_output), None)
            if number is not None:
                self.trace.empty_batch("complete", number, self.num_steps)
            self._trace_kv_reports("kv_failed")
            self._trace_finishes_and_kv_reports(outputs)
            return outputs
        # Drafts proposed to live requests that sampled and go on; where drafts
        # do not come with the output (vLLM 0.33), the drafts each request
        # this output reached holds now, as vLLM's recorder reads them.
        holders = live if self._drafts_with_output else kept
        next_drafts = {request.request_id: len(request.spec_token_ids) for request in holders
                       if not request.is_finished() and request.spec_token_ids}
        self._trace_kv_reports("kv_failed")   # taken before the outputs: they change fates
        self.trace.complete(scheduler_output.batch_id, self.num_steps, taken, dropped,
                            next_drafts)
        self._trace_finishes_and_kv_reports(outputs)
        return outputs

    def _trace_kv_reports(self, kind: str) -> None:
        """The KV connector's reports of `kind` the last output brought, or
        with kind "" those other than failures (landed loads, sends)."""
        if self.connector is None:
            return
        for seen, req_id, from_block in self.kv_reports_seen:
            if seen == kind or (not kind and seen != "kv_failed"):
                self.trace.kv_report(seen, req_id, from_block, self.num_steps)

    def _trace_finishes_and_kv_reports(self, outputs: list[EngineCoreOutput]) -> None:
        """The finishes (`held` for a send; a streaming session's turn that
        ended with its request going on is none), then the landed loads and sends."""
        for output in outputs:
            live = self.requests.get(output.request_id)
            if output.finish_reason is not None and (live is None or live.is_finished()):
                self.trace.finish(output.request_id, output.finish_reason, self.num_steps,
                                  output.request_id in self.kv_held)
        self._trace_kv_reports("")


def make_scheduler(config: SchedulerConfig, trace: TraceWriter | None = None) -> Scheduler:
    """The scheduler for `config`, traced to `trace` when one is given."""
    return Scheduler(config) if trace is None else TracingScheduler(config, trace)
