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

from flightcheck.spec import Config, Prompt
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


def _session(prompt_len: int, max_tokens: int, *inputs: tuple[int, int]) -> Prompt:
    """A session's first prompt, then its client's inputs; the end of the session last."""
    return Prompt(prompt_len, max_tokens, session=inputs + ((0, 0),))


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
