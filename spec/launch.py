"""What forming a batch writes into the state besides the batch itself.

Each scheduled request's entry (`ScheduledEntry`, as the trace format writes
it) becomes an in-flight `Entry` (`snapshot`: the pre-batch counts, the name
its output will be looked up by); under vLLM 0.33's counters every scheduled
request counts its tokens in flight (`count_in_flight`), and under async
scheduling a sampling entry adds its output placeholders and starts the
decode stagger (`add_placeholders`); every `schedule` call first brings each
request one call nearer the end of its stagger (`count_down`).

Abstracted away: the worker-side input batch these counts feed (the spec
sees only the counts), and `current_step` itself (a countdown per request
stands for it: `count_down`).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import grammar
from .config import Config
from .drafts import placeholder_drafts
from .state import Entry, State


@dataclass(frozen=True)
class ScheduledEntry:
    """What the batch records for one request, as the trace format writes it."""

    req: int
    start: int
    n: int
    cached: int                 # prefix-cache hit, for an admission or resumption
    drafts: int
    samples: bool
    block_ids: tuple[int, ...]  # blocks appended to the request's table
    external: int = 0           # tokens of `cached` a synchronous KV connector load brings



def count_down(state: State, cfg: Config) -> State:
    """vLLM 0.33 `Scheduler.schedule` begins with `current_step += 1`, which
    brings every request one call nearer its `next_decode_eligible_step`.

    The abstraction: vLLM compares `current_step` (unbounded) with
    `next_decode_eligible_step = s + stagger`, set when the request's last
    sampling entry was scheduled at call s. Only `current_step - s` matters,
    and only whether it is below the stagger; past the stagger every value
    behaves alike. So a countdown `max(0, stagger - (current_step - s))`,
    set to the stagger by the sampling entry and decremented (floored at 0)
    at the start of every call, empty ones included, skips exactly the calls
    vLLM skips, in 0..stagger. It is not reset by preemption (vLLM keeps
    `next_decode_eligible_step`), and a new request starts at 0 (vLLM's 0)."""
    if not cfg.stagger:
        return state
    for r, q in enumerate(state.requests):
        if q.decode_countdown > 0:
            state = state.with_request(r, decode_countdown=q.decode_countdown - 1)
    return state


def snapshot(state: State, cfg: Config, e: ScheduledEntry) -> Entry:
    """The in-flight entry for e, with the name its output will be looked up
    by, a sync load's external tokens, (under the step fence) the blocks it
    writes, and a streaming session's turn (sessions.py)."""
    return Entry(e.req, e.start, e.n, e.samples, e.drafts, name=state.requests[e.req].name,
                 external=e.external, blocks=state.requests[e.req].block_table if cfg.fences_freed_blocks else (),
                 mask=grammar.mask_of(state, cfg, e.req, e.samples, e.drafts),
                 turn=state.requests[e.req].turn)


def count_in_flight(state: State, cfg: Config, e: ScheduledEntry) -> State:
    """vLLM 0.33 `Scheduler._update_after_schedule`: `num_in_flight_tokens += n`
    for every scheduled request. 0.8.x: no counter. Under async scheduling,
    `AsyncScheduler._update_after_schedule` too (`add_placeholders`)."""
    if not cfg.rules.stale_output_counters:
        return state
    state = state.with_request(e.req, num_in_flight=state.requests[e.req].num_in_flight + e.n)
    return add_placeholders(state, cfg, e)


def add_placeholders(state: State, cfg: Config, e: ScheduledEntry) -> State:
    """`AsyncScheduler._update_after_schedule`: an entry that is not a prefill
    chunk (`is_prefill_chunk` = num_computed < num_tokens + placeholders after
    the update; here `e.samples`, the same test) adds `1 + #drafts scheduled`
    placeholders and, with the V2 runner, makes the request wait the stagger
    (`next_decode_eligible_step = current_step + decode_stagger`)."""
    if not cfg.rules.output_placeholders or not e.samples:
        return state
    req = state.requests[e.req]
    drafts = placeholder_drafts(cfg)           # k placeholder drafts for its next step (drafts.py)
    return state.with_request(e.req, placeholders=req.placeholders + 1 + e.drafts,
                              decode_countdown=cfg.stagger,
                              num_drafts=req.num_drafts if drafts is None else drafts)
