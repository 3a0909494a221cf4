"""The transition properties of LoRA's `max_loras` cap and of the
prompt-logprobs limit (spec/lora.py), each on one schedule call and stated
against something other than the rule the spec runs: LORA2 against a second
`schedule` call without the held request, PL1 against the entries' own
cached counts.

Abstracted away: what lora.py abstracts away.
"""

from __future__ import annotations

from .admission_order import is_reorder_in_force
from .config import Config
from .lora import held_requests, without_waiting
from .schedule import Scheduled, schedule
from .state import State


def _admitted(before: State, scheduled: Scheduled) -> tuple[tuple[int, int, int], ...]:
    """The entries of requests that were waiting before the call: (request, tokens, hit)."""
    waiting = set(before.waiting) | set(before.kv_holding)
    return tuple((e.req, e.n, e.cached) for e in scheduled.entries if e.req in waiting)


def lora2_held_request_is_passed_over(before: State, scheduled: Scheduled, cfg: Config) -> bool:
    """LORA2: a waiting request whose LoRA the cap cannot take is passed
    over, not a stop: it stays waiting, and the call admits exactly what it
    admits with that request out of the queue. (Not stated under vLLM 0.34's
    cache-aware order when it is in force: the held request's place in the
    reordered window is part of the order, so leaving it out is no second
    computation of the same walk.)"""
    if (not scheduled.entries and not scheduled.preempted) or is_reorder_in_force(before, cfg):
        return True
    admitted = _admitted(before, scheduled)
    for w in held_requests(before, cfg):
        if w not in scheduled.state.waiting:
            return False
        alone = schedule(without_waiting(before, w), cfg)
        if (alone is None and admitted) or (alone is not None and _admitted(before, alone) != admitted):
            return False
    return True


def pl1_prompt_logprobs_read_no_cache(before: State, scheduled: Scheduled, cfg: Config) -> bool:
    """PL1: a request that asks for prompt logprobs is admitted with no prefix-cache hit and no KV connector load: its entry starts at token 0 and counts nothing cached, and it never parks for an async load. (A streaming session's next turn, admitted from the blocks it kept over its stop, looks nothing up: only an admission from no computed tokens is one.)"""
    waiting = before.waiting_set | before.kv_holding_set
    return (all(e.cached == 0 and e.start == 0 for e in scheduled.entries
                if before.requests[e.req].prompt_logprobs and e.req in waiting
                and before.requests[e.req].num_computed == 0)
            and not any(before.requests[r].prompt_logprobs for r, _ in scheduled.kv_loads))
