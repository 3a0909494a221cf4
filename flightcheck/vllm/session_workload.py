"""A replay workload's streaming sessions (docs/request-states.md,
"Streaming sessions"; vLLM 0.33 and 0.34): a request's `session` key.

    {"id": "s0", "prompt_len": 6, "max_tokens": 2,
     "session": {"inputs": [{"step": 5, "tokens": 3, "max_tokens": 2}], "end_step": 9}}
    {"id": "s1", "prompt_len": 4, "max_tokens": 1,
     "session": {"inputs": [{"step": 3, "tokens": 2, "max_tokens": 1}], "client_ends": false}}

The request is resumable: each stop (EOS, or the turn's `max_tokens`; the
first turn's is the request's) ends a turn. Each input is sent at engine
step `step` as vLLM's front end sends one, an `add_request` of a resumable
request under the session's id, with `tokens` new prompt tokens (drawn from
the seed) and the next turn's `max_tokens` (and `"prompt_logprobs": true`
when its sampling params ask for prompt logprobs, lora_workload.py); at `end_step` (default: one step
after the last input) the end of the session, an `add_request` under the id
of a request that is not resumable. With `"client_ends": false` (default
true; no `end_step` then) the client goes away after its last input and
never sends the end: the session parks in WAITING_FOR_STREAMING_REQ after
its last turn and stays there when the run ends (vLLM 0.33/0.34
`get_num_unfinished_requests` leaves it out, so the engine stops stepping
for it: the run ends `done` with the session parked, the client's wait,
not a stall; run_endings.py). An input sent after the session has
finished names a new request: the generator never aborts a session before
its inputs, but beside grammars a session whose grammar fails finishes with
an error before they arrive, and they then name new requests under its id
(docs/request-states.md, "Features together").

Standard library only.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from .workload_limits import MAX_PROMPT_LEN, LimitError, flag, show, whole

MAX_SESSION_INPUTS = 64


class SessionWorkloadError(LimitError):
    pass


@dataclass(frozen=True)
class SessionInput:
    step: int                            # the engine step it is sent at
    prompt_token_ids: tuple[int, ...]    # its new tokens; () for the end of the session
    max_tokens: int                      # the next turn's
    prompt_logprobs: bool = False        # its sampling params ask for prompt logprobs (lora_workload.py)

    @property
    def ends_session(self) -> bool:
        return not self.prompt_token_ids


def session_from_json(raw: Any, where: str, seed: int, req_id: str, vocab: tuple[int, int]) -> tuple[SessionInput, ...]:
    """A request's `session` (None: not a session), validated; the end of
    the session last, unless its client never sends it (`client_ends`)."""
    if raw is None:
        return ()
    if not isinstance(raw, dict) or set(raw) - {"inputs", "end_step", "client_ends"}:
        raise SessionWorkloadError(f"{where}: must be an object with 'inputs' and optionally 'end_step' or "
                                   f"'client_ends', got {show(raw)}")
    inputs = raw.get("inputs", [])
    if not isinstance(inputs, list) or len(inputs) > MAX_SESSION_INPUTS:
        raise SessionWorkloadError(f"{where}.inputs: must be a list of at most {MAX_SESSION_INPUTS} inputs")
    found: list[SessionInput] = []
    for i, item in enumerate(inputs):
        at = f"{where}.inputs[{i}]"
        if not isinstance(item, dict) or set(item) - {"step", "tokens", "max_tokens", "prompt_logprobs"}:
            raise SessionWorkloadError(f"{at}: must be an object with step, tokens, max_tokens and optionally "
                                       f"prompt_logprobs")
        try:
            step = whole(f"{at}.step", item.get("step"), 0, 10**6)
            n = whole(f"{at}.tokens", item.get("tokens"), 1, MAX_PROMPT_LEN)
            max_tokens = whole(f"{at}.max_tokens", item.get("max_tokens", 1), 1, MAX_PROMPT_LEN)
            logprobs = flag(f"{at}.prompt_logprobs", item.get("prompt_logprobs", False))
        except LimitError as err:
            raise SessionWorkloadError(str(err)) from None
        rng = random.Random(f"{seed}/session/{req_id}/{i}")
        found.append(SessionInput(step, tuple(rng.randrange(*vocab) for _ in range(n)), max_tokens, logprobs))
    last = found[-1].step if found else 0
    if not _client_ends(raw, where):
        return tuple(found)
    try:
        end = whole(f"{where}.end_step", raw.get("end_step", last + 1), 0, 10**6)
    except LimitError as err:
        raise SessionWorkloadError(str(err)) from None
    if any(b.step < a.step for a, b in zip(found, found[1:])) or end < last:
        raise SessionWorkloadError(f"{where}: inputs and the end must come in step order")
    return tuple(found) + (SessionInput(end, (), 1),)


def _client_ends(raw: dict[str, Any], where: str) -> bool:
    """Whether the session's client sends the end of the session
    (`client_ends`, default true); one that never does names no `end_step`."""
    try:
        ends = flag(f"{where}.client_ends", raw.get("client_ends", True))
    except LimitError as err:
        raise SessionWorkloadError(str(err)) from None
    if not ends and "end_step" in raw:
        raise SessionWorkloadError(f"{where}: a session whose client never ends it ('client_ends': false) "
                                   f"has no 'end_step'")
    return ends
