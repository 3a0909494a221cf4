""""Sometimes" properties: states (or two-stage paths) the spec must be able
to reach. A spec whose guards are too strong passes every invariant
vacuously; these targets make that fail loudly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import cadence, lora
from .blocks import cdiv
from .config import Config
from .session_invariants import (finished_after_a_later_turn, kept_output_cached_for_its_lookup,
                                 runs_beside_old_output, seat_held_for_input, waits_with_old_output_in_flight)
from .state import State, Status

RequestPredicate = Callable[[State, Config, int], bool]
StepPredicate = Callable[[State, State, object, Config, int], bool]


def finished_normally(s: State, cfg: Config, r: int) -> bool:
    """Request r finished by a stop token or its length cap."""
    return s.requests[r].status in (Status.FINISHED_STOPPED, Status.FINISHED_LENGTH)


def pipeline_full(s: State, cfg: Config, r: int) -> bool:
    """K batches are in flight at once."""
    return len(s.in_flight) == cfg.num_stages


def two_prefill_chunks_in_flight(s: State, cfg: Config, r: int) -> bool:
    """Request r has two live entries in flight, the older a non-final prefill chunk."""
    live = s.entries_of(r)
    return len(live) >= 2 and not live[0].samples


def preempted(s: State, cfg: Config, r: int) -> bool:
    """Request r is PREEMPTED."""
    return s.requests[r].status is Status.PREEMPTED


def duplicate_cached_block(s: State, cfg: Config, r: int) -> bool:
    """Two blocks cache the same label (vLLM 0.8.x keeps both copies)."""
    return bool(s.pool.duplicates)


def preallocated_block(s: State, cfg: Config, r: int) -> bool:
    """Request r holds a block beyond any its known tokens and drafts can fill (taken ahead of need)."""
    q = s.requests[r]
    return len(q.block_table) > cdiv(q.num_tokens + cfg.num_spec_tokens, cfg.block_size)


def resumption_deferred(s: State, cfg: Config, r: int) -> bool:
    """Preempted request r waits with a free seat while its stale output is in flight: its resumption is deferred."""
    from .schedule import _is_resumption_deferred
    return (s.requests[r].status is Status.PREEMPTED and len(s.running) < cfg.max_num_seqs
            and _is_resumption_deferred(s, cfg, r))


def stale_output_delivered(before: State, after: State, action: object, cfg: Config, r: int) -> bool:
    """A completion appends a stale output to request r while it is PREEMPTED."""
    return (before.requests[r].status is Status.PREEMPTED
            and after.requests[r].num_output > before.requests[r].num_output)


def only_on_a_step(s: State, cfg: Config, r: int) -> bool:
    """No state alone: the target is a transition (`Sometimes.on_step`)."""
    return False


def name_reused_in_flight(s: State, cfg: Config, r: int) -> bool:
    """Request r holds a reused name while a batch of the name's earlier holder is in flight."""
    name = s.requests[r].name
    return (name is not None and s.requests[r].status.is_active
            and any(e.lookup_name == name and e.req != r for b in s.in_flight for e in b))


def empty_batch_in_queue(s: State, cfg: Config, r: int) -> bool:
    """An empty batch takes a queue slot."""
    return any(not b for b in s.in_flight)


def decode_behind_decode(s: State, cfg: Config, r: int) -> bool:
    """Async: request r's decode was scheduled while its previous decode is still in flight (two live sampling entries)."""
    return sum(1 for e in s.entries_of(r) if e.samples) >= 2


def stopped_with_output_in_flight(s: State, cfg: Config, r: int) -> bool:
    """Async: request r finished by a stop token with a later decode still in flight (its output will be dropped)."""
    return (s.requests[r].status is Status.FINISHED_STOPPED
            and any(e.samples for e in s.entries_of(r, fate=None)))


@dataclass(frozen=True)
class Sometimes:
    """Some reachable state satisfies `target` for some request; if `after` is
    given, on a path that passed through a state satisfying `after` for the
    same request first."""

    name: str
    target: RequestPredicate
    after: RequestPredicate | None = None
    needs: str | None = None          # a config feature the target needs to be meaningful
    # instead of `target`: reached on a transition (before, after, action, cfg, r)
    on_step: StepPredicate | None = None

    @property
    def statement(self) -> str:
        first = f"{(self.after.__doc__ or '').strip()} and later: " if self.after else ""
        return first + ((self.on_step or self.target).__doc__ or "").strip()

    def is_applicable(self, cfg: Config, shares_prefix: bool = False) -> bool:
        """Whether the target is meaningful for `cfg`; `shares_prefix`: the
        model's prompts share a prefix label (a duplicate needs two requests
        computing one content; callers that do not know the prompts leave it
        False and skip that target)."""
        if self.needs == "pipeline":
            return cfg.num_stages >= 2
        if self.needs == "continue_prefill":
            return cfg.num_stages >= 2 and cfg.continue_prefill
        if self.needs == "duplicate_caching":
            return cfg.prefix_caching and cfg.cache_duplicate_blocks and shares_prefix
        if self.needs == "preallocation":
            return cfg.num_preallocate_tokens > 0
        if self.needs == "deferral":
            return (cfg.num_stages >= 2 and cfg.rules.stale_output_counters
                    and cfg.rules.defer_resume_while_stale and cfg.stale_mode == "deliver")
        if self.needs == "stale_delivery":
            return cfg.num_stages >= 2 and cfg.rules.stale_output_counters and cfg.stale_mode == "deliver"
        if self.needs == "name_reuse":
            return cfg.num_stages >= 2 and cfg.allow_name_reuse and cfg.rules.stale_output_counters
        if self.needs == "empty_batches":
            return cfg.rules.empty_batches
        if self.needs == "async":
            return cfg.rules.output_placeholders and cfg.queue_depth > cfg.stagger
        if self.needs == "prefix_caching":
            return cfg.prefix_caching
        return _kv_applicable(self.needs, cfg)


SOMETIMES: tuple[Sometimes, ...] = (
    Sometimes("request_can_finish", finished_normally),
    Sometimes("pipeline_can_be_full", pipeline_full, needs="pipeline"),
    Sometimes("two_prefill_chunks_in_flight", two_prefill_chunks_in_flight, needs="continue_prefill"),
    Sometimes("preempted_request_resumes_and_finishes", finished_normally, after=preempted),
    Sometimes("duplicate_cached_block", duplicate_cached_block, needs="duplicate_caching"),
    Sometimes("preallocated_block", preallocated_block, needs="preallocation"),
    Sometimes("resumption_deferred", resumption_deferred, needs="deferral"),
    Sometimes("stale_output_delivered", only_on_a_step, needs="stale_delivery",
              on_step=stale_output_delivered),
    Sometimes("name_reused_in_flight", name_reused_in_flight, needs="name_reuse"),
    Sometimes("empty_batch_in_queue", empty_batch_in_queue, needs="empty_batches"),
)

# The targets of asynchronous scheduling (profile vllm-0.33-async), kept apart
# from SOMETIMES (every profile's) as the profile's invariants are; their Z3
# cover formulas are verification/z3/encoding/invariants.py ASYNC_SOMETIMES_FORMULAS.
ASYNC_SOMETIMES: tuple[Sometimes, ...] = (
    Sometimes("decode_behind_decode", decode_behind_decode, needs="async"),
    Sometimes("stopped_with_output_in_flight", stopped_with_output_in_flight, needs="async"),
)


# The targets of a KV connector (docs/kv-connector.md), each where the
# profile and the connector have the feature: a model with a connector
# offers an async load, fences with K >= 2, and holds a send as a producer.
def parked_for_load(s: State, cfg: Config, r: int) -> bool:
    """Request r waits for its async KV load (WAITING_FOR_REMOTE_KVS)."""
    return s.requests[r].status is Status.WAITING_FOR_REMOTE_KVS


def running(s: State, cfg: Config, r: int) -> bool:
    """Request r is RUNNING."""
    return s.requests[r].status is Status.RUNNING


def blocks_put_aside(s: State, cfg: Config, r: int) -> bool:
    """A freed table waits behind the step fence (a deferred free)."""
    return bool(s.deferred_frees)


def held_for_send(s: State, cfg: Config, r: int) -> bool:
    """Finished request r keeps its blocks for a KV send."""
    q = s.requests[r]
    return q.status.is_finished and q.held and not q.load.in_transfer


def _kv_applicable(needs: str | None, cfg: Config) -> bool:
    kv = cfg.kv_connector
    if needs == "kv_async":
        return kv is not None and kv.consumer and cfg.rules.kv_async_loads
    if needs == "kv_fence":
        return cfg.fences_freed_blocks
    if needs == "kv_send":
        return kv is not None and kv.producer and cfg.rules.kv_send_hold
    return True


KV_SOMETIMES: tuple[Sometimes, ...] = (
    Sometimes("load_lands_and_runs", running, after=parked_for_load, needs="kv_async"),
    Sometimes("blocks_freed_behind_fence", blocks_put_aside, needs="kv_fence"),
    Sometimes("held_for_send", held_for_send, needs="kv_send"),
)


# The targets of streaming sessions (spec/sessions.py; predicates in session_invariants.py).
SESSION_SOMETIMES: tuple[Sometimes, ...] = (
    # only under async scheduling: a synchronous engine schedules a
    # request's next token only once its output is back, so a stop leaves
    # nothing of the turn in flight
    Sometimes("session_waits_with_old_output_in_flight", waits_with_old_output_in_flight, needs="async"),
    Sometimes("session_runs_beside_old_output", runs_beside_old_output, needs="async"),
    Sometimes("session_holds_seat_for_input", seat_held_for_input),
    Sometimes("session_finishes_in_a_later_turn", finished_after_a_later_turn),
    # with prefix caching: a turn's kept outputs are prompt blocks its lookup hits
    Sometimes("session_hits_its_kept_outputs", kept_output_cached_for_its_lookup, needs="prefix_caching"),
)


# The targets of the prefill cadence (spec/cadence.py; predicates there).
CADENCE_SOMETIMES: tuple[Sometimes, ...] = (
    Sometimes("prefill_held_for_a_decode", cadence.prefill_held),
    Sometimes("prefill_held_with_nothing_to_run", cadence.held_with_nothing_to_run, needs="pipeline"),
    Sometimes("backed_up_queue_released", cadence.backed_up_release),
)


# The prefill cadence beside a KV connector (spec/cadence.py; transitions there).
CADENCE_KV_SOMETIMES: tuple[Sometimes, ...] = (
    Sometimes("load_parked_while_held", only_on_a_step, on_step=cadence.load_parked_while_held),
    Sometimes("landed_load_held", only_on_a_step, on_step=cadence.landed_load_held),
    Sometimes("one_token_load_admitted_while_held", only_on_a_step,
              on_step=cadence.one_token_load_admitted_while_held),
)


# The targets of LoRA's cap (spec/lora.py; predicates there).
LORA_SOMETIMES: tuple[Sometimes, ...] = (
    Sometimes("lora_request_passed_over", lora.held_while_later_runs),
    Sometimes("lora_held_while_its_holder_is_in_flight", lora.held_with_lora_in_flight, needs="pipeline"),
)


def sometimes_for(cfg: Config) -> tuple[Sometimes, ...]:
    """The targets of cfg's profile: every profile's, under async scheduling
    ASYNC_SOMETIMES, with a KV connector KV_SOMETIMES, and with streaming
    sessions SESSION_SOMETIMES, with the prefill cadence CADENCE_SOMETIMES
    (and CADENCE_KV_SOMETIMES beside a connector), with a LoRA cap LORA_SOMETIMES."""
    from .sessions import has_sessions
    return (SOMETIMES + (ASYNC_SOMETIMES if cfg.rules.output_placeholders else ())
            + (KV_SOMETIMES if cfg.kv_connector is not None else ())
            + (SESSION_SOMETIMES if has_sessions(cfg) else ())
            + (CADENCE_SOMETIMES if cadence.is_on(cfg) else ())
            + (CADENCE_KV_SOMETIMES if cadence.is_on(cfg) and cfg.kv_connector is not None else ())
            + (LORA_SOMETIMES if lora.has_lora_cap(cfg) else ()))
