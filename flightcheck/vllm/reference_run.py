"""The reference side of the differential against vLLM (differential.py):
one workload through the reference scheduler under a version profile,
driven by the replay's own engine loop and fabricated model (engine.py:
`BatchQueueEngine`, `run_busy_loop`, `FabricatedModel`; standard library and
duck-typed, so the reference drives through them with a thin adapter,
`_ReferenceSide`), its trace written in the trace format.

A workload may give the run a KV connector (`kv_connector`, top level or
in `config`, and a request's `kv`: reference/connector.py, the same format
the vLLM side's fabricated connector reads): the reference then runs its
fabricated connector with those offers (`split_kv_connector`).

`run_reference(..., vllm_outputs=True)` is the conforming run: the
reference with its deliberate deviations switched to vLLM's behaviour, the
constants of the version's released profile (`SchedulerConfig(as_released=True)`,
reference/profiles.py `RELEASED`), the plain `TracingScheduler` otherwise.

Standard library and flightcheck.reference only.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from types import SimpleNamespace
from collections.abc import Callable, Sequence
from typing import Any

from flightcheck.reference import (ModelRunnerOutput, Request, RequestStatus, SamplingParams,
                                   SchedulerConfig, TraceWriter, TracingScheduler)
from flightcheck.reference.connector import KvConnectorConfig, KvOffer, connector_from_json, offer_from_json
from flightcheck.reference.outputs import RequestData
from flightcheck.reference.profiles import PROFILES, get_profile
from flightcheck.verification.mutants.patching import reference_applied

from .engine import (BatchQueueEngine, BatchQueueEngineV033, BatchQueueEngineV034, FabricatedModel, RunOutcome,
                     run_busy_loop)
from .priority_workload import ArrivalClock
from .reset_pause_workload import call_event
from .grammar_replay import FabricatedGrammar
from .grammar_workload import CompileClock
from .lookahead_workload import draft_input_slots
from .lora_workload import asks_prompt_logprobs
from .versions import BATCH_QUEUE_V033_LOOPS, RELEASES, release, release_of_profile
from .workload import RequestSpec, Workload, workload_from_json


class _BatchView:
    """A reference batch as vLLM 0.33's model runner reads a `SchedulerOutput`:
    one batch-level `CachedRequestData` with parallel lists (`req_ids`,
    `num_computed_tokens`, `num_output_tokens`, no `new_token_ids` for the
    V1 runner's last rank), read when the batch is formed. `output` is the
    reference's own, handed back to its `update_from_output`."""

    def __init__(self, output: Any, scheduler: TracingScheduler, v2_runner: bool = False) -> None:
        self.output = output
        cached = output.scheduled_cached_reqs
        self.scheduled_new_reqs = output.scheduled_new_reqs
        if v2_runner:
            # The V2 runner (0.33 async; 0.34, which has no other) gets a new
            # request, and a resumed one (sent as new: 0.33's
            # `scheduled_new_reqs.extend(scheduled_resumed_reqs)`, 0.34's
            # `Scheduler.schedule`), with all its tokens
            # (`NewRequestData.from_request(req, ..., prefill_token_ids)`):
            # tokens already appended to it (an older request's output bound
            # by a reused id) are part of its prefill.
            resumed = [entry for entry in cached if entry.resumed_from_preemption]
            cached = [entry for entry in cached if not entry.resumed_from_preemption]
            self.scheduled_new_reqs = [
                SimpleNamespace(req_id=entry.req_id,
                                prompt_token_ids=list(scheduler.requests[entry.req_id].prompt_token_ids),
                                num_computed_tokens=entry.num_computed_tokens,
                                prefill_token_ids=list(scheduler.requests[entry.req_id].all_token_ids))
                for entry in [*output.scheduled_new_reqs, *resumed]]
        self.scheduled_cached_reqs = SimpleNamespace(
            req_ids=[entry.req_id for entry in cached],
            num_computed_tokens=[entry.num_computed_tokens for entry in cached],
            new_token_ids=[],
            num_output_tokens=[_outputs_when_scheduled(scheduler.requests[entry.req_id], entry)
                               for entry in cached])
        self.num_scheduled_tokens = output.num_scheduled_tokens
        self.total_num_scheduled_tokens = output.total_num_scheduled_tokens
        self.scheduled_spec_decode_tokens = output.scheduled_spec_decode_tokens
        self.finished_req_ids = output.finished_req_ids
        self.pending_structured_output_tokens = output.pending_structured_output_tokens
        self.skip_drafts = output.skip_drafts        # the fabricated drafter proposes nothing then


def _outputs_when_scheduled(request: Request, entry: RequestData) -> int:
    """vLLM 0.33's `CachedRequestData.num_output_tokens` for the entry: the
    request's outputs plus its output placeholders as they were when the
    snapshot was built, before `_update_after_schedule` (the reference's
    snapshot is read after it: the entry's own placeholders, if it added any,
    are taken off again; 0 without async scheduling)."""
    placeholders = request.num_output_placeholders
    if placeholders and not request.is_prefill_chunk:
        placeholders -= 1 + len(entry.spec_token_ids)
    return request.num_output_tokens + placeholders


class _ReferenceSide:
    """The reference scheduler as engine.py's loop sees vLLM's: vLLM's
    `has_requests`, an `update_from_output` whose result has `.outputs`."""

    def __init__(self, scheduler: TracingScheduler, batch_level_cached_data: bool = False,
                 v2_runner: bool = False) -> None:
        self.scheduler = scheduler
        self.saw_duplicate_cached_block = False
        # vLLM 0.33's runner reads one batch-level CachedRequestData (_BatchView).
        self.batch_level_cached_data = batch_level_cached_data
        # The V2 model runner (0.33 async; 0.34 always, it has no other) is
        # told of a new request's tokens by `prefill_token_ids`.
        self.v2_runner = v2_runner
        self.kv_reported = False           # the last update's output reported a transfer

    @property
    def waiting(self) -> Any:
        """Every waiting queue (the KV connector's too: empty without one)."""
        scheduler = self.scheduler
        return [*scheduler.kv_holding_waiting, *scheduler.waiting]

    @property
    def running(self) -> Any:
        return self.scheduler.running

    def has_requests(self) -> bool:
        """Unfinished requests, finished ids not yet sent, or (with a KV
        connector) finished requests whose blocks a transfer holds."""
        return self.scheduler.has_requests()

    def get_num_unscheduled_requests(self) -> int:
        return self.scheduler.get_num_unscheduled_requests()

    def kv_transfers_pending(self) -> int:
        """Whether the reference's connector has a transfer still to report
        (engine.py counts it as progress, as it does the bridge's)."""
        connector = self.scheduler.connector
        return int(connector is not None and connector.has_pending_reports())

    def schedule(self) -> Any:
        output = self.scheduler.schedule()
        if not self.saw_duplicate_cached_block:
            cached = self.scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block
            self.saw_duplicate_cached_block = any(len(copies) > 1 for copies in cached.values())
        return (_BatchView(output, self.scheduler, self.v2_runner)
                if self.batch_level_cached_data else output)

    def update_draft_token_ids(self, draft_token_ids: Any) -> None:
        """vLLM 0.33's `update_draft_token_ids(DraftTokenIds)` (the sync
        engine's `post_step`), as the reference takes it."""
        self.scheduler.update_draft_token_ids(draft_token_ids.req_ids, draft_token_ids.draft_token_ids)

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        """The reference's update; `kv_reported`: its connector's output for
        this update reported a transfer (engine.py counts the step as news,
        as it does the bridge's worker's report, `KVWorker.attach`)."""
        if isinstance(scheduler_output, _BatchView):
            scheduler_output = scheduler_output.output
        connector = self.scheduler.connector
        before = connector.outputs_reporting if connector is not None else 0
        outputs = self.scheduler.update_from_output(scheduler_output, model_runner_output)
        self.kv_reported = connector is not None and connector.outputs_reporting > before
        return SimpleNamespace(outputs=outputs)


def _model_output(req_ids: list[str], req_id_to_index: dict[str, int],
                  sampled_token_ids: list[list[int]], spec_token_ids: list[list[int]] | None = None,
                  **_: Any) -> ModelRunnerOutput:
    return ModelRunnerOutput(req_ids=req_ids, req_id_to_index=req_id_to_index,
                             sampled_token_ids=sampled_token_ids, spec_token_ids=spec_token_ids)


def split_kv_connector(raw_workload: dict[str, Any]) -> tuple[dict[str, Any], KvConnectorConfig | None,
                                                                dict[str, KvOffer]]:
    """A workload's KV connector (`kv_connector`, top level or in `config`)
    and its requests' offers (`kv`, by the request's own `id`), and the
    workload without them (the reference runs its own connector from the
    two; `workload_from_json` refuses a request's `kv` without a
    connector). No connector: (raw, None, {}), the offers ignored."""
    raw = dict(raw_workload)
    config = dict(raw.get("config", {}))
    connector_raw = raw.pop("kv_connector", None)
    if "kv_connector" in config:
        connector_raw = config.pop("kv_connector")
        raw["config"] = config
    connector = connector_from_json(connector_raw)
    offers: dict[str, KvOffer] = {}
    for index, request in enumerate(raw.get("requests", ())):
        offer = offer_from_json(request.get("kv")) if isinstance(request, dict) else None
        if offer is not None:
            offers[str(request.get("id", index))] = offer
    if isinstance(raw.get("requests"), list):
        raw["requests"] = [{k: v for k, v in request.items() if k != "kv"} if isinstance(request, dict)
                           else request for request in raw["requests"]]
    return raw, connector, offers


def reference_config(workload: Workload, profile: str, as_released: bool = False,
                     kv_connector: KvConnectorConfig | None = None,
                     kv_error_order: tuple[str, ...] = ()) -> SchedulerConfig:
    """The reference's configuration for a replay workload: vLLM keeps one
    null block back, so the reference gets one block fewer.

    The reference refuses a pool that cannot hold one request of
    max_model_len tokens; vLLM does not. When the workload's pool is smaller,
    max_model_len becomes the pool's tokens, which changes no decision as long
    as every request's prompt and outputs fit in it (then no length limit or
    clip reaches it, and 0.8.4's per-request preallocation cap, the pool's
    blocks less the table, never binds below the free blocks); otherwise the
    workload does not suit the reference (ValueError)."""
    config = workload.config
    usable = config.num_blocks - 1
    max_model_len = config.max_model_len
    if -(-max_model_len // config.block_size) > usable:
        max_model_len = usable * config.block_size
        longest = max(len(spec.prompt_token_ids) + spec.max_tokens for spec in workload.requests)
        if longest > max_model_len:
            raise ValueError(f"{workload.name}: a request of {longest} tokens does not fit the "
                             f"{usable}-block pool the reference needs for it")
    return SchedulerConfig(
        max_num_batched_tokens=config.max_num_batched_tokens, max_num_seqs=config.max_num_seqs,
        max_model_len=max_model_len, block_size=config.block_size,
        num_blocks=usable, num_pipeline_stages=config.num_stages,
        long_prefill_token_threshold=config.long_prefill_token_threshold,
        enable_prefix_caching=config.prefix_caching, num_spec_tokens=config.num_spec_tokens,
        num_lookahead_tokens=config.num_lookahead_tokens, draft_input_slots=draft_input_slots(config),
        enable_chunked_prefill=config.enable_chunked_prefill,
        cache_aware_admission_window=config.cache_aware_admission_window,
        cache_aware_admission_threshold=config.cache_aware_admission_threshold,
        prefill_schedule_interval=config.prefill_schedule_interval,
        max_loras=config.max_loras, prompt_logprobs=any(asks_prompt_logprobs(spec) for spec in workload.requests),
        profile=profile, as_released=as_released, kv_connector=kv_connector, kv_error_order=kv_error_order,
        scheduling_policy=config.policy)


def engine_loop_of(profile: str) -> str:
    """The engine loop (versions.py `Release.engine_loop`) that runs a
    profile's reference: its release's, else read from the profile's own
    `engine_loop` ("vllm-0.33[-async]" is 0.33's loop, others 0.8's)."""
    row = release_of_profile(profile)
    if row is not None:
        return row.engine_loop
    return "0.33" if get_profile(profile).engine_loop.startswith("vllm-0.33") else "0.8"


# The reference runs a workload's KV connector (reference/connector.py):
# the campaign runs the differential on connector workloads (campaign.py
# `differential_runs`).
SUPPORTS_KV_CONNECTOR = True


@dataclass
class ReferenceRun:
    events: list[dict[str, Any]]
    ending: str
    exception: str | None = None
    duplicate_cached_block: bool = False        # two blocks cached one hash at some point


def run_reference(raw_workload: dict[str, Any], profile: str, mutant: str | None = None,
                  vllm_outputs: bool = False, kv_error_order: tuple[str, ...] = ()) -> ReferenceRun:
    """One workload through the reference under `profile`, driven by the
    replay's own engine loop and fabricated model; with `mutant`, one of the
    reference's mutants (verification/mutants/reference.py) is in force for
    the run and the trace's config names it; `kv_error_order`: the order the
    fail policy finishes a load's requests in (SchedulerConfig)."""
    raw, connector, offers = split_kv_connector(raw_workload)
    with reference_applied(mutant):
        return _run_reference(workload_from_json(raw), profile, mutant, vllm_outputs,
                              _KvSetup(connector, offers, kv_error_order))


@dataclass(frozen=True)
class _KvSetup:
    """The run's KV connector and the offers by request key (none: no connector)."""
    connector: KvConnectorConfig | None = None
    offers: dict[str, KvOffer] | None = None
    error_order: tuple[str, ...] = ()


def _run_reference(workload: Workload, profile: str, mutant: str | None,
                   vllm_outputs: bool, kv: _KvSetup = _KvSetup()) -> ReferenceRun:
    sink = io.StringIO()
    extra: dict[str, Any] = {"mutant": mutant} if mutant is not None else {}
    if any(spec.session for spec in workload.requests):
        extra["streaming_sessions"] = True        # its sessions' `input` events (docs/trace-format.md)
    trace = TraceWriter(sink, eos_token_id=workload.eos_token_id, extra=extra or None)
    # The version's engine: 0.33's loop queues empty batches (engine.py), K
    # batches deep, or K + 1 under async scheduling (`batch_queue_depth`);
    # 0.34's handles inputs while it waits for a batch's output.
    loop = engine_loop_of(profile)
    v033 = loop in BATCH_QUEUE_V033_LOOPS
    # `vllm_outputs`: the deviations switched to vLLM's behaviour, the
    # constants of the version's released profile (reference/profiles.py `RELEASED`).
    config = reference_config(workload, profile, as_released=vllm_outputs, kv_connector=kv.connector,
                              kv_error_order=kv.error_order)
    scheduler = TracingScheduler(config, trace)
    side = _ReferenceSide(scheduler, batch_level_cached_data=v033,
                          v2_runner=config.async_scheduling or loop == "0.34")
    engine: BatchQueueEngine
    if v033:
        model = FabricatedModel(workload, _model_output, caches_sampled_tokens=True)
        engine_class = BatchQueueEngineV034 if loop == "0.34" else BatchQueueEngineV033
        engine = engine_class(side, model, config.batch_queue_depth,
                              lambda req_ids: scheduler.finish_requests(req_ids, RequestStatus.FINISHED_ABORTED),
                              _draft_hand_off(config))
    else:
        engine = BatchQueueEngine(side, FabricatedModel(workload, _model_output),
                                  workload.config.num_stages,
                                  schedules_only_unscheduled=not scheduler.config.continue_prefill)

    clock = ArrivalClock(workload.config.policy)
    grammars = reference_grammars(side, scheduler)      # the workload's compile clock (grammar_workload.py)
    engine.grammars_compiling = grammars.pending
    grammar_for = reference_fsms(workload, scheduler)   # and the replay's FSMs (grammar_replay.py)

    def add(spec: Any) -> None:
        params = SamplingParams(max_tokens=spec.max_tokens, ignore_eos=spec.ignore_eos)
        request = Request(spec.req_id, list(spec.prompt_token_ids), params, eos_token_id=workload.eos_token_id)
        request.resumable = spec.resumable            # a streaming session (session_workload.py)
        if kv.offers:
            request.kv_offer = kv.offers.get(spec.key)
        clock.stamp(request, spec.priority)
        request.lora_int_id, request.prompt_logprobs = spec.lora, spec.prompt_logprobs     # lora_workload.py
        # a session's next input keeps the session's own grammar (`_update_request_as_session`)
        if spec.grammar is None or scheduler.session_under(spec.req_id) is not None:
            scheduler.add_request(request)
            return
        grammars.arrive(spec.req_id, spec.grammar)
        grammar_for(spec)
        scheduler.add_structured_request(request)

    def abort(req_id: str) -> None:
        scheduler.finish_requests(req_id, RequestStatus.FINISHED_ABORTED)

    outcome: RunOutcome = run_busy_loop(engine, workload, add, abort,
                                        (lambda event: call_event(scheduler, event)) if workload.events else None)
    events = [json.loads(line) for line in sink.getvalue().splitlines() if line.strip()]
    return ReferenceRun(events, outcome.ending, outcome.exception, side.saw_duplicate_cached_block)


def reference_grammars(side: _ReferenceSide, scheduler: TracingScheduler) -> CompileClock:
    """The reference's grammar backend: the same compile clock as the
    replay's (grammar_replay.py), settling grammars at the start of each
    `schedule()` call."""
    clock = CompileClock()
    schedule = side.schedule

    def schedule_after_compiles() -> Any:
        for req_id, fails in clock.tick():
            request = scheduler.requests.get(req_id)
            if request is not None and request.grammar == "compiling":
                request.grammar = "failed" if fails else "ready"
        return schedule()

    side.schedule = schedule_after_compiles         # type: ignore[method-assign]
    return clock


def reference_fsms(workload: Workload, scheduler: TracingScheduler) -> Callable[[RequestSpec], None]:
    """The reference's FSMs: the replay's (grammar_replay.py
    `FabricatedGrammar`: a grammar accepts the tokens the fabricated model may
    sample for its request's workload entry), one per structured request
    added under an id (the returned call, at `add_request`), asked by the
    reference's `grammar_accepts` (reference/grammar.py). They refuse only
    another entry's tokens, which reach a request only as vLLM released
    binds outputs (by a reused id: `reused_id_output_dropped`)."""
    fsms: dict[str, FabricatedGrammar] = {}

    def accepts(request: Request, token_ids: Sequence[int]) -> bool:
        return fsms[request.request_id].accept_tokens(request.request_id, list(token_ids))

    def grammar_for(spec: RequestSpec) -> None:
        fsms[spec.req_id] = FabricatedGrammar(workload, spec)

    scheduler.grammar_accepts = accepts
    return grammar_for


def _draft_hand_off(config: SchedulerConfig) -> Any:
    """What the 0.33 engine's `post_step` hands the scheduler (a
    `DraftTokenIds` look-alike), when the profile takes drafts at submission
    (vLLM 0.33 sync as released: the conforming run) and the workload has
    drafts; None otherwise (engine.py)."""
    if not config.num_spec_tokens or not config.version_profile.drafts_handed_over_at_submission:
        return None
    return lambda req_ids, drafts: SimpleNamespace(req_ids=req_ids, draft_token_ids=drafts)


# vLLM version -> the reference profile that models it (the release table, versions.py).
VERSION_PROFILES: dict[str, str] = {r.version: r.profile for r in RELEASES.values()}
# ... and with async scheduling (vLLM's AsyncScheduler with the V2 runner).
ASYNC_VERSION_PROFILES: dict[str, str] = {r.version: r.async_profile for r in RELEASES.values()
                                          if r.async_profile is not None}


def profile_for(vllm_version: str, async_scheduling: bool = False) -> str:
    """The reference profile of a release (UnknownRelease, a ValueError, for
    one the table does not list; ValueError for a profile the reference lacks)."""
    row = release(vllm_version)
    name = row.async_profile if async_scheduling else row.profile
    if name is None:
        raise ValueError(f"vLLM {vllm_version} has no async scheduling the reference models")
    if name not in PROFILES:
        raise ValueError(f"no reference profile {name} for vLLM {vllm_version}")
    return name
