"""LoRA adapters and the `max_loras` cap; and the prompt-logprobs limit on
the prefix cache (docs/request-states.md, "LoRA max_loras" and "Prompt
logprobs and the prefix cache").

What vLLM 0.33 and 0.34 do (`Scheduler.schedule`, both alike):

* With a `LoRAConfig` (`Scheduler.__init__`: `self.lora_config`), before the
  waiting loop the scheduler collects the LoRA ids of **every** running
  request, scheduled in this step or not (`scheduled_loras`, ids > 0: a
  request whose tokens are all in flight still holds its adapter's slot in
  the model runner) and asserts there are at most `max_loras`. There is no
  waiting loop in a call that preempted, so this is the running set as the
  running loop left it.
* The waiting loop passes over (`skip_request`: into the step's skipped
  queue and `deferred_waiting`; it keeps its place at the head side) a
  request whose LoRA is not among `scheduled_loras` while they already number
  `max_loras`. It tests this after the blocked-status and stale-output skips
  and before the prefix-cache lookup; it goes on with the requests behind.
  Each admission adds its request's LoRA to `scheduled_loras`.
* The prefix cache keys a block by its LoRA too (`generate_block_hash_extra_keys`
  puts the adapter's name in every block hash): requests of different LoRAs
  never share a cached block. Here that is the content labels' business:
  a model gives requests of different LoRAs different labels.

Prompt logprobs: a request that asks for prompt logprobs reads nothing from
the prefix cache, because the cache keeps KV, not the logits its prompt
positions need (0.33: `SamplingParams.skip_reading_prefix_cache` defaults to
True for it, and `KVCacheManager.prefix_cache_lookup_enabled` is False;
0.34: `Request.get_prefix_cache_hit_limit` is 0 for it, and
`prefix_cache_lookup_enabled` tests `prefix_cache_hit_limit != 0`). Its own
full blocks are still cached for others. A KV connector's offer is dropped
too, after the connector was asked (0.33: `skip_reading_prefix_cache`; 0.34:
`skip_reading_external_kv`, the limit not None; kv_loads.connector_offer),
with or without prefix caching. Beside a connector the cap is tested after
a landed load's promotion (`_handle_blocked_waiting_request` comes first)
and before the connector is asked (schedule.py
`_schedule_waiting_with_connector`).

The abstraction: a request's LoRA is an integer, 0 = none (`Request.lora`);
the adapter's slots, loading and rank are abstracted away (the cap is the
only scheduling rule they make). 0.34's `prompt_logprob_start`, which bounds
the hit instead of zeroing it, is not modelled: a prompt-logprobs request
here scores its whole prompt (`Request.prompt_logprobs`). A streaming
session's flag across turns: the input's under 0.34, the first input's
under 0.33 (`take_input_logprobs`).
"""

from __future__ import annotations

from dataclasses import replace

from .config import Config
from .state import Batch, State


def has_lora_cap(cfg: Config) -> bool:
    """Whether the scheduler has a `LoRAConfig` (`Config.max_loras` > 0)."""
    return cfg.max_loras > 0


def loras_of(state: State, requests: tuple[int, ...]) -> frozenset[int]:
    """The LoRAs (ids > 0) the given requests hold."""
    return frozenset(state.requests[r].lora for r in requests if state.requests[r].lora > 0)


def running_loras(state: State) -> frozenset[int]:
    """vLLM's `scheduled_loras` at the waiting loop: the LoRAs of the running requests."""
    return loras_of(state, state.running)


def held_by_lora_cap(state: State, cfg: Config, r: int, holders: tuple[int, ...]) -> bool:
    """The waiting loop's LoRA test: r needs a LoRA not among the holders'
    (the running requests: `schedule` passes `running`, which includes those
    admitted earlier in this very loop, as `scheduled_loras.add` does) while
    they already hold `max_loras` (vLLM skips it)."""
    lora = state.requests[r].lora
    if not has_lora_cap(cfg) or lora == 0:
        return False
    held = loras_of(state, holders)
    return len(held) == cfg.max_loras and lora not in held


def reads_prefix_cache(state: State, r: int) -> bool:
    """Whether r may read the prefix cache (a prompt-logprobs request may not)."""
    return not state.requests[r].prompt_logprobs


def arrive_with_lora(state: State, cfg: Config, r: int, lora: int, prompt_logprobs: bool) -> State:
    """An arrival's LoRA (kept only with a cap) and its prompt-logprobs flag
    (kept only with `Config.prompt_logprobs` and prefix caching or a KV
    connector, the two things it changes)."""
    if lora and has_lora_cap(cfg):
        state = state.with_request(r, lora=lora)
    keep = prompt_logprobs and cfg.prompt_logprobs and (cfg.prefix_caching or cfg.kv_connector is not None)
    return state.with_request(r, prompt_logprobs=True) if keep else state


def take_input_logprobs(state: State, cfg: Config, r: int, asks: bool) -> State:
    """Session r takes its next input (sessions.py `_take_input`), which asks
    for prompt logprobs or not. vLLM 0.34's `_update_request_as_session`
    recomputes `prefix_cache_hit_limit` from the input's sampling parameters
    (`Request.get_prefix_cache_hit_limit`): the flag is the input's (kept as
    an arrival's is, `arrive_with_lora`). 0.33's replaces the sampling
    parameters but not `Request.skip_reading_prefix_cache`, which
    `Request.__init__` set from the first input's
    (`get_skip_reading_prefix_cache`): the flag stays the first input's.
    The flag is read only at a lookup, and a session's next turn is admitted
    from its kept blocks without one (sessions.py): it counts once the turn
    is preempted and looks up its whole prompt again."""
    if not cfg.rules.session_input_sets_cache_limit:
        return state
    keep = asks and cfg.prompt_logprobs and (cfg.prefix_caching or cfg.kv_connector is not None)
    return state.with_request(r, prompt_logprobs=keep) if keep != state.requests[r].prompt_logprobs else state


# --- properties


def lora1_loras_within_cap(s: State, cfg: Config) -> bool:
    """LORA1: the running requests hold at most max_loras distinct LoRAs (vLLM's
    assert before the waiting loop), and so does every batch in flight."""
    if not has_lora_cap(cfg):
        return True
    return len(running_loras(s)) <= cfg.max_loras and all(
        _batch_loras(s, b) <= cfg.max_loras for b in s.in_flight)


def _batch_loras(s: State, batch: Batch) -> int:
    return len({s.requests[e.req].lora for e in batch if s.requests[e.req].lora > 0})


def held_requests(before: State, cfg: Config) -> tuple[int, ...]:
    """The waiting requests the cap holds for the whole of a schedule call:
    their LoRA is not among the running requests' and those are already at
    the cap before it (the set only grows within a call that admits)."""
    if not has_lora_cap(cfg):
        return ()
    loras = running_loras(before)
    if len(loras) < cfg.max_loras:
        return ()
    return tuple(w for w in before.waiting if before.requests[w].lora > 0 and before.requests[w].lora not in loras)


def held_while_later_runs(state: State, cfg: Config, r: int) -> bool:
    """Waiting request r is held by the cap while a request that arrived
    after it runs (it was passed over, and kept its place)."""
    return r in held_requests(state, cfg) and any(q > r for q in state.running)


def held_with_lora_in_flight(state: State, cfg: Config, r: int) -> bool:
    """Request r is held by the cap while every request holding the cap's
    LoRAs has nothing the next call could schedule (its token in flight, or,
    under async scheduling, its decode stagger pending): the cap counts it all the same."""
    holders = [q for q in state.running if state.requests[q].lora > 0]
    return (r in held_requests(state, cfg) and bool(holders)
            and all(state.num_new_tokens(q) == 0 or state.requests[q].decode_countdown > 1 for q in holders))


def without_waiting(state: State, w: int) -> State:
    """`state` with w left out of the waiting queue (the second computation of LORA2)."""
    return replace(state, waiting=tuple(x for x in state.waiting if x != w))
