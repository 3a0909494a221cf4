"""The constants of the spec: the scheduler's configuration.

Abstracted away: everything about the model (layers, weights, dtypes), the
encoder budgets, LoRA and structured output (asynchronous
scheduling is a profile, `vllm-0.33-async`; a KV connector is
`Config.kv_connector`, docs/kv-connector.md; priorities are
`Config.scheduling_policy`, docs/request-states.md). None of them changes how many tokens are in flight for whom, which
is all this spec is about.

Where vLLM versions differ, `profile` names the version (`profiles.py`) and the
fields left at None take that profile's value: the policy (`continue_prefill`),
the release order of a freed table, preallocation, duplicate cached blocks.
A field given explicitly overrides the profile (a trace's explicit keys do).
The profile's other constants (vLLM 0.33's rules) have no field: the actions
read them from `Config.rules`.
The profile's values are resolved at construction, so `dataclasses.replace`
keeps them: to re-derive one (say, after changing `profile` or
`prefix_caching`), pass None for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from typing import Literal

from .profiles import DEFAULT_PROFILE, Profile, ReleaseOrder, profile as profile_named

StaleMode = Literal["deliver", "drop"]
LoadFailurePolicy = Literal["recompute", "fail"]
SchedulingPolicy = Literal["fcfs", "priority"]


@dataclass(frozen=True)
class KvConnector:
    """A KV connector's configuration (vLLM's `KVTransferConfig`), as far as
    the scheduler sees it. What it offers each request is the environment's
    (`Prompt.external_hit`, `Prompt.load_async`); each feature is in force
    only where the profile has it (`Profile.kv_*`)."""

    # `is_kv_consumer`: loads KV; with more than one batch in flight the step
    # fence is in force (`Scheduler.__init__`'s `defer_block_free`).
    consumer: bool = True
    # `is_kv_producer`: a finished request's blocks are held until its KV is
    # sent (`request_finished` -> `delay_free`), and its preemptions drop
    # in-flight output (`requires_kv_delivery`).
    producer: bool = False
    # `kv_load_failure_policy`: a failed load is recomputed from its first
    # invalid block, or its request finishes with FINISHED_ERROR.
    load_failure_policy: LoadFailurePolicy = "recompute"
    # `SchedulerConfig.max_num_inflight_kv_loads` (vLLM 0.34; None = no limit).
    max_inflight_loads: int | None = None

    def __post_init__(self) -> None:
        if self.load_failure_policy not in ("recompute", "fail"):
            raise ValueError(f"load_failure_policy must be 'recompute' or 'fail', got {self.load_failure_policy!r}")
        if self.max_inflight_loads is not None and self.max_inflight_loads < 1:
            raise ValueError("max_inflight_loads must be None or at least 1")


@dataclass(frozen=True)
class Config:
    """The scheduler's knobs (vLLM's SchedulerConfig/CacheConfig names)."""

    num_stages: int = 2                      # K: pipeline stages = batch queue depth
    max_num_batched_tokens: int = 8          # token budget per batch
    max_num_seqs: int = 2                    # running requests at most
    block_size: int = 2                      # tokens per KV block
    num_blocks: int = 8                      # the pool
    max_model_len: int = 16                  # prompt + outputs at most
    long_prefill_token_threshold: int = 0    # 0 = off; else one request's chunk cap
    num_spec_tokens: int = 0                 # k: drafts proposed per step at most
    # A drafter with its own forward pass (lookahead.py; `Profile.lookahead_slots`):
    # KV slots reserved past each entry (0 or k) and the budget's input slots per entry.
    num_lookahead_tokens: int = 0
    draft_input_slots: int = 0
    prefix_caching: bool = True
    profile: str = DEFAULT_PROFILE           # the vLLM version modelled (profiles.py)
    # What a preempted request's output still in flight becomes, under a
    # profile with stale-output counters (vLLM 0.33 `_preempt_request`'s
    # `drop_stale_output`): "deliver" (the default: appended while PREEMPTED,
    # its resumption deferred until it drains) or "drop" (vLLM's mode for
    # `reset_prefix_cache` and KV connectors that need delivery: resumed at
    # once, its stale output discarded). Ignored by the 0.8.x profiles.
    stale_mode: StaleMode = "deliver"
    # The environment may bring a new request in under the name of a finished
    # one whose batches are still in flight (front ends with request-id
    # randomization off). Off by default: names are then unique.
    allow_name_reuse: bool = False
    # None: the profile's value (resolved in __post_init__, so always set after it)
    continue_prefill: bool = None            # type: ignore[assignment]  # the PR; False = one batch per request
    release_order: ReleaseOrder = None       # type: ignore[assignment]  # how a freed table joins the free queue
    num_preallocate_tokens: int = None       # type: ignore[assignment]  # 0.8.4's blocks ahead of need
    cache_duplicate_blocks: bool = None      # type: ignore[assignment]  # a hash may be cached by two blocks
    # Asynchronous scheduling (`Profile.output_placeholders`): the batch queue
    # depth D (K, or K + 1 under vLLM 0.33's AsyncScheduler with the V2
    # runner) and the decode stagger (K under it, 0 = none). None: derived
    # from K and the profile whenever read (`queue_depth`, `stagger`), so a
    # `replace` of num_stages carries them along; a trace may set them.
    batch_queue_depth: int | None = None
    decode_stagger: int | None = None
    # vLLM's `SchedulerConfig.enable_chunked_prefill` (on: vLLM's default).
    # Off, under a profile with `unchunked_prefill_stops_admission` (0.33,
    # 0.34), a prompt is admitted whole or not at all; vLLM then requires
    # max_num_batched_tokens >= max_model_len (`verify_max_model_len`).
    enable_chunked_prefill: bool = True
    # vLLM 0.34's cache-aware admission (`SchedulerConfig.
    # cache_aware_admission_window`, 0 = off, and `_threshold`, the KV cache
    # usage it waits for); read only under `Profile.cache_aware_admission`
    # with prefix caching on (admission_order.py).
    cache_aware_admission_window: int = 0
    cache_aware_admission_threshold: float = 0.5
    # vLLM 0.33/0.34's local prefill cadence (`SchedulerConfig.
    # prefill_schedule_interval`, 1 = off; cadence.py), read only under
    # `Profile.prefill_cadence`.
    prefill_schedule_interval: int = 1
    # The KV connector (docs/kv-connector.md); None: no connector, the spec
    # exactly as without one (every state count unchanged).
    kv_connector: KvConnector | None = None
    # vLLM's `SchedulerConfig.policy` (docs/request-states.md, "Priority
    # scheduling"): "fcfs" (the default: the spec exactly as without it) or
    # "priority" (spec/priority.py), only where the profile has it
    # (`Profile.priority_policy`).
    scheduling_policy: SchedulingPolicy = "fcfs"
    # Structured output (spec/grammar.py): requests whose prompt asks for it
    # wait for their grammar and advance an FSM. Off: the spec as before.
    # Only the profiles with stale-output counters (vLLM 0.33, 0.34) model it.
    structured_output: bool = False
    # Streaming sessions (spec/sessions.py; vLLM's resumable requests, where
    # the profile has them: `Profile.streaming_sessions`). Off: no request is
    # resumable, the spec exactly as without them.
    streaming_sessions: bool = False
    # The environment may reset the prefix cache (dropping the running
    # requests' in-flight output) and pause the scheduler between steps
    # (reset_pause.py; `Profile.reset_drops_running_output`, `pause_states`).
    # Off: neither action is enabled, the spec exactly as before.
    reset_and_pause: bool = False
    # vLLM's `LoRAConfig.max_loras` (0: no LoRA config, the spec exactly as
    # without it): the waiting loop passes over a request whose LoRA would
    # make the running requests hold more (spec/lora.py).
    max_loras: int = 0
    # Requests may ask for prompt logprobs (spec/lora.py): such a request
    # reads nothing from the prefix cache. Off: the flag of an arrival is
    # dropped, the spec exactly as without it.
    prompt_logprobs: bool = False
    # KV7 checked by the explicit search (spec/kv_invalid.py): the history
    # variable `State.invalid_kv` made part of a state's identity
    # (`kv_invalid.InvalidKvState`, from the search's initial state) and KV7
    # among the transition properties. Off: the spec, its properties and
    # its state counts exactly as before. Needs a KV connector under the
    # recompute policy (the only one that leaves blocks invalid).
    check_invalid_kv: bool = False
    # KV8 checked by the explicit search (spec/kv_unwritten.py), as KV7:
    # `State.unwritten_kv` in a state's identity (`kv_unwritten.UnwrittenKvState`)
    # and KV8 among the transition properties. Off: exactly as before. Needs
    # the priority policy and prefix caching (the only way to the history
    # variable), and not KV7's flag beside it (one history variable a search).
    check_unwritten_kv: bool = False

    def __post_init__(self) -> None:
        self._resolve_profile()
        positive = ("num_stages", "max_num_batched_tokens", "max_num_seqs",
                    "block_size", "num_blocks", "max_model_len")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be >= 0")
        if self.num_spec_tokens < 0:
            raise ValueError("num_spec_tokens must be >= 0")
        if self.release_order not in ("reverse", "forward"):
            raise ValueError(f"release_order must be 'reverse' or 'forward', got {self.release_order!r}")
        if self.num_preallocate_tokens < 0:
            raise ValueError("num_preallocate_tokens must be >= 0")
        if self.queue_depth < 1 or self.stagger < 0:
            raise ValueError("batch_queue_depth must be >= 1 and decode_stagger >= 0")
        if self.stale_mode not in ("deliver", "drop"):
            raise ValueError(f"stale_mode must be 'deliver' or 'drop', got {self.stale_mode!r}")
        self._check_admission_knobs()
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling_policy must be 'fcfs' or 'priority', got {self.scheduling_policy!r}")
        if self.scheduling_policy == "priority" and not self.rules.priority_policy:
            raise ValueError(f"profile {self.profile} has no priority policy (vLLM 0.33 and later)")
        if self.reset_and_pause and not (self.rules.reset_drops_running_output and self.rules.pause_states):
            raise ValueError(f"reset_and_pause needs a profile with reset and pause (vLLM 0.33 on), not {self.profile}")
        if self.max_loras < 0:
            raise ValueError("max_loras must be >= 0")
        if self.check_invalid_kv and (self.kv_connector is None or self.kv_connector.load_failure_policy != "recompute"):
            raise ValueError("check_invalid_kv (KV7) needs a KV connector under the recompute policy")
        if self.check_unwritten_kv and not (self.scheduling_policy == "priority" and self.prefix_caching
                                            and not self.check_invalid_kv):
            raise ValueError("check_unwritten_kv (KV8) needs the priority policy and prefix caching, "
                             "without check_invalid_kv")
        self._check_drafter()
        if (self.max_loras or self.prompt_logprobs) and not self.rules.stale_output_counters:
            raise ValueError("max_loras and prompt_logprobs are modelled only under the vLLM 0.33 and 0.34 "
                             "profiles")

    def _check_drafter(self) -> None:
        """Lookahead and draft input slots come with drafts, from a profile
        that has them (vLLM 0.33 and 0.34: `Profile.lookahead_slots`), and
        vLLM's `_set_max_num_scheduled_tokens` wants a budget above the slots."""
        if self.num_lookahead_tokens < 0 or self.draft_input_slots < 0:
            raise ValueError("num_lookahead_tokens and draft_input_slots must be >= 0")
        if not (self.num_lookahead_tokens or self.draft_input_slots):
            return
        if not self.num_spec_tokens or not self.rules.lookahead_slots:
            raise ValueError(f"num_lookahead_tokens and draft_input_slots need drafts and a profile with "
                             f"lookahead slots (vLLM 0.33 and 0.34), not {self.profile}")
        if self.max_num_batched_tokens <= max(self.num_lookahead_tokens, self.draft_input_slots):
            raise ValueError("max_num_batched_tokens must be above num_lookahead_tokens and draft_input_slots")

    def _check_admission_knobs(self) -> None:
        """vLLM's `SchedulerConfig` bounds: the budget holds a whole
        max_model_len when prompts are not chunked, the window is >= 0 and
        the usage threshold in [0, 1]."""
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(f"with chunked prefill off, max_num_batched_tokens "
                             f"({self.max_num_batched_tokens}) must be at least max_model_len "
                             f"({self.max_model_len})")
        if self.cache_aware_admission_window < 0:
            raise ValueError("cache_aware_admission_window must be >= 0")
        if self.prefill_schedule_interval < 1:
            raise ValueError("prefill_schedule_interval must be >= 1")
        if not 0.0 <= self.cache_aware_admission_threshold <= 1.0:
            raise ValueError("cache_aware_admission_threshold must be in [0, 1]")
        if self.structured_output and not self.rules.stale_output_counters:
            raise ValueError("structured_output is modelled only under the vLLM 0.33 and 0.34 profiles")

    def _resolve_profile(self) -> None:
        """Fill every field left at None from the profile (frozen: set through object)."""
        chosen = profile_named(self.profile)
        defaults = {"continue_prefill": chosen.policy == "continue-prefill",
                    "release_order": chosen.release_order(self.prefix_caching),
                    "num_preallocate_tokens": chosen.num_preallocate_tokens,
                    "cache_duplicate_blocks": chosen.cache_duplicate_blocks}
        for name, value in defaults.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)

    @property
    def rules(self) -> Profile:
        """The profile's constants that no field overrides (vLLM 0.33's rules:
        free-queue head, threshold, clip, admission gate, deferred resumption,
        stop order); read where they apply, never copied into a field."""
        return profile_named(self.profile)

    @property
    def fences_freed_blocks(self) -> bool:
        """vLLM 0.33/0.34 `defer_block_free`: a consumer connector with more
        than one batch in flight (`max_concurrent_batches > 1`), where the
        profile has the step fence (`Profile.kv_step_fence`)."""
        kv = self.kv_connector
        return kv is not None and kv.consumer and self.queue_depth > 1 and self.rules.kv_step_fence

    @property
    def queue_depth(self) -> int:
        """D: the batches in flight at most (`VllmConfig.max_concurrent_batches`):
        K, plus `Profile.extra_queued_batches` (1 under async scheduling)."""
        if self.batch_queue_depth is not None:
            return self.batch_queue_depth
        return self.num_stages + self.rules.extra_queued_batches

    @property
    def stagger(self) -> int:
        """The schedule() calls between two sampling entries of one request at
        least (`AsyncScheduler.decode_stagger`, K under async; 0 = no gate)."""
        if self.decode_stagger is not None:
            return self.decode_stagger
        return self.num_stages if self.rules.decode_stagger_is_pipeline_depth else 0

    @property
    def max_blocks_per_request(self) -> int:
        """vLLM's `max_num_blocks_per_req`: the blocks max_model_len tokens fill."""
        return -(-self.max_model_len // self.block_size)
