"""The streaming-session models the Z3 engines check (kv_engines.py with
the session formulas of encoding/session_invariants.py): small enough that
the cross-check compares the encoding with the spec on every reachable
state (tests/test_z3_sessions.py).

SESSION_SOLO (vLLM 0.34, K = 2, one seat): the session of the explicit
model session-k2 alone (a prompt of 2 that stops by 2 outputs, then 1 new
token and 2 outputs, then the end of the session), aborts and stop tokens
on. k-induction proves SS2-SS4 on it and SS1 follows in one step.

SESSION_K2 (the explicit model session-k2 under vLLM 0.34, and under
vllm-0.34-async for the mutants): the session beside a plain request; the
cross-check covers every reachable state of it, BMC bounds SS2-SS4 on it,
the session mutants are hunted on it by BMC, and k-induction proves
SS2-SS4 on it under the sync profiles with SA10 among the auxiliary
invariants (two batches in flight at most: a session preempted with
deliver-mode stale output leaves its seat free until that output returns;
tests/test_z3_sessions_seats.py). Under async scheduling (three batches)
SA10 does not apply and SS4 beside a second request stays unproved by
k-induction (docs/proofs.md, "Streaming sessions").
"""

from __future__ import annotations

from dataclasses import replace

from flightcheck.verification.models import Model
from flightcheck.verification.session_models import SESSION_MUTANT_MODELS, SESSION_PROFILE_MODELS

SESSION_K2 = SESSION_PROFILE_MODELS["vllm-0.34"][0]
SESSION_K2_ASYNC = SESSION_PROFILE_MODELS["vllm-0.34-async"][0]

SESSION_SOLO = replace(SESSION_K2, name="session-solo-k2@vllm-0.34", prompts=SESSION_K2.prompts[:1])
SESSION_SOLO_ASYNC = replace(SESSION_K2_ASYNC, name="session-solo-k2@vllm-0.34-async",
                             prompts=SESSION_K2_ASYNC.prompts[:1])

SESSION_Z3_MODELS: tuple[Model, ...] = (SESSION_SOLO, SESSION_K2)


def session_solo(profile: str) -> Model:
    """session-solo-k2 under `profile` (a profile with streaming sessions)."""
    from flightcheck.verification.z3.profiles import profile_model
    if profile == SESSION_SOLO.cfg.profile:
        return SESSION_SOLO
    return replace(profile_model(SESSION_SOLO, profile), name=f"session-solo-k2@{profile}")

def session_z3_mutant_model(name: str, solo: bool = False) -> Model:
    """The model BMC hunts session mutant `name` on: session-k2 as the
    explicit search does, or (`solo`) the session alone, under the same profile."""
    model = SESSION_MUTANT_MODELS[name]
    if solo:
        model = replace(model, name=model.name.replace("session-k2", "session-solo-k2"), prompts=model.prompts[:1])
    return model.with_mutant(name)


# The priority policy beside sessions (docs/proofs.md, "Streaming sessions",
# SS5): two sessions of one turn each (a prompt of 1 and 1 output, then 1
# new token and 1 output, then the end of the session), K = 1, two seats, 4
# blocks of 2, under vllm-0.34 (and vllm-0.33: `prio_sessions`; synchronous,
# as the priority encoding is).
# PRIO_SESSIONS_BREAK gives both priority 0: the explicit search breaks SS5
# there in 5 steps (a parked session's input re-keys `kv_holding` in place,
# vLLM's heap break), and the encoding refuses it. PRIO_SESSIONS gives them
# priorities 0 and 1, each its own: an input then never reorders a queue
# (encoding/priority_state.py), and k-induction proves SS5 on it.
def _prio_sessions(name: str, priorities: tuple[int, int]) -> Model:
    from flightcheck.spec import Config, Prompt
    cfg = Config(num_stages=1, max_num_batched_tokens=4, max_num_seqs=2, block_size=2, num_blocks=4, max_model_len=8,
                 prefix_caching=False, profile="vllm-0.34", streaming_sessions=True, scheduling_policy="priority")
    prompts = tuple(Prompt(1, 1, session=((1, 1), (0, 0)), priority=p) for p in priorities)
    model = Model(name, cfg, prompts, allow_abort=False, skip_targets=())
    return replace(model.under_profile("vllm-0.34"), name=f"{name}@vllm-0.34")


PRIO_SESSIONS = _prio_sessions("prio-sessions-k1", (0, 1))
PRIO_SESSIONS_BREAK = _prio_sessions("prio-two-sessions-k1", (0, 0))


def prio_sessions(profile: str) -> Model:
    """PRIO_SESSIONS under `profile` (vllm-0.34 or vllm-0.33)."""
    if profile == PRIO_SESSIONS.cfg.profile:
        return PRIO_SESSIONS
    return replace(PRIO_SESSIONS.under_profile(profile), name=f"prio-sessions-k1@{profile}")
