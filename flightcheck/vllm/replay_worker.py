"""The replay worker: runs inside a vLLM venv, imports vLLM once, and replays
every workload it is sent through vLLM's real V1 scheduler.

    python -m flightcheck.vllm.replay_worker < jobs.jsonl > results.jsonl

One job per input line: `{"workload": {...}, "trace": PATH or null,
"recorder": true}`; one result per output line (see `replay_one`). The main
CLI (`flightcheck vllm replay`) starts it with the venv's interpreter; it
imports neither z3, hypothesis nor flightcheck's own torch runtime (vLLM
imports torch itself).

The scheduler is built as vLLM's own tests build one (0.8.5
`tests/v1/core/test_scheduler.py`, `create_scheduler`): real
`ModelConfig` (from a config-only Llama directory, no tokenizer, no hub),
`SchedulerConfig` (chunked prefill), `CacheConfig`, `ParallelConfig`, and a
`KVCacheConfig` with exactly the workload's number of blocks. The scheduler
class is resolved from its qualified name with vLLM's own
`resolve_obj_by_qualname`, as `EngineCore.__init__` resolves
`scheduler_cls`: the recorder (`flightcheck.vllm.recorder.RecordingScheduler`,
the class a deployment names in `--scheduler-cls`), or vLLM's plain
`Scheduler` for a run without it (`"recorder": false`), to show that
recording changes nothing.

vLLM 0.33.0 (read in `tests/v1/core/utils.py`-style construction and in the
0.33 sources: `EngineCore.__init__`, `Request.from_engine_core_request`):
`DeviceConfig(device="cpu")` (its "auto" cannot infer a device here), sync
scheduling stated (`SchedulerConfig.async_scheduling=False`: with pipeline
parallelism the V1 model runner refuses async scheduling, so sync PP is what
0.33 runs there) and the V1 model runner (`VLLM_USE_V2_MODEL_RUNNER=0`,
which is what runs sync PP; with it resumed requests travel in
`CachedRequestData`); `Scheduler(block_size=...)`; `Request` without an EOS
argument (it lives in `SamplingParams`, set as the engine's input processor
does with `update_from_generation_config`) and, with prefix caching, with
the block hasher the engine core builds (`get_request_block_hasher` over
`prefix_caching_hash_algo`, after `init_none_hash`); `ModelRunnerOutput`
without `spec_token_ids`. The engine is `BatchQueueEngineV033`.

vLLM 0.33.0 with async scheduling (a workload's `config.async_scheduling`):
`SchedulerConfig(async_scheduling=True)` and the V2 model runner
(`VLLM_USE_V2_MODEL_RUNNER=1`, read per build: `VllmConfig.
use_v2_model_runner` reads the variable on every call, and vLLM's env cache
is never enabled here). Those two make `VllmConfig.max_concurrent_batches`
K + 1 (`config/vllm.py`) and make `AsyncScheduler._update_after_schedule`
set `next_decode_eligible_step` (it does only `if self.use_v2_model_runner`);
`VllmConfig.__post_init__` accepts async + PP with the V2 runner on the
"mp" executor it picks for PP (`supports_async_scheduling`); no CUDA is
touched. The class is the job's `scheduler_cls` (default: the synchronous
recorder, which then refuses to start; `ASYNC_RECORDER` records
`AsyncScheduler`), the engine's depth is vLLM's own
`max_concurrent_batches`, and the fabricated model samples each entry that
is not a prefill chunk at the position after its last token, placeholders
included, as the V2 runner, which keeps the tokens it samples, does.

vLLM 0.34.0 (its source: `Scheduler.schedule`, `update_from_output`,
`EngineCoreProc._wait_for_output`): the same construction (there is only the
V2 runner; `VLLM_USE_V2_MODEL_RUNNER` is not read), `ModelRunnerOutput`
without `req_id_to_index`, resumed requests as new-request data, and the
engine `BatchQueueEngineV034`, which hands over the inputs a workload places
during a step's wait for output. Which engine a vLLM runs is its release's
(versions.py; a build the table does not list runs its nearest release's),
and what differs between releases' objects is read through compat.py, whose
check runs before anything else of vLLM is imported: an incompatible vLLM
gets one `{"error": ...}` line and exit 2.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import tempfile
from typing import Any

from . import compat  # noqa: E402  (standard library; imports vLLM only when called)

# vLLM reads these at import: V1, no logging setup of its own, no hub access
# (compat.VLLM_ENVIRONMENT).
compat.set_environment()
# vLLM 0.33: the V1 model runner, the one that runs synchronous pipeline parallelism.
os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")

if __name__ == "__main__":
    # Before anything else of vLLM is imported: a vLLM that lacks what the
    # bridge reads is refused in one line (compat.py), not with a traceback.
    compat.exit_if_incompatible()

import vllm  # noqa: E402
from vllm.config import CacheConfig, LoRAConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig  # noqa: E402

try:
    from vllm.config import DeviceConfig  # noqa: E402
except ImportError:  # pragma: no cover - every version read has it
    DeviceConfig = None  # type: ignore[assignment,misc]
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from . import RECORDER, grammar_replay, kv_replay, lora_replay, priority_workload  # noqa: E402
from .reset_pause_workload import call_event  # noqa: E402
from .compat import resolve_obj_by_qualname  # noqa: E402
from .run_endings import left_to_clients, stays_idle  # noqa: E402
from .engine import (BatchQueueEngine, BatchQueueEngineV033, BatchQueueEngineV034,  # noqa: E402
                     FabricatedModel, run_busy_loop)
from .grammar_recording import STRUCTURED_ENV  # noqa: E402
from .lora_recording import PROMPT_LOGPROBS_ENV  # noqa: E402
from .lora_workload import asks_prompt_logprobs  # noqa: E402
from .recording import SESSIONS_ENV, STAGES_ENV, RecordingMixin  # noqa: E402
from .trace import TRACE_ENV  # noqa: E402
from .versions import BATCH_QUEUE_V033_LOOPS, UnknownRelease, nearest_release  # noqa: E402
from .workload import VOCAB_SIZE, ReplayConfig, RequestSpec, Workload, workload_from_json  # noqa: E402

# The release whose engine loop this vLLM runs (versions.py; a developer's
# branch runs its nearest release's), None if it predates them all.
try:
    RELEASE = nearest_release(vllm.__version__)
except UnknownRelease:
    RELEASE = None

PLAIN_SCHEDULER = "vllm.v1.core.sched.scheduler.Scheduler"
PLAIN_ASYNC_SCHEDULER = "vllm.v1.core.sched.async_scheduler.AsyncScheduler"
# 0.33's DeviceConfig(device="auto") raises "Failed to infer device type" on a
# machine without an accelerator; 0.8.x infers the CPU itself.
NEEDS_CPU_DEVICE = not vllm.__version__.startswith("0.8.")

# A tiny Llama: the scheduler reads only the architecture, lengths and EOS.
LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
                "num_hidden_layers": 4, "vocab_size": VOCAB_SIZE, "max_position_embeddings": 1 << 17,
                "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}


def _accepts(cls: Any, name: str) -> bool:
    """Whether a vLLM config class or constructor takes `name` (dataclass
    fields where it is one, else its signature): versions differ."""
    fields = getattr(cls, "__dataclass_fields__", None)
    if fields is not None:
        return name in fields
    return name in inspect.signature(cls.__init__).parameters


def _admission_order_arguments(config: ReplayConfig) -> dict[str, Any]:
    """vLLM 0.34's cache-aware admission knobs, passed to a vLLM that has
    them; one without admits FCFS, and its trace says so (no window), so the
    same workload tells the versions apart."""
    arguments: dict[str, Any] = {}
    if _accepts(SchedulerConfig, "prefill_schedule_interval") and config.prefill_schedule_interval > 1:
        arguments["prefill_schedule_interval"] = config.prefill_schedule_interval     # 0.33, 0.34
    if not _accepts(SchedulerConfig, "cache_aware_admission_window"):            # 0.34
        return arguments
    return {**arguments, "cache_aware_admission_window": config.cache_aware_admission_window,
            "cache_aware_admission_threshold": config.cache_aware_admission_threshold}


def _model_runner_output(req_ids: list[str], sampled_token_ids: list[list[int]],
                         spec_token_ids: list[list[int]] | None = None, **_: Any) -> ModelRunnerOutput:
    """A ModelRunnerOutput with the fields this version has (compat.py:
    0.33 has no `spec_token_ids`, 0.34 no `req_id_to_index`)."""
    return compat.model_runner_output(req_ids, sampled_token_ids, spec_token_ids)


class SchedulerFactory:
    """Builds schedulers; ModelConfig is costly (a registry probe), so one is
    kept per max_model_len."""

    def __init__(self) -> None:
        self._directory = tempfile.mkdtemp(prefix="flightcheck-llama-")
        with open(os.path.join(self._directory, "config.json"), "w") as f:
            json.dump(LLAMA_CONFIG, f)
        self._model_configs: dict[int, ModelConfig] = {}

    def model_config(self, max_model_len: int) -> ModelConfig:
        if max_model_len not in self._model_configs:
            arguments: dict[str, Any] = dict(
                model=self._directory, tokenizer=self._directory, tokenizer_mode="auto",
                trust_remote_code=False, dtype="float32", seed=0, max_model_len=max_model_len,
                skip_tokenizer_init=True)
            if _accepts(ModelConfig, "task"):                                       # 0.8.x
                arguments["task"] = "generate"
            if _accepts(ModelConfig, "use_async_output_proc"):                      # 0.8.x
                # V0's output processor, which no V1 scheduler uses: on, 0.8.x's
                # `ModelConfig.verify_async_output_proc` asks the platform (none
                # here: it raises NotImplementedError) when there is one stage
                arguments["use_async_output_proc"] = False
            self._model_configs[max_model_len] = ModelConfig(**arguments)
        return self._model_configs[max_model_len]

    def build(self, scheduler_class: type, config: ReplayConfig) -> Any:
        model_config = self.model_config(config.max_model_len)
        scheduler_arguments: dict[str, Any] = dict(
            max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=config.max_model_len, enable_chunked_prefill=config.enable_chunked_prefill,
            long_prefill_token_threshold=config.long_prefill_token_threshold)
        scheduler_arguments.update(_admission_order_arguments(config))
        if _accepts(SchedulerConfig, "async_scheduling"):                           # 0.33
            scheduler_arguments["async_scheduling"] = config.async_scheduling
            # Async with pipeline parallelism runs on the V2 model runner (the
            # V1 runner refuses it); sync PP on the V1 runner.
            os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if config.async_scheduling else "0"
        elif config.async_scheduling:
            raise ValueError(f"vLLM {vllm.__version__} has no async scheduling")
        if _accepts(SchedulerConfig, "is_encoder_decoder"):                         # 0.33: required
            scheduler_arguments["is_encoder_decoder"] = model_config.is_encoder_decoder
        scheduler_arguments.update(kv_replay.scheduler_arguments(config))
        scheduler_arguments.update(priority_workload.scheduler_arguments(config.policy))
        scheduler_config = SchedulerConfig(**scheduler_arguments)
        cache_arguments: dict[str, Any] = dict(
            block_size=config.block_size, gpu_memory_utilization=0.9, cache_dtype="auto",
            enable_prefix_caching=config.prefix_caching)
        if _accepts(CacheConfig, "swap_space"):                                     # 0.8.x
            cache_arguments["swap_space"] = 0
        cache_config = CacheConfig(**cache_arguments)
        cache_config.num_gpu_blocks = config.num_blocks
        parallel_config = ParallelConfig(pipeline_parallel_size=config.num_stages)
        vllm_arguments: dict[str, Any] = dict(model_config=model_config, scheduler_config=scheduler_config,
                                              cache_config=cache_config, parallel_config=parallel_config)
        if NEEDS_CPU_DEVICE:
            vllm_arguments["device_config"] = DeviceConfig(device="cpu")
        speculative_config = self.speculative_config(config, model_config, parallel_config, self._directory)
        if speculative_config is not None and _accepts(VllmConfig, "speculative_config"):
            vllm_arguments["speculative_config"] = speculative_config
        vllm_config = VllmConfig(**vllm_arguments, **kv_replay.vllm_arguments(config),
                                 **lora_replay.vllm_arguments(config, LoRAConfig))
        # The KV cache's dtype is the model's, as vLLM's "auto" cache dtype.
        if _accepts(KVCacheConfig, "kv_cache_tensors"):                             # 0.33
            spec = FullAttentionSpec(block_size=config.block_size, num_kv_heads=1, head_size=1,
                                     dtype=model_config.dtype)
            kv_cache_config = KVCacheConfig(num_blocks=config.num_blocks, kv_cache_tensors=[],
                                            kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
        else:
            kv_cache_config = KVCacheConfig(
                num_blocks=config.num_blocks, tensors={},
                kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(
                    config.block_size, 1, 1, model_config.dtype, False))])
        arguments: dict[str, Any] = {
            "kv_cache_config": kv_cache_config,
            "structured_output_manager": StructuredOutputManager(vllm_config), "log_stats": False}
        if "block_size" in inspect.signature(Scheduler.__init__).parameters:        # 0.33
            arguments["block_size"] = config.block_size
        if "vllm_config" in inspect.signature(Scheduler.__init__).parameters:       # 0.8.5, 0.33
            arguments["vllm_config"] = vllm_config
        else:                                                                        # 0.8.4
            arguments.update(scheduler_config=scheduler_config, model_config=model_config,
                             cache_config=cache_config, lora_config=None, speculative_config=speculative_config)
        return scheduler_class(**arguments)

    @staticmethod
    def speculative_config(config: ReplayConfig, model_config: ModelConfig, parallel_config: ParallelConfig,
                           model_directory: str) -> Any:
        """k drafts per step, the minimal way the scheduler takes them: an
        n-gram `SpeculativeConfig` (no draft model to load; not EAGLE, so no
        look-ahead slots: `Scheduler.__init__` reads `num_speculative_tokens`
        and `use_eagle()`, 0.8.5 and 0.8.4). None without drafts.

        With `num_lookahead_tokens` (k), a draft-model config instead, its
        draft the same config-only Llama (nothing is loaded: only the
        scheduler is built): vLLM derives k lookahead slots from it
        (0.34 `VllmConfig.num_lookahead_tokens` ->
        `StandaloneARSpeculatorConfig.num_lookahead_tokens`; 0.33: `uses_draft_model()`),
        and, unlike EAGLE, no prefill lookahead, hash lookahead or trailing
        block drop (`num_prefill_lookahead_tokens`, `use_eagle_block_drop`
        stay 0 / False), so the lookahead slots are the only change."""
        if not config.num_spec_tokens:
            return None
        from vllm.config import SpeculativeConfig

        if config.num_lookahead_tokens:
            if not hasattr(VllmConfig, "num_lookahead_tokens"):                      # 0.8.x
                raise ValueError(f"vLLM {vllm.__version__}: no lookahead slots from a draft model here")
            return SpeculativeConfig(method="draft_model", model=model_directory,
                                     num_speculative_tokens=config.num_spec_tokens,
                                     target_model_config=model_config, target_parallel_config=parallel_config)
        return SpeculativeConfig(method="ngram", num_speculative_tokens=config.num_spec_tokens,
                                 prompt_lookup_max=config.num_spec_tokens,
                                 target_model_config=model_config, target_parallel_config=parallel_config)


def make_request(spec: RequestSpec, workload: Workload) -> Request:
    """A vLLM Request as `EngineCore.add_request` makes one."""
    params = SamplingParams(max_tokens=spec.max_tokens, ignore_eos=spec.ignore_eos,
                            **lora_replay.sampling_arguments(spec))
    if spec.grammar is not None:          # structured output (any constraint: the backend is ours, grammar_replay.py)
        from vllm.sampling_params import StructuredOutputsParams
        params.structured_outputs = StructuredOutputsParams(regex="fabricated")
    if "eos_token_id" not in inspect.signature(Request.__init__).parameters:       # 0.33
        # The input processor sets EOS in the sampling params
        # (SamplingParams.update_from_generation_config); the engine core adds
        # the block hasher it built (Request.from_engine_core_request).
        params.update_from_generation_config({}, workload.eos_token_id)
        return Request(request_id=spec.req_id, prompt_token_ids=list(spec.prompt_token_ids),
                       sampling_params=params, pooling_params=None, arrival_time=0.0,
                       lora_request=lora_replay.lora_request(spec, LoRARequest),
                       block_hasher=_block_hasher(workload.config.block_size) if workload.config.prefix_caching
                       else None)
    arguments: dict[str, Any] = dict(
        request_id=spec.req_id, prompt_token_ids=list(spec.prompt_token_ids), multi_modal_inputs=None,
        multi_modal_hashes=None, multi_modal_placeholders=None, sampling_params=params,
        eos_token_id=workload.eos_token_id, arrival_time=0.0, lora_request=None)
    if "prompt" in inspect.signature(Request.__init__).parameters:                  # 0.8.4
        arguments["prompt"] = None
    return Request(**arguments)


_BLOCK_HASHERS: dict[int, Any] = {}


def _block_hasher(block_size: int) -> Any:
    """vLLM 0.33's request block hasher, built as `EngineCore.__init__` builds
    it (the hash function named by `CacheConfig.prefix_caching_hash_algo`)."""
    if block_size not in _BLOCK_HASHERS:
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        hash_function = get_hash_fn_by_name(CacheConfig.__dataclass_fields__["prefix_caching_hash_algo"].default)
        init_none_hash(hash_function)
        _BLOCK_HASHERS[block_size] = get_request_block_hasher(block_size, hash_function)
    return _BLOCK_HASHERS[block_size]


def _make_engine(scheduler: Any, model: FabricatedModel, workload: Workload) -> BatchQueueEngine:
    """Our copy of this version's engine loop around the scheduler."""
    assert RELEASE is not None
    if RELEASE.engine_loop not in BATCH_QUEUE_V033_LOOPS:
        return BatchQueueEngine(scheduler, model, workload.config.num_stages,
                                schedules_only_unscheduled=RELEASE.gates_on_unscheduled)

    def abort_all(req_ids: list[str]) -> None:          # EngineCore.abort_requests
        scheduler.finish_requests(req_ids, RequestStatus.FINISHED_ABORTED)

    # vLLM's own depth: K, or K + 1 with async scheduling and the V2 runner.
    depth = compat.max_concurrent_batches(scheduler.vllm_config)
    drafts = None
    if workload.config.num_spec_tokens:            # EngineCore.check_for_draft_tokens
        from vllm.v1.outputs import DraftTokenIds

        def drafts(req_ids: list[str], draft_token_ids: list[list[int]]) -> Any:
            return DraftTokenIds(req_ids, draft_token_ids)
    engine = BatchQueueEngineV034 if RELEASE.engine_loop == "0.34" else BatchQueueEngineV033
    # post_step hands drafts over only under sync scheduling; a deferred
    # structured-output batch takes them under either (engine.deferred_drafts).
    return engine(scheduler, model, depth, abort_all, None if workload.config.async_scheduling else drafts,
                  deferred_draft_token_ids=drafts)


def _event_caller(scheduler: Any) -> Any:
    """Reset and pause events (reset_pause_workload.py), on vLLM 0.33 and 0.34."""
    from vllm.v1.core.sched.interface import PauseState
    return lambda event: call_event(scheduler, event, PauseState)


def _set_recorder_environment(workload: Workload, trace_path: str | None) -> None:
    """The recorder reads its settings the way a deployment sets them: its
    trace file, the pipeline's stages, whether grammars are fabricated,
    whether the engine serves streaming sessions."""
    os.environ.pop(TRACE_ENV, None)
    if trace_path:
        os.environ[TRACE_ENV] = trace_path
    os.environ[STAGES_ENV] = str(workload.config.num_stages)
    os.environ[STRUCTURED_ENV] = "1" if any(s.grammar is not None for s in workload.requests) else "0"
    os.environ[SESSIONS_ENV] = "1" if any(s.session for s in workload.requests) else "0"
    os.environ[PROMPT_LOGPROBS_ENV] = "1" if any(asks_prompt_logprobs(s) for s in workload.requests) else "0"


def _scheduler_class(job: dict[str, Any], workload: Workload, recording: bool) -> type:
    """The job's scheduler class (a recorder unless the job records nothing)."""
    qualified_name = job.get("scheduler_cls") or (
        RECORDER if recording else PLAIN_ASYNC_SCHEDULER if workload.config.async_scheduling else PLAIN_SCHEDULER)
    scheduler_class = resolve_obj_by_qualname(qualified_name)
    if recording and not issubclass(scheduler_class, RecordingMixin):
        raise TypeError(f"{qualified_name} resolves to {scheduler_class}, not a recorder")
    return scheduler_class


def replay_one(factory: SchedulerFactory, job: dict[str, Any]) -> dict[str, Any]:
    workload = workload_from_json(job["workload"])
    assert RELEASE is not None
    if RELEASE.engine_loop not in BATCH_QUEUE_V033_LOOPS and any(s.abort_via_aborts_queue for s in workload.requests):
        raise ValueError(f"abort_via 'aborts_queue': vLLM {vllm.__version__}'s engine has no aborts queue")
    recording = job.get("recorder", True)
    trace_path = job.get("trace") if recording else None
    _set_recorder_environment(workload, trace_path)
    transfers = kv_replay.start(workload)                  # the KV connector's ledger (None: none)
    scheduler = factory.build(_scheduler_class(job, workload, recording), workload.config)
    grammars = grammar_replay.start(workload, scheduler)       # the fabricated grammar backend (None: none)
    if recording and scheduler._fc_trace is not None:
        scheduler._fc_trace.record_time = False          # replays are deterministic, times are not
    model = FabricatedModel(workload, _model_runner_output,
                            caches_sampled_tokens=RELEASE.engine_loop in BATCH_QUEUE_V033_LOOPS)

    def abort(req_id: str) -> None:
        scheduler.finish_requests([req_id], RequestStatus.FINISHED_ABORTED)

    engine = _make_engine(scheduler, model, workload)
    kv_worker = kv_replay.attach_worker(engine, transfers)
    if grammars is not None:
        engine.grammars_compiling = grammars.clock.pending

    clock = priority_workload.ArrivalClock(workload.config.policy)

    def add(spec: RequestSpec) -> None:
        request = make_request(spec, workload)
        if spec.resumable:
            request.resumable = True                 # a streaming session (session_workload.py)
        update = spec.req_id in scheduler.requests    # a streaming session's next input, under its live id
        kv_replay.before_add(transfers, spec, request, update)
        clock.stamp(request, spec.priority)
        scheduler.add_request(request)
        if not update:     # an update's grammar, compiled too, is never read (`_update_request_as_session`)
            grammar_replay.after_add(grammars, spec, request)       # EngineCore.add_request -> grammar_init

    outcome = run_busy_loop(engine, workload, add, abort, _event_caller(scheduler) if workload.events else None,
                            job.get("inputs_before"))
    if recording:
        # A run cut short by an exception has no end: the trace stops where vLLM did
        # (with `raised` where vLLM raised in a scheduler call: raised_recording.py).
        scheduler.flightcheck_end(complete=outcome.ending != "exception" and outcome.ending != "step_limit")
    observations = scheduler.flightcheck_observations.to_json() if recording else None
    confirmed = [{key: value for key, value in idle.items() if key != "batches"}
                 for idle in outcome.short_idles if _stays_idle(factory, job, idle, engine.batches)]
    stalls = sorted(outcome.stalls + confirmed, key=lambda stall: stall["step"])
    return {
        "name": workload.name, "vllm_version": vllm.__version__, "recorder": recording,
        "scheduler_cls": f"{type(scheduler).__module__}.{type(scheduler).__qualname__}",
        "scheduler_is_vllm_scheduler": isinstance(scheduler, Scheduler),
        "async_scheduling": bool(getattr(scheduler.scheduler_config, "async_scheduling", False)),
        "batch_queue_depth": getattr(engine, "depth", workload.config.num_stages),
        "ending": outcome.ending, "steps": outcome.steps, "batches_in_flight": outcome.batches_in_flight,
        "exception": outcome.exception, "unfinished": outcome.unfinished, "stalls": stalls,
        "ground_truth": observations, "batches": engine.batches,
        "outputs": [list(x) for x in engine.outputs], "trace": trace_path, **_engine_report(engine, model),
        **({"kv_reports": kv_worker.reports} if kv_worker is not None else {}),
        **({"grammars": grammars.report()} if grammars is not None else {}),
    }


def _stays_idle(factory: SchedulerFactory, job: dict[str, Any], idle: dict[str, Any],
                batches: list[dict[str, int]]) -> bool:
    """Whether vLLM, given no input from the end of a short idle on
    (run_endings.py `short_idle`), would have stayed idle: the workload
    replayed again, unrecorded, with the inputs from that step on cut."""
    if job.get("inputs_before") is not None:     # a run asking this already: its own short idles are not judged
        return False
    return stays_idle(idle, replay_one(factory, {**job, "trace": None, "inputs_before": idle["until"]}), batches)


def _engine_report(engine: BatchQueueEngine, model: FabricatedModel) -> dict[str, Any]:
    """What the engine copy itself saw (engine_truth.py and the 0.33/0.34 loops' own counts)."""
    return {
        **({"engine_steps": engine.steps} if isinstance(engine, BatchQueueEngineV033) else {}),
        **({"inputs_during_wait": engine.inputs_during_wait} if isinstance(engine, BatchQueueEngineV034) else {}),
        # update_draft_token_ids_in_output calls (with drafts, on 0.33 and 0.34)
        **({"deferred_drafts": engine.deferred_drafts_handed} if model.draft_handler is not None else {}),
        "waits_in_flight": engine.waits_in_flight, "gated_completions": engine.gated_completions,
        "copy_errors": engine.copy_errors[:1],
        # the parked sessions whose clients an idle end waits on (no stall where it is `stuck`)
        "left_to_clients": left_to_clients(engine.scheduler),
    }


def main() -> int:
    # vLLM and triton may print to stdout; results go to the original stdout only.
    results = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    if RELEASE is None:
        results.write(json.dumps({"error": f"no engine loop for vLLM {vllm.__version__}"}) + "\n")
        return 2
    factory = SchedulerFactory()
    results.write(json.dumps({"ready": vllm.__version__}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            result = replay_one(factory, json.loads(line))
        except Exception as err:  # a bad job must not take the other workloads down
            result = {"error": f"{type(err).__name__}: {err}"}
        results.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
