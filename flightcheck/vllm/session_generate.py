"""Streaming sessions in generated workloads (`--all-features`): the seed's
plain workload with one or two of its requests turned into sessions
(session_workload.py's `session` key): each sends one to three more inputs
(1 to 8 new tokens, the next turn stopping after 1 to 4 outputs) at engine
steps after its arrival, then the end of the session, except that one
session in `CLIENT_GOES_AWAY_ONE_IN` never gets its end (its client goes
away, `client_ends: false`). A session request
keeps no abort (an input sent after it would name a new request) and no id
another request reuses. Prefix caching stays the seed's choice (on or off,
generate.py; vLLM's default is on): a turn's kept outputs become prompt
blocks, which the spec labels as the session's own (spec/state.py
`content_label`) and vLLM hashes from the same tokens.

`FEATURE` is registered in features.FEATURE_MODULES (`--all-features`) and
excludes nothing, and nothing excludes it: it meets prompt logprobs (a later
input may ask for them: lora_workload.py), a KV connector in one workload in
two (the connector is asked at a session's first turn
only, a later turn keeps its blocks; an input sent while the session's
finished request is held for a transfer is lost in vLLM, a finding:
docs/vllm-kv-connector-findings.md), drafts, the cache-aware admission
order (with prefix caching), the priority policy, grammars (a structured
session keeps its grammar and FSM across turns; a session whose grammar
fails finishes before its inputs, which then name new requests) and reset
and pause (PAUSED_NEW admits a session's next turn; a reset of the running
requests raises while a session holds blocks between turns, a finding):
docs/request-states.md, "Features together". Every workload left open to
it gets it (share 1).

Standard library only.
"""

from __future__ import annotations

import random
from typing import Any, Protocol, Sequence, TypeVar

from .features import Feature

T = TypeVar("T")


# One session in this many has a client that never sends the end of the
# session: real clients abandon sessions, and a run that ends with a session
# parked in WAITING_FOR_STREAMING_REQ is where the ground truth and
# check-trace may read the end differently (vLLM 0.33/0.34
# `get_num_unfinished_requests` leaves parked sessions out, so the engine
# stops stepping for them). Small, so that most sessions still reach their end
# and what follows it. Drawn from its own stream (`_client_goes_away`), so a
# seed's other choices stay what they were before the share came (0: every
# client ends its session, the workloads as drawn before the share:
# tests/vllm_support.py `drawn_before_clients_went_away`).
CLIENT_GOES_AWAY_ONE_IN = 8


class Picker(Protocol):                        # generate.Picker
    def integer(self, low: int, high: int) -> int: ...

    def choice(self, options: Sequence[T]) -> T: ...


def declines(workload: dict[str, Any]) -> bool:
    """Whether sessions pass over `workload`: a KV connector's, of an even
    seed (no draw, so every other workload draws as before)."""
    return "kv_connector" in workload["config"] and workload["seed"] % 2 == 0


def with_sessions(pick: Picker, workload: dict[str, Any]) -> bool | None:
    """Turn one or two requests of `workload` into streaming sessions, in place.
    Beside a KV connector one time in two only (`declines`: False, the
    workload as it was while the pair was excluded), so that half the
    connector's workloads still meet its other features as they were drawn."""
    if declines(workload):
        return False
    requests = workload["requests"]
    reused = {r.get("reuse_id") for r in requests}
    candidates = [r for r in requests if r.get("reuse_id") is None and r.get("id") not in reused]
    if not candidates:
        return
    for _ in range(min(len(candidates), pick.integer(1, 2))):
        request = pick.choice(candidates)
        candidates.remove(request)
        request.pop("abort_step", None)
        request.pop("abort_via", None)
        step, inputs = request.get("arrival_step", 0), []
        # the session's most tokens stay below max_model_len (vLLM does not check them: a finding,
        # docs/request-states.md); the prompt given by its token ids or its length
        room = workload["config"]["max_model_len"] - 1 - len(request.get("prompt_token_ids", ())) \
            - request.get("prompt_len", 0) - request.get("max_tokens", 16)
        for _ in range(pick.integer(1, 3)):
            tokens, max_tokens = pick.integer(1, 8), pick.integer(1, 4)
            if tokens + max_tokens > room:
                break
            room -= tokens + max_tokens
            step += pick.integer(1, 12)
            inputs.append({"step": step, "tokens": tokens, "max_tokens": max_tokens})
        end_step = step + pick.integer(1, 10)
        request["session"] = {"inputs": inputs, **({"client_ends": False} if _client_goes_away(workload, request)
                                                   else {"end_step": end_step})}


def _client_goes_away(workload: dict[str, Any], request: dict[str, Any]) -> bool:
    """Whether the session's client never sends its end: one time in
    `CLIENT_GOES_AWAY_ONE_IN`, from a stream of the workload's seed and the
    request's id alone (not `pick`: every other draw stays as it was)."""
    return CLIENT_GOES_AWAY_ONE_IN > 0 and random.Random(
        f"{workload['seed']}/client-goes-away/{request.get('id')}").randrange(CLIENT_GOES_AWAY_ONE_IN) == 0


FEATURE = Feature("streaming-sessions", ("0.33.0", "0.34.0"), 1.0, with_sessions)
