"""The scheduler's configuration (vLLM's SchedulerConfig, CacheConfig,
ParallelConfig and SpeculativeConfig fields that matter here), validated at
construction so a bad configuration fails before any request arrives."""

from __future__ import annotations

from dataclasses import dataclass

from .connector import KvConnectorConfig
from .profiles import DEFAULT_PROFILE, Profile, get_profile, released_profile


def cdiv(a: int, b: int) -> int:
    """Ceiling division."""
    return -(-a // b)


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int = 2048     # token budget of one batch
    max_num_seqs: int = 256                # running requests at most
    max_model_len: int = 16384             # prompt + outputs at most
    block_size: int = 16                   # tokens per KV block
    num_blocks: int = 1024                 # KV pool size (no reserved null block)
    num_pipeline_stages: int = 1           # PP size = engine batch queue depth
    long_prefill_token_threshold: int = 0  # 0: off; else cap of one request's chunk
    num_spec_tokens: int = 0               # k: drafts per request per step at most
    # A drafter with its own forward pass (`Profile.lookahead_slots`): KV slots
    # past each entry (0 or k) and the budget's input slots per entry (batch.py).
    num_lookahead_tokens: int = 0
    draft_input_slots: int = 0
    enable_prefix_caching: bool = True
    profile: str = DEFAULT_PROFILE         # the vLLM version modelled (profiles.py)
    # None: the profile's. False: one batch per request (vLLM <= 0.8.4).
    continue_prefill: bool | None = None   # type: ignore[assignment]  # a bool once built
    # None: the profile's (0.8.4: 64). Extra tokens' worth of blocks taken on
    # each allocation that needs new blocks (kv_cache_manager.py).
    num_preallocate_tokens: int | None = None  # type: ignore[assignment]  # an int once built
    # vLLM 0.33 only: drop mode (`_preempt_request(drop_stale_output=True)`,
    # which 0.33 uses for `reset_prefix_cache(reset_running_requests=True)` and
    # KV connectors that need a KV hand-off): a preempted request resumes at
    # once and the output of its batches in flight is discarded. False:
    # deliver mode, 0.33's default (the resumption waits for that output).
    drop_stale_output: bool = False
    # The profile as vLLM released it (profiles.py `RELEASED`): the
    # reference's later fixes, its named deviations (reference/README.md),
    # switched off. The vLLM differential's conforming run.
    as_released: bool = False
    # vLLM's `enable_chunked_prefill` (on by default): off, a prompt is
    # admitted whole or not at all (profiles `unchunked_prefill_stops_admission`).
    enable_chunked_prefill: bool = True
    # vLLM 0.34's opt-in cache-aware admission (admission_order.py): the
    # window at the head of `waiting` it reorders (0: off) and the KV cache
    # usage from which it does.
    cache_aware_admission_window: int = 0
    cache_aware_admission_threshold: float = 0.5
    # vLLM 0.33/0.34's `prefill_schedule_interval` (1: off; cadence.py).
    prefill_schedule_interval: int = 1
    # vLLM's `LoRAConfig.max_loras` (0: no LoRA config; lora.py), and
    # whether requests may ask for prompt logprobs (the trace says so).
    max_loras: int = 0
    prompt_logprobs: bool = False
    kv_connector: KvConnectorConfig | None = None  # connector.py; None: no connector
    # None: the profile's; False: async loads need no reservation (the spec
    # abstracts vLLM's `_inflight_prefill_reserved_blocks` away: the refinement fuzzer's).
    kv_load_reservation: bool | None = None
    # The order a failing load's requests finish in under the fail policy
    # (`_finish_with_error`): these ids first, in this order, the rest in id
    # order. vLLM iterates a set of ids, whose order follows the process's
    # hash seed; the differential replays the order vLLM took.
    kv_error_order: tuple[str, ...] = ()
    # vLLM's `SchedulerConfig.policy` (`policy` here is the trace's name for
    # continue-prefill): "fcfs" or "priority" (priority.py; only where the
    # profile has it, `priority_policy`).
    scheduling_policy: str = "fcfs"

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs", "max_model_len",
                     "block_size", "num_blocks", "num_pipeline_stages"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.max_model_len < 2:
            # A prompt needs at least one token and room for one output token.
            raise ValueError(f"max_model_len must be at least 2, got {self.max_model_len}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be >= 0 (0 turns it off), "
                             f"got {self.long_prefill_token_threshold}")
        if self.num_spec_tokens < 0:
            raise ValueError(f"num_spec_tokens must be >= 0, got {self.num_spec_tokens}")
        self._validate_admission()
        # One request may hold KV for up to max_model_len tokens (drafts are
        # clipped at max_model_len); it must fit in the pool on its own, or
        # preemption could not make room for it and it would never finish.
        needed = cdiv(self.max_model_len, self.block_size)
        if self.num_blocks < needed:
            raise ValueError(
                f"num_blocks={self.num_blocks} is fewer than one request of max_model_len="
                f"{self.max_model_len} needs ({needed} blocks of {self.block_size} tokens)")
        profile = self.version_profile
        # Unset knobs take the profile's value, so every reader sees a plain value.
        if self.continue_prefill is None:
            object.__setattr__(self, "continue_prefill", profile.continue_prefill)
        if self.num_preallocate_tokens is None:
            object.__setattr__(self, "num_preallocate_tokens", profile.num_preallocate_tokens)
        if self.drop_stale_output and not profile.stale_output_counters:
            raise ValueError(f"drop_stale_output needs a profile with vLLM 0.33's stale-output "
                             f"counters; {self.profile} has none")
        if self.kv_connector is not None and not self.continue_prefill:
            raise ValueError("a KV connector is modelled with continue-prefill only")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling_policy must be 'fcfs' or 'priority', got {self.scheduling_policy!r}")
        if self.scheduling_policy == "priority" and not profile.priority_policy:
            raise ValueError(f"profile {self.profile} has no priority policy (vLLM 0.33 and later)")
        if (self.num_lookahead_tokens or self.draft_input_slots) and not (profile.lookahead_slots
                                                                          and self.num_spec_tokens):
            raise ValueError(f"num_lookahead_tokens and draft_input_slots need drafts and a profile with "
                             f"lookahead slots (vLLM 0.33 and later), not {self.profile}")
        if not isinstance(self.num_preallocate_tokens, int) or self.num_preallocate_tokens < 0:
            raise ValueError("num_preallocate_tokens must be >= 0, "
                             f"got {self.num_preallocate_tokens!r}")

    def _validate_admission(self) -> None:
        """vLLM's `SchedulerConfig.verify_max_model_len`: without chunked
        prefill one batch must hold a whole max_model_len; the cache-aware
        window is >= 0 and its usage threshold in [0, 1]."""
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) is smaller than "
                             f"max_model_len ({self.max_model_len}) with chunked prefill off")
        if not isinstance(self.max_loras, int) or self.max_loras < 0:
            raise ValueError(f"max_loras must be >= 0, got {self.max_loras!r}")
        if not isinstance(self.prefill_schedule_interval, int) or self.prefill_schedule_interval < 1:
            raise ValueError(f"prefill_schedule_interval must be >= 1, got {self.prefill_schedule_interval!r}")
        if not isinstance(self.cache_aware_admission_window, int) or self.cache_aware_admission_window < 0:
            raise ValueError(f"cache_aware_admission_window must be >= 0, got {self.cache_aware_admission_window!r}")
        if not 0.0 <= self.cache_aware_admission_threshold <= 1.0:
            raise ValueError("cache_aware_admission_threshold must be in [0, 1], "
                             f"got {self.cache_aware_admission_threshold!r}")

    @property
    def can_skip_drafts(self) -> bool:
        """vLLM's `Scheduler.can_skip_drafts`: lookahead slots, where the profile skips drafts."""
        return self.num_lookahead_tokens > 0 and self.version_profile.skips_unused_drafts

    @property
    def version_profile(self) -> Profile:
        """The constants the scheduler reads (profiles.py): the profile's, or
        with `as_released` its released variant."""
        return released_profile(self.profile) if self.as_released else get_profile(self.profile)

    @property
    def release_order(self) -> str:
        """"reverse" or "forward" (profiles.py, vLLM's `KVCacheManager.free`)."""
        return self.version_profile.release_order(self.enable_prefix_caching)

    @property
    def async_scheduling(self) -> bool:
        """vLLM 0.33's `AsyncScheduler` (output placeholders, decode stagger)."""
        return self.version_profile.async_scheduling

    @property
    def decode_stagger(self) -> int:
        """Scheduler steps between two decodes of one request under async
        scheduling (`AsyncScheduler.__init__`: `decode_stagger =
        pipeline_parallel_size`); 0 when scheduling is synchronous."""
        return self.num_pipeline_stages if self.async_scheduling else 0

    @property
    def batch_queue_depth(self) -> int:
        """The engine's batch queue (`VllmConfig.max_concurrent_batches`): K,
        or K + 1 under async scheduling with the V2 model runner."""
        return self.num_pipeline_stages + 1 if self.async_scheduling else self.num_pipeline_stages

    @property
    def cache_duplicate_blocks(self) -> bool:
        return self.version_profile.cache_duplicate_blocks

    @property
    def policy(self) -> str:
        """The trace format's name for the scheduling policy."""
        return "continue-prefill" if self.continue_prefill else "one-batch-per-request"
