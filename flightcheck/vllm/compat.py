"""Every attribute of vLLM whose presence or meaning differs between the
releases the bridge reads, named once, with the releases that have it; the
recorder (recorder.py, recording.py, ground_truth.py), the replay worker
and its engine copy (replay_worker.py, engine.py) and the cost worker read
those attributes only through the functions below.

What it decides, and from what:
* which alternative a vLLM has is read from its classes (a dataclass
  field, a class attribute or property, a constructor parameter, a module),
  never from its version string, so a vLLM the table does not list (a
  developer's branch) is recorded when everything the bridge needs is
  there;
* where an alternative is an *absence* (0.34 dropped an attribute because
  the thing it chose between is gone), the absence counts only with a
  witness that the rule changed (`Request.prefill_token_ids` for resumed
  requests sent in full; no V1 model runner module for the decode
  stagger), never as a default;
* otherwise `IncompatibleVllm`: one line naming the missing attribute, the
  vLLM version, and the releases that have it. `check_vllm()` runs every
  class-level check at once (the replay worker runs it before anything else
  of vLLM is imported; the recorder at construction); the instance-level
  ones (set in a constructor) are checked when first read.

The catalogue (`NEEDED`) is what the docs and the tests read. Standard
library only: importing this module imports no vLLM; the functions that
look at vLLM's modules import them when called.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import sys
from dataclasses import dataclass
from typing import Any


class IncompatibleVllm(RuntimeError):
    """This vLLM lacks something the bridge reads (one line)."""


@dataclass(frozen=True)
class Needed:
    """One thing of vLLM's the bridge reads: `owner` (module:Class, or a
    module), `name` (the attribute; "" for a module), the releases that have
    it, and what it is read for."""
    owner: str
    name: str
    releases: str
    why: str

    @property
    def qualified(self) -> str:
        cls = self.owner.split(":")[-1]
        return f"{cls}.{self.name}" if self.name else self.owner


SCHED = "vllm.v1.core.sched.scheduler:Scheduler"
ASYNC = "vllm.v1.core.sched.async_scheduler:AsyncScheduler"
OUTPUT = "vllm.v1.core.sched.output:SchedulerOutput"
NEW = "vllm.v1.core.sched.output:NewRequestData"
CACHED = "vllm.v1.core.sched.output:CachedRequestData"
RUNNER = "vllm.v1.outputs:ModelRunnerOutput"
REQUEST = "vllm.v1.request:Request"

NEEDED: tuple[Needed, ...] = (
    # -- the scheduler's four calls (every release)
    *(Needed(SCHED, name, "0.8.4-0.34.0", "the call the recorder observes")
      for name in ("add_request", "schedule", "update_from_output", "finish_requests", "has_requests")),
    # -- what a batch says (SchedulerOutput and its request data)
    *(Needed(OUTPUT, name, "0.8.4-0.34.0", "a schedule event's entries")
      for name in ("scheduled_new_reqs", "scheduled_cached_reqs", "num_scheduled_tokens",
                   "total_num_scheduled_tokens", "scheduled_spec_decode_tokens", "finished_req_ids")),
    *(Needed(NEW, name, "0.8.4-0.34.0", "an admitted entry's start and blocks")
      for name in ("req_id", "prompt_token_ids", "block_ids", "num_computed_tokens")),
    Needed(CACHED, "req_ids", "0.9.2-0.34.0 (0.8.x: one CachedRequestData per request)",
           "a running entry of a batch-level CachedRequestData"),
    Needed(CACHED, "resumed_req_ids", "0.9.2-0.33.0",
           "whether a cached entry resumes a preempted request (0.34.0 sends those as new-request data)"),
    Needed(CACHED, "resumed_from_preemption", "0.8.4-0.9.1", "the same, per-request CachedRequestData"),
    Needed(NEW, "prefill_token_ids", "0.33.0 (V2 runner only), 0.34.0",
           "the tokens the model runner is told of (a resumed request's outputs included)"),
    Needed(REQUEST, "prefill_token_ids", "0.34.0",
           "the witness that resumed requests travel as new-request data (Scheduler.schedule)"),
    # -- what the model returns
    Needed(RUNNER, "sampled_token_ids", "0.8.4-0.34.0", "the tokens of a completion"),
    Needed(RUNNER, "req_id_to_index", "0.8.4-0.33.0",
           "where each request's tokens are (Scheduler.update_from_output indexes by it)"),
    Needed(RUNNER, "req_ids", "0.8.4-0.34.0",
           "where each request's tokens are in 0.34.0 (update_from_output indexes by their order)"),
    Needed(RUNNER, "spec_token_ids", "0.8.4-0.8.5", "the drafts a completion proposes"),
    # -- the request
    Needed(REQUEST, "eos_token_id", "0.8.4-0.8.5", "an arrival's EOS (0.33.0 on: its sampling params)"),
    Needed(REQUEST, "num_in_flight_tokens", "0.33.0-0.34.0", "the per-request in-flight counter (ground truth)"),
    # -- async scheduling
    Needed(ASYNC, "", "0.33.0-0.34.0", "the class RecordingAsyncScheduler records"),
    Needed(ASYNC, "decode_stagger", "0.33.0-0.34.0", "the async trace's decode_stagger"),
    Needed(SCHED, "use_v2_model_runner", "0.33.0",
           "whether AsyncScheduler sets next_decode_eligible_step (the stagger is in force)"),
    Needed("vllm.config:VllmConfig", "use_v2_model_runner", "0.33.0",
           "the same, on the class (the scheduler copies it in its constructor)"),
    Needed("vllm.v1.worker.gpu_model_runner", "", "0.8.4-0.33.0",
           "the V1 model runner; without it (0.34.0) the stagger is always in force"),
    Needed("vllm.config:VllmConfig", "max_concurrent_batches", "0.8.5-0.34.0",
           "the engine's batch queue depth (async trace key batch_queue_depth)"),
    # -- the configuration event
    Needed(SCHED, "scheduled_req_ids", "0.8.4",
           "the policy: with it one batch per request; without it (0.8.5 on) continue-prefill"),
    Needed("vllm.v1.core.kv_cache_manager:KVCacheManager", "num_preallocate_tokens", "0.8.4",
           "the blocks preallocated per request (0.8.5 on: none)"),
    Needed(SCHED, "num_spec_tokens", "0.8.5-0.34.0", "k (0.8.4: the speculative_config argument)"),
    Needed(SCHED, "vllm_config", "0.8.5-0.34.0",
           "the pipeline depth (0.8.4: FLIGHTCHECK_NUM_STAGES, its scheduler is not given it)"),
    Needed("vllm.config:SchedulerConfig", "async_scheduling", "0.33.0-0.34.0",
           "whether the engine schedules asynchronously (0.8.x: never)"),
    Needed(SCHED, "policy", "0.33.0-0.34.0",
           "the scheduling policy (FCFS or priority; 0.8.x's V1 scheduler: FCFS only)"),
    Needed(REQUEST, "priority", "0.33.0-0.34.0", "an arrival's priority under the priority policy"),
    Needed(SCHED, "_update_requests_with_invalid_blocks", "0.33.0-0.34.0",
           "the requests a KV load failure rolls back (kv_recording.py: a kv_failed event's holders)"),
    # -- helpers the replay and the cost worker call
    Needed("vllm.utils:resolve_obj_by_qualname", "", "0.8.4-0.8.5", "resolving --scheduler-cls"),
    Needed("vllm.utils.import_utils:resolve_obj_by_qualname", "", "0.33.0-0.34.0", "resolving --scheduler-cls"),
)
BY_NAME: dict[str, Needed] = {n.qualified: n for n in NEEDED}
# Needed by every release, without alternative.
ALWAYS: tuple[Needed, ...] = tuple(n for n in NEEDED if n.releases == "0.8.4-0.34.0"
                                   and n.qualified != "ModelRunnerOutput.req_ids")


def version() -> str:
    """The running vLLM's version (imported by name, like every vLLM module
    here: this module itself imports without vLLM)."""
    try:
        return str(getattr(importlib.import_module("vllm"), "__version__", "unknown"))
    except ImportError:
        return "(not importable)"


def missing(qualified: str) -> IncompatibleVllm:
    """The one-line refusal for a missing attribute named in NEEDED."""
    item = BY_NAME[qualified]
    return IncompatibleVllm(f"vLLM {version()} lacks {item.qualified} (flightcheck reads it for {item.why}; "
                            f"releases that have it: {item.releases})")


def _missing_any(*qualified: str) -> IncompatibleVllm:
    first = missing(qualified[0])
    if len(qualified) == 1:
        return first
    return IncompatibleVllm(f"vLLM {version()} lacks {' and '.join(qualified)} (flightcheck reads one of "
                            f"them for {BY_NAME[qualified[0]].why})")


def _class(owner: str) -> Any:
    module, _, name = owner.partition(":")
    try:
        loaded = importlib.import_module(module)
    except ImportError:
        raise IncompatibleVllm(f"vLLM {version()} has no module {module} (flightcheck reads {name or module} "
                               f"from it)") from None
    if not name:
        return loaded
    found = getattr(loaded, name, None)
    if found is None:
        raise IncompatibleVllm(f"vLLM {version()} has no {name} in {module}")
    return found


def has(cls: Any, name: str) -> bool:
    """Whether a vLLM class has `name`: a dataclass field, a class attribute
    or property, or a constructor parameter."""
    fields = getattr(cls, "__dataclass_fields__", None)
    if fields is not None and name in fields:
        return True
    if hasattr(cls, name):
        return True
    try:
        return name in inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return False


def _has(owner: str, name: str) -> bool:
    return has(_class(owner), name)


def scheduler_config_has(name: str) -> bool:
    """Whether this vLLM's `SchedulerConfig` has `name` (0.34's
    `max_num_inflight_kv_loads`, kv_replay.py)."""
    return _has("vllm.config:SchedulerConfig", name)


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


# ---------------------------------------------------------------------------
# The readers: one per attribute that differs
# ---------------------------------------------------------------------------

def output_index(model_runner_output: Any) -> dict[str, int]:
    """Where each request's tokens are in a ModelRunnerOutput, as the
    scheduler reads them: `req_id_to_index` (0.8.4-0.33.0), else the order
    of `req_ids` (0.34.0's `Scheduler.update_from_output`)."""
    index = getattr(model_runner_output, "req_id_to_index", None)
    if index is not None:
        return dict(index)
    req_ids = getattr(model_runner_output, "req_ids", None)
    if req_ids is None:
        raise _missing_any("ModelRunnerOutput.req_id_to_index", "ModelRunnerOutput.req_ids")
    return {req_id: i for i, req_id in enumerate(req_ids)}


def resumed_in_cached(cached: Any) -> frozenset[str]:
    """The ids of a batch-level CachedRequestData that resume a preempted
    request: `resumed_req_ids` (0.9.2-0.33.0); none in 0.34.0, where
    `Scheduler.schedule` sends a resumed request in full as new-request
    data (witness: `Request.prefill_token_ids`)."""
    resumed = getattr(cached, "resumed_req_ids", None)
    if resumed is not None:
        return frozenset(resumed)
    if not _has(REQUEST, "prefill_token_ids"):
        raise _missing_any("CachedRequestData.resumed_req_ids", "Request.prefill_token_ids")
    return frozenset()


def cached_rows(cached: Any) -> list[tuple[str, int, Any, bool]]:
    """(req_id, num_computed_tokens, new_block_ids, resumed) per cached
    entry: a list of per-request CachedRequestData (<= 0.9.1) or one
    batch-level one with parallel lists (0.9.2 on)."""
    if isinstance(cached, list):
        return [(d.req_id, d.num_computed_tokens, d.new_block_ids, bool(d.resumed_from_preemption))
                for d in cached]
    resumed = resumed_in_cached(cached)
    return [(req_id, cached.num_computed_tokens[i], cached.new_block_ids[i], req_id in resumed)
            for i, req_id in enumerate(cached.req_ids)]


def prefill_token_ids(new_request_data: Any) -> list[int] | None:
    """The tokens a new-request entry tells the model runner of: all of them
    (`prefill_token_ids`: 0.33.0's V2 runner, 0.34.0), else None (the prompt)."""
    return getattr(new_request_data, "prefill_token_ids", None)


def stagger_in_force(scheduler: Any) -> bool:
    """Whether `AsyncScheduler._update_after_schedule` sets
    `next_decode_eligible_step` (the decode stagger): 0.33.0 only with the
    V2 model runner (`Scheduler.use_v2_model_runner`); 0.34.0 always (it has
    no V1 runner: no `vllm.v1.worker.gpu_model_runner`)."""
    v2 = getattr(scheduler, "use_v2_model_runner", None)
    if v2 is not None:
        return bool(v2)
    if _module_exists("vllm.v1.worker.gpu_model_runner"):
        raise missing("Scheduler.use_v2_model_runner")
    return True


def decode_stagger(scheduler: Any) -> int:
    """`AsyncScheduler.decode_stagger` (set in its constructor)."""
    value = getattr(scheduler, "decode_stagger", None)
    if value is None:
        raise missing("AsyncScheduler.decode_stagger")
    return int(value)


def max_concurrent_batches(vllm_config: Any) -> int:
    value = getattr(vllm_config, "max_concurrent_batches", None)
    if value is None:
        raise missing("VllmConfig.max_concurrent_batches")
    return int(value)


def scheduling_policy(scheduler: Any) -> str:
    """"fcfs" or "priority": `Scheduler.policy` (0.33 on); 0.8.x's V1
    scheduler has no policy (FCFS)."""
    return str(getattr(getattr(scheduler, "policy", None), "value", "fcfs"))


def request_priority(request: Any) -> int:
    """`Request.priority` (0.33 on; 0.8.x's requests have none: 0)."""
    return int(getattr(request, "priority", 0))


def queued_requests(queue: Any) -> list[Any]:
    """A waiting queue's requests in its own order, for the bridge's
    bookkeeping, without calling vLLM's `PriorityRequestQueue.__iter__`:
    vLLM itself iterates a waiting queue only on a KV load failure
    (`_handle_invalid_blocks`), and the bridge's reads must not count as
    vLLM's in benchmarks/vllm_coverage.py. The iterator pops a copy of
    `_heap`; `Request.__lt__` is a total order, so sorting the heap gives the
    same sequence. A FCFS deque (or a list) is read as it is."""
    heap = getattr(queue, "_heap", None)
    return sorted(heap) if isinstance(heap, list) else list(queue)


def one_batch_per_request(scheduler: Any) -> bool:
    """0.8.4's policy: a scheduler that keeps `scheduled_req_ids` runs one
    batch per request; without it (0.8.5, "[V1][PP] Continue scheduling
    prefill chunks", and later) continue-prefill."""
    return hasattr(scheduler, "scheduled_req_ids")


def num_preallocate_tokens(kv_cache_manager: Any) -> int:
    """0.8.4's `KVCacheManager.num_preallocate_tokens` (64); later managers
    preallocate nothing and have no such attribute."""
    return int(getattr(kv_cache_manager, "num_preallocate_tokens", 0))


def num_spec_tokens(scheduler: Any, speculative_config: Any) -> int:
    """k: `Scheduler.num_spec_tokens` (0.8.5 on), else the
    `speculative_config` argument's `num_speculative_tokens` (0.8.4)."""
    k = getattr(scheduler, "num_spec_tokens", None)
    if k is None and speculative_config is not None:
        k = speculative_config.num_speculative_tokens
    return int(k or 0)


def vllm_config(scheduler: Any) -> Any | None:
    """The scheduler's VllmConfig (0.8.5 on); None for 0.8.4's scheduler,
    which is given its configs one by one."""
    return getattr(scheduler, "vllm_config", None)


def async_scheduling(scheduler_config: Any) -> bool:
    """`SchedulerConfig.async_scheduling` (0.33.0 on); 0.8.x schedules
    synchronously and has no such field."""
    return bool(getattr(scheduler_config, "async_scheduling", False))


def eos_token_id(request: Any) -> int | None:
    """A request's EOS: on the request (0.8.x), else in its sampling params
    (0.33.0 on: `check_stop` reads `sampling_params.eos_token_id`)."""
    if hasattr(request, "eos_token_id"):
        return request.eos_token_id
    return request.sampling_params.eos_token_id


def counts_in_flight(request: Any) -> bool:
    """Whether the request keeps `num_in_flight_tokens` (0.33.0 on): its
    outputs are then bound by id whatever its status."""
    return hasattr(request, "num_in_flight_tokens")


def model_runner_output(req_ids: list[str], sampled_token_ids: list[list[int]],
                        spec_token_ids: list[list[int]] | None = None) -> Any:
    """A ModelRunnerOutput with the fields this vLLM has: `req_id_to_index`
    where it has one (to 0.33.0), `spec_token_ids` (0.8.x)."""
    cls = _class(RUNNER)
    for name in ("req_ids", "sampled_token_ids"):
        if not has(cls, name):
            raise missing(f"ModelRunnerOutput.{name}")
    arguments: dict[str, Any] = {"req_ids": req_ids, "sampled_token_ids": sampled_token_ids}
    optional = {"req_id_to_index": {r: i for i, r in enumerate(req_ids)}, "spec_token_ids": spec_token_ids,
                "logprobs": None, "prompt_logprobs_dict": {}}
    arguments.update({k: v for k, v in optional.items() if has(cls, k)})
    return cls(**arguments)


def resolve_obj_by_qualname(qualname: str) -> Any:
    """vLLM's resolver of `scheduler_cls` (moved to vllm.utils.import_utils in 0.33)."""
    for owner in ("vllm.utils.import_utils:resolve_obj_by_qualname", "vllm.utils:resolve_obj_by_qualname"):
        module, _, name = owner.partition(":")
        try:
            found = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue
        if found is not None:
            return found(qualname)
    raise missing("vllm.utils.import_utils:resolve_obj_by_qualname")


# ---------------------------------------------------------------------------
# The whole check
# ---------------------------------------------------------------------------

def check_vllm(async_scheduling: bool = False) -> None:
    """Everything the bridge needs that can be read from vLLM's classes;
    IncompatibleVllm (one line) on the first thing missing."""
    for item in ALWAYS:
        if not _has(item.owner, item.name):
            raise missing(item.qualified)
    if not (_has(RUNNER, "req_id_to_index") or _has(RUNNER, "req_ids")):
        raise _missing_any("ModelRunnerOutput.req_id_to_index", "ModelRunnerOutput.req_ids")
    cached = _class(CACHED)
    if has(cached, "req_ids"):
        if not (has(cached, "resumed_req_ids") or _has(REQUEST, "prefill_token_ids")):
            raise _missing_any("CachedRequestData.resumed_req_ids", "Request.prefill_token_ids")
    elif not has(cached, "resumed_from_preemption"):
        raise _missing_any("CachedRequestData.req_ids", "CachedRequestData.resumed_from_preemption")
    if not any(_module_exists(owner.split(":")[0]) for owner in
               ("vllm.utils.import_utils", "vllm.utils")):
        raise missing("vllm.utils.import_utils:resolve_obj_by_qualname")
    if async_scheduling:
        _class(ASYNC)
        if _module_exists("vllm.v1.worker.gpu_model_runner") and not _has("vllm.config:VllmConfig",
                                                                           "use_v2_model_runner"):
            raise missing("VllmConfig.use_v2_model_runner")


def problem(async_scheduling: bool = False) -> str | None:
    """check_vllm's one line, or None when this vLLM has everything."""
    try:
        check_vllm(async_scheduling)
    except IncompatibleVllm as err:
        return str(err)
    except ImportError as err:               # vLLM itself does not import
        return f"vLLM does not import: {err}"
    return None


# What vLLM reads at import, set before a worker first imports it: V1, no
# logging setup of its own (its handler would write to stdout, the
# workers' answer channel), no hub access.
VLLM_ENVIRONMENT = {"VLLM_USE_V1": "1", "VLLM_CONFIGURE_LOGGING": "0", "HF_HUB_OFFLINE": "1",
                    "TRANSFORMERS_OFFLINE": "1"}


def set_environment() -> None:
    """VLLM_ENVIRONMENT, where the caller has not set those variables."""
    for name, value in VLLM_ENVIRONMENT.items():
        os.environ.setdefault(name, value)


def exit_if_incompatible(out: Any = None) -> None:
    """For a worker's start: on an incompatible vLLM, its one line as the
    worker's `{"error": ...}` answer, and exit 2."""
    set_environment()
    found = problem()
    if found is not None:
        stream = out if out is not None else sys.stdout
        stream.write(json.dumps({"error": found}) + "\n")
        stream.flush()
        sys.exit(2)


__all__ = ["IncompatibleVllm", "NEEDED", "Needed", "async_scheduling", "cached_rows", "check_vllm",
           "counts_in_flight", "num_preallocate_tokens", "num_spec_tokens", "one_batch_per_request", "vllm_config",
           "decode_stagger", "eos_token_id", "exit_if_incompatible", "max_concurrent_batches",
           "model_runner_output", "output_index", "prefill_token_ids", "problem", "resolve_obj_by_qualname",
           "resumed_in_cached", "scheduler_config_has", "set_environment", "stagger_in_force"]
