"""The spec's configuration for a trace: the version profile its config event
selects, the constants its keys override, and the block pool cut to what the
trace can ever take.

The trace picks the spec's version profile (spec/profiles.py) from its
config event: `vllm_version` selects that version's profile, explicit keys
(`policy`, `num_preallocate_tokens`, `release_order`, `cache_duplicate_blocks`)
override its constants, no version means the default profile; a version no
profile covers is refused (UnknownVersion, exit 2) unless the caller names
the profile (`--profile`). docs/trace-format.md, "How a trace picks its profile".
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from flightcheck.spec import Config
from flightcheck.spec.blocks import cdiv
from flightcheck.spec.profiles import DEFAULT_PROFILE, PROFILES, profile as profile_named, profile_for_version

from .connector import connector_from_event
from .reading import MalformedTrace
from .schema import MAX_POOL_BLOCKS, show


class UnknownVersion(MalformedTrace):
    """The trace names a vLLM version no profile covers, and no profile was
    given (exit code 2, like a malformed file: no verdict is possible)."""


# A sync profile -> the profile of the same version with asynchronous
# scheduling, selected by a config event's `async_scheduling: true`.
ASYNC_PROFILES: dict[str, str] = {"vllm-0.33": "vllm-0.33-async", "vllm-0.34": "vllm-0.34-async"}

# Config keys a trace may give to override its profile's constants.
_POLICIES = {"continue-prefill": True, "one-batch-per-request": False}
_OVERRIDES = ("num_preallocate_tokens", "release_order", "cache_duplicate_blocks", "batch_queue_depth",
              "decode_stagger")


def select_profile(event: dict, override: str | None = None) -> str:
    """The profile a config event asks for: `override` (the caller's
    `--profile`) if given, else the `profile` it names (flightcheck's own
    writers), else its `vllm_version`'s, else the default. UnknownVersion for
    a version or a named profile no profile covers; ValueError for an
    unknown `override`."""
    if override is not None:
        if override not in PROFILES:
            raise ValueError(f"unknown profile {show(override)}; known: {', '.join(PROFILES)}")
        return override
    named = event.get("profile")
    if named is not None:
        if named not in PROFILES:
            raise UnknownVersion(f"line 1: config event: profile: no profile is named {show(named)} "
                                 f"(profiles: {', '.join(PROFILES)}); name one with --profile")
        return named
    version = event.get("vllm_version")
    asynchronous = event.get("async_scheduling", False)
    if version is None and not asynchronous:
        return DEFAULT_PROFILE
    chosen = None if version is None else profile_for_version(version)
    if chosen is None:
        raise UnknownVersion(f"line 1: config event: vllm_version: no profile covers vLLM {show(version)} "
                             f"(profiles: {', '.join(PROFILES)}); name one with --profile")
    if asynchronous:
        return _async_profile(chosen.name, version)
    return chosen.name


def _async_profile(sync_profile: str, version: str | None) -> str:
    """The async variant of a version's profile, selected by `async_scheduling`."""
    name = ASYNC_PROFILES.get(sync_profile)
    if name is None:
        raise UnknownVersion(f"line 1: config event: async_scheduling: no profile models asynchronous "
                             f"scheduling for vLLM {show(version)} (profiles: {', '.join(PROFILES)}); "
                             "name one with --profile")
    return name


def config_from_event(event: dict, profile: str | None = None) -> Config:
    """The spec's Config from a validated config event, under `profile` (by
    default the one the event selects); explicit keys override the profile."""
    overrides: dict[str, Any] = {}
    if "policy" in event:
        overrides["continue_prefill"] = _POLICIES[event["policy"]]
    for key in _OVERRIDES:
        if key in event:
            overrides[key] = event[key]
    chosen = select_profile(event, profile)
    _refuse_knobs_the_profile_lacks(event, chosen)
    try:
        return _config(event, chosen, overrides)
    except MalformedTrace:
        raise
    except ValueError as err:         # a combination the spec does not model (Config's own checks)
        raise MalformedTrace(f"line 1: config event: {err}") from None


def _refuse_knobs_the_profile_lacks(event: dict, profile: str) -> None:
    """A knob the chosen version does not have cannot be checked under it:
    the spec reads `prefill_schedule_interval` only where
    `Profile.prefill_cadence` is on (vLLM 0.33's `Scheduler.__init__` brought
    `local_prefill_interval`), so a 0.8.x trace with an interval above 1 would
    be checked as if prefill ran every step. Refused, naming the knob."""
    interval = event.get("prefill_schedule_interval", 1)
    if interval > 1 and not profile_named(profile).prefill_cadence:
        raise MalformedTrace(f"line 1: config event: prefill_schedule_interval: {interval} under profile "
                             f"{profile}, which has no prefill cadence (vLLM 0.33 and later); name a "
                             "profile that has one with --profile, or drop the key")


def _config(event: dict, profile: str, overrides: dict[str, Any]) -> Config:
    return Config(
        profile=profile, **overrides,
        num_stages=event["num_stages"],
        max_num_batched_tokens=event["max_num_batched_tokens"],
        max_num_seqs=event.get("max_num_seqs", 256), block_size=event["block_size"],
        num_blocks=event.get("usable_blocks", event["num_blocks"]),
        max_model_len=event["max_model_len"],
        long_prefill_token_threshold=event.get("long_prefill_token_threshold", 0),
        num_spec_tokens=event.get("num_spec_tokens", 0),
        num_lookahead_tokens=event.get("num_lookahead_tokens", 0),
        draft_input_slots=event.get("draft_input_slots", 0),
        prefix_caching=event.get("prefix_caching", False),
        enable_chunked_prefill=event.get("enable_chunked_prefill", True),
        cache_aware_admission_window=event.get("cache_aware_admission_window", 0),
        cache_aware_admission_threshold=event.get("cache_aware_admission_threshold", 0.5),
        prefill_schedule_interval=event.get("prefill_schedule_interval", 1),
        kv_connector=connector_from_event(event),
        streaming_sessions=event.get("streaming_sessions", False),
        scheduling_policy=event.get("scheduling_policy", "fcfs"),
        structured_output=event.get("structured_output", False),
        max_loras=event.get("max_loras", 0), prompt_logprobs=event.get("prompt_logprobs", False))


def modelled_pool(cfg: Config, events: list[dict[str, Any]]) -> Config:
    """The config with the pool cut to the blocks this trace can ever take.

    The spec's pool is materialised (one entry per block, copied on every
    change), so a 10**7-block pool would cost seconds per event. The cut is
    exact: fresh blocks are popped from the head of the free queue, which
    starts as 0, 1, 2, ... and to whose tail freed blocks return; while no
    more blocks are popped over the whole run than the cut pool holds, no
    allocation fails in either pool (so neither preempts), the same blocks
    are popped in the same order, and no freed block is popped again (so the
    same prefix-cache labels survive). A request pops at most the blocks of
    the tokens it can ever hold: its prompt, max_tokens outputs and, in
    flight, up to num_spec_tokens drafts beyond them (twice, for margin), and
    never more than max_model_len tokens. With preallocation (vLLM 0.8.4) a
    request may also take blocks ahead of need, up to max_model_len's blocks
    per request: the bound counts those too, so the cap "no more than the free
    blocks" never binds in the cut pool unless it binds in the whole one.
    With a KV connector each request counts twice: a failed load may free
    its table and the request take a new one (the connector promises one
    load per incarnation, C1), and each reset of the running requests
    (`reset` with `running`) lets every request take its table once more: a
    preemption with the pool far from full. Only `state_before` differs: it lists the
    cut pool's free queue.
    With vLLM 0.34's cache-aware admission window open the pool is not cut:
    the reorder reads the cache's usage, a share of the whole pool."""
    if cfg.cache_aware_admission_window and cfg.rules.cache_aware_admission:
        return _whole_pool(cfg)
    arrivals = sum(arrival_blocks(cfg, e) for e in events if e["ev"] == "arrive")
    # a reset of the running requests preempts them with the pool far from full:
    # each request may take its table again, once per such reset
    resets = sum(1 for e in events if e["ev"] == "reset" and e.get("running"))
    most = 1 + (1 + resets) * arrivals
    num_blocks = min(cfg.num_blocks, most)
    if num_blocks > MAX_POOL_BLOCKS:
        raise MalformedTrace(f"line 1: config event: num_blocks: this trace's arrivals can take up to "
                             f"{num_blocks} blocks of the pool; the checker models pools of at most "
                             f"{MAX_POOL_BLOCKS} blocks")
    return replace(cfg, num_blocks=num_blocks)


def arrival_blocks(cfg: Config, arrive: dict[str, Any]) -> int:
    """The most blocks one arrival can take from the pool over its life, as
    `modelled_pool` counts them (the streaming checker grows its pool by it)."""
    k, bs = cfg.num_spec_tokens, cfg.block_size
    ahead = cfg.max_blocks_per_request if cfg.num_preallocate_tokens > 0 else 0
    # a KV load that fails can free a request's table and take it again (one load per incarnation)
    again = 2 if cfg.kv_connector is not None else 1
    ahead_slots = cfg.num_lookahead_tokens   # a drafter's lookahead slots (spec/lookahead.py)
    tokens = min(cfg.max_model_len, arrive["prompt_len"] + arrive["max_tokens"] + 2 * k + 1 + ahead_slots)
    if arrive.get("resumable"):        # a streaming session's turns grow it up to max_model_len
        tokens = cfg.max_model_len + 2 * k + 1 + ahead_slots
    return again * (max(cdiv(tokens, bs), ahead) + 1)


def _whole_pool(cfg: Config) -> Config:
    """The config with its whole pool, refused when the checker cannot hold it."""
    if cfg.num_blocks > MAX_POOL_BLOCKS:
        raise MalformedTrace(f"line 1: config event: num_blocks: with cache_aware_admission_window on, "
                             f"the checker models the whole pool ({cfg.num_blocks} blocks; at most "
                             f"{MAX_POOL_BLOCKS})")
    return cfg
