"""Streaming sessions' model-checking constants (docs/request-states.md,
"Streaming sessions"), kept apart from the spec as `models.py` and
`kv_models.py` keep theirs: small models sized for a session's lifecycle
(running, stopped waiting for input, its next input, running again,
finished) with batches in flight across the stop, searched under the
profiles that have sessions (vLLM 0.33 and 0.34, sync and async), and the
model each session mutant is hunted on.
"""

from __future__ import annotations

from dataclasses import replace

from flightcheck.spec import Config, KvConnector, Prompt
from flightcheck.verification.models import Model

# The profile every session mutant is hunted under.
SESSION_PROFILE = "vllm-0.34-async"

# Targets of every profile a session model is too small to reach (the
# profile's own models reach them).
_SESSION_SKIPPED = ("preempted_request_resumes_and_finishes", "resumption_deferred", "stale_output_delivered",
                    "decode_behind_decode", "stopped_with_output_in_flight", "two_prefill_chunks_in_flight",
                    "blocks_freed_behind_fence")


def _under(model: Model, profile: str) -> Model:
    """`model` under `profile`, renamed after it ("session-k2@vllm-0.34")."""
    return replace(model.under_profile(profile), name=f"{model.name}@{profile}")


def _session(prompt_len: int, max_tokens: int, *inputs: tuple[int, int], external_hit: int = 0,
             load_async: bool = False) -> Prompt:
    """A session's first prompt, then its client's inputs; the end of the session last
    (with a KV connector: what it offers the first prompt)."""
    return Prompt(prompt_len, max_tokens, session=inputs + ((0, 0),), external_hit=external_hit,
                  load_async=load_async)


# One session of two turns (a prompt of 2 that stops by 2 outputs, then
# 1 new token and 2 outputs) beside a plain request, K = 2, one seat: the
# session's stop with batches in flight, its wait for input holding the
# seat and its blocks, its next turn; aborts and stop tokens on.
SESSION_K2 = Model(
    "session-k2",
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=1, block_size=2, num_blocks=4,
           max_model_len=8, prefix_caching=False, profile="vllm-0.34", streaming_sessions=True),
    (_session(2, 2, (1, 2)), Prompt(1, 1)),
    skip_targets=_SESSION_SKIPPED,
)
# Two seats and a pool of 3 blocks: the session's next turn competes with a
# plain request for blocks (preemption of a session, a stale output that
# stops it while preempted).
SESSION_PRESSURE_K2 = Model(
    "session-pressure-k2",
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2, num_blocks=3,
           max_model_len=8, prefix_caching=False, profile="vllm-0.34", streaming_sessions=True),
    (_session(1, 1, (2, 1)), Prompt(2, 2)),
    allow_abort=False, skip_targets=_SESSION_SKIPPED + ("session_holds_seat_for_input", "session_waits_with_old_output_in_flight",
                                                        "session_runs_beside_old_output"),
)
# Spec decode (k = 1): a session's drafts at its stop (#42655).
SESSION_DRAFTS_K2 = Model(
    "session-drafts-k2",
    Config(num_stages=2, max_num_batched_tokens=4, max_num_seqs=1, block_size=2, num_blocks=4,
           max_model_len=8, num_spec_tokens=1, prefix_caching=False, profile="vllm-0.34",
           streaming_sessions=True),
    (_session(2, 2, (1, 1)),),
    allow_abort=False, skip_targets=_SESSION_SKIPPED + ("session_holds_seat_for_input",),
)
# Prefix caching on (vLLM's default), two seats, a pool of 3 blocks of 2:
# the session (a prompt of 1 that stops after 2 outputs, then 2 new tokens
# and 1 output) caches a block of its prompt and first output, which its
# next turn keeps as prompt (`_update_request_as_session`); preempted by the
# plain request's decode, it looks up its whole prompt on readmission and
# hits that block (`session_hits_its_kept_outputs`), and the plain request
# (a prompt of one full block) looks up its own label beside it.
SESSION_CACHE_K2 = Model(
    "session-cache-k2",
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2, num_blocks=3,
           max_model_len=8, prefix_caching=True, profile="vllm-0.34", streaming_sessions=True),
    (_session(1, 2, (2, 1)), Prompt(2, 2, labels=(1,))),
    allow_abort=False, skip_targets=_SESSION_SKIPPED + ("session_holds_seat_for_input",),
)
_SESSION_MODELS = (SESSION_K2, SESSION_PRESSURE_K2, SESSION_DRAFTS_K2, SESSION_CACHE_K2)
SESSION_PROFILE_MODELS: dict[str, tuple[Model, ...]] = {
    profile: tuple(_under(m, profile) for m in _SESSION_MODELS)
    for profile in ("vllm-0.33", "vllm-0.33-async", "vllm-0.34", "vllm-0.34-async")
}

# Three requests, two seats, three batches in flight, a pool of 3 blocks of
# 2: the session (a prompt of 3, one output, then 1 new token and one
# output) is preempted by the first request's decode while its last prefill
# chunk is in flight (deliver-mode stale output), the third request is
# admitted past its deferred resumption, and the stale output's token stops
# the session: it parks beside two running requests and SS4 breaks, as it
# does in vLLM 0.33 and 0.34 (docs/request-states.md, "Finding: a session
# stopped while preempted counts a seat it gave up"). A finding's model,
# not one of the suite's: the search must find that violation.
SESSION_SEATS_K3 = Model(
    "session-seats-k3",
    Config(num_stages=3, max_num_batched_tokens=4, max_num_seqs=2, block_size=2, num_blocks=3,
           max_model_len=8, prefix_caching=False, profile="vllm-0.34", streaming_sessions=True),
    (Prompt(2, 2), _session(3, 1, (1, 1)), Prompt(1, 1)),
    allow_abort=False, skip_targets=_SESSION_SKIPPED + ("session_waits_with_old_output_in_flight",
                                                        "session_runs_beside_old_output"),   # not reached async
)
SESSION_FINDING_MODELS: dict[str, Model] = {
    profile: _under(SESSION_SEATS_K3, profile)
    for profile in ("vllm-0.33", "vllm-0.33-async", "vllm-0.34", "vllm-0.34-async")
}

_AT_PROFILE = {m.name.split("@")[0]: m for m in SESSION_PROFILE_MODELS[SESSION_PROFILE]}

# The session mutants (verification/mutants/sessions.py) and the model each
# is hunted on under SESSION_PROFILE.
SESSION_MUTANT_MODELS: dict[str, Model] = {
    "continuation_applied_while_running_pr52693": _AT_PROFILE["session-k2"],
    "turn_output_not_dropped_pr52765": _AT_PROFILE["session-k2"],
    "session_keeps_drafts_pr42655": _under(SESSION_DRAFTS_K2, SESSION_PROFILE),
    "stop_keeps_optimistic_tokens_omni5183": _AT_PROFILE["session-k2"],
    "waiting_session_seat_freed": _AT_PROFILE["session-k2"],
}


def session_mutant_model(name: str) -> Model:
    """The model the session mutant `name` is hunted on, with it applied."""
    return SESSION_MUTANT_MODELS[name].with_mutant(name)


# --- beside a KV connector (vLLM 0.34; 0.33 reads alike; docs/request-states.md,
# "Features together"): the connector's waiting loop skips a session waiting for
# input (`_handle_blocked_waiting_request`), counts its seat (`num_running` has
# `num_waiting_for_streaming_input`, so loads-only mode starts), and reserves
# nothing for it beside an async load (`_inflight_prefill_reserved_blocks` reads
# `_inflight_prefills` and `_parked_reservations` only). The connector offers a
# session once, at its first turn (contract C1): a later turn keeps its blocks.
_SESSION_KV_SKIPPED = _SESSION_SKIPPED + ("empty_batch_in_queue", "session_holds_seat_for_input",
                                          "session_waits_with_old_output_in_flight",
                                          "session_runs_beside_old_output")

# A session whose first turn loads its prompt asynchronously (the load may
# fail), then one more input, beside a plain request, two seats: the load
# parks, lands (or fails) and is promoted; the session stops, waits for input
# in `kv_holding_waiting` holding its blocks, and its next turn is admitted from
# them. Without the skip the loop admits the waiting session (S2 in 7 steps).
SESSION_KV_K2 = Model(
    "session-kv-k2",
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2, num_blocks=4,
           max_model_len=6, prefix_caching=False, profile="vllm-0.34", streaming_sessions=True,
           kv_connector=KvConnector()),
    (_session(2, 1, (1, 1), external_hit=2, load_async=True), Prompt(1, 1)),
    allow_stop=False, allow_abort=False, kv_failures=True, skip_targets=_SESSION_KV_SKIPPED,
)
# vLLM 0.34's load limit with one seat: the session parks for input holding the
# seat, so the loop runs in loads-only mode and starts the plain request's async
# load from `async_kv_waiting` beside it (the load may fail).
SESSION_KV_LIMIT_K2 = Model(
    "session-kv-limit-k2",
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=1, block_size=2, num_blocks=4,
           max_model_len=6, prefix_caching=False, profile="vllm-0.34", streaming_sessions=True,
           kv_connector=KvConnector(max_inflight_loads=1)),
    (_session(1, 1, (1, 1)), Prompt(2, 1, external_hit=2, load_async=True)),
    allow_stop=False, allow_abort=False, kv_failures=True, skip_targets=_SESSION_KV_SKIPPED,
)
SESSION_KV_MODELS = (SESSION_KV_K2, SESSION_KV_LIMIT_K2)
