"""The spec's actions besides `schedule`: `arrive`, `complete_oldest`, `abort`.

Each action is a function of the state, the configuration and the
environment's choices; guards come first and a disabled action returns None.

`complete_oldest` consumes the head of the in-flight FIFO (batches complete
in the order they were scheduled: every pipeline stage runs them FIFO). Each
entry's output is applied according to its fate:
* LIVE: sampled tokens appended, spec-decode rejections subtracted from
  num_computed, stop conditions checked after each token;
* ORPHANED (request preempted after this batch was scheduled, not since
  rescheduled): tokens appended, num_computed untouched (the recompute after
  resumption includes them), the request may finish while PREEMPTED;
* SUPERSEDED: dropped.

Abstracted away: token values (the environment says only whether and where a
stop token was sampled), logprobs, stop strings (the front end turns them
into aborts, which `abort` covers), and the detokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import blocks, cadence, grammar, sessions
from .config import Config
from .drafts import drafts_come_with_output
from .kv_fence import drain_deferred_frees, drain_error_frees, finish_with_connector
from .lora import arrive_with_lora
from .priority import arrive_with_priority
from .schedule import Scheduled, schedule  # noqa: F401  (re-exported: the fourth action)
from .state import Entry, Fate, Grammar, Request, State, Status, content_label, evolve, holder_of, name_of, retire_entries


@dataclass(frozen=True)
class Prompt:
    """An arrival's prompt, chosen by the environment."""

    prompt_len: int
    max_tokens: int
    labels: tuple[int, ...] = ()   # one content label per full block; shared prefix = shared labels
    # What a KV connector offers this request (docs/kv-connector.md; read
    # only with `Config.kv_connector`): tokens beyond its local prefix hit,
    # and whether they load asynchronously (`get_num_new_matched_tokens`).
    external_hit: int = 0
    load_async: bool = False
    # vLLM's `Request.priority` (read only under `Config.scheduling_policy` "priority").
    priority: int = 0
    # Structured output (grammar.py; read only with `Config.structured_output`).
    structured: bool = False
    # A streaming session (spec/sessions.py; read only with
    # `Config.streaming_sessions`): the inputs its client sends after this
    # prompt, each `(new tokens, max_tokens)` (a third element 1: it asks for
    # prompt logprobs, sessions.py), the last `(0, 0)` (the end).
    session: tuple[tuple[int, ...], ...] = ()
    # Its LoRA (0: none; read only with `Config.max_loras`) and whether it
    # asks for prompt logprobs (spec/lora.py).
    lora: int = 0
    prompt_logprobs: bool = False


@dataclass(frozen=True)
class Sample:
    """What the model returns for one entry that samples (environment's choice)."""

    num_accepted: int = 0          # drafts accepted (0..entry.drafts)
    stop_at: int | None = None     # index among the generated tokens of a stop token
    next_drafts: int = 0           # drafts proposed for the request's next step (0..k)
    illegal_from: int | None = None  # structured output: the first grammar-illegal draft (grammar.py)


def arrive(state: State, cfg: Config, r: int, prompt: Prompt) -> State | None:
    """Request r arrives and joins the tail of `waiting` (its place, under
    the priority policy)."""
    if not (0 <= r < len(state.requests)) or state.requests[r].status is not Status.NEW:
        return None
    if not (1 <= prompt.prompt_len < cfg.max_model_len) or prompt.max_tokens < 1:
        return None
    labels = prompt.labels if cfg.prefix_caching else ()
    if cfg.prefix_caching and len(labels) != prompt.prompt_len // cfg.block_size:
        return None
    if len(set(labels)) != len(labels):
        return None      # chained block hashes never repeat within a prompt (a repeat would break S9)
    state = replace(state, waiting=state.waiting + (r,))
    state = state.with_request(r, status=Status.WAITING, prompt_len=prompt.prompt_len,
                               max_tokens=prompt.max_tokens, prompt_labels=labels, num_computed=0)
    state = grammar.arrive_structured(state, cfg, r, prompt.structured)
    state = sessions.open_session(state, cfg, r, prompt.session)
    state = _offer_of_connector(state, cfg, r, prompt)
    state = arrive_with_lora(state, cfg, r, prompt.lora, prompt.prompt_logprobs)
    state = cadence.note_enqueued(state, cfg, r)        # a grammar to wait for is deferred (cadence.py)
    return arrive_with_priority(state, cfg, r, prompt.priority)


def _offer_of_connector(state: State, cfg: Config, r: int, prompt: Prompt) -> State:
    """What the connector will offer r (fixed at arrival, the environment's
    choice), only where the profile has it: no hit without sync hits (vLLM
    0.8.4), no async load without async loads (0.8.5). Under vLLM 0.34's
    load limit the arrival is recorded (`_next_waiting_queue` orders by it)."""
    if cfg.kv_connector is None or not cfg.kv_connector.consumer or prompt.external_hit < 0:
        return state                    # a producer-only connector loads nothing
    if cfg.rules.kv_inflight_load_limit and cfg.kv_connector.max_inflight_loads is not None:
        state = replace(state, arrivals=state.arrivals + (r,))
    hit = prompt.external_hit if cfg.rules.kv_sync_hits else 0
    return state.with_request(r, external_hit=hit, load_async=prompt.load_async and hit > 0
                              and cfg.rules.kv_async_loads)


def arrive_as(state: State, cfg: Config, r: int, prompt: Prompt, name: int) -> State | None:
    """Request r arrives under `name`, the name of a finished request whose
    batches may still be in flight (`Config.allow_name_reuse`: a front end with
    request-id randomization off). vLLM's `Scheduler.add_request` refuses a
    name only while its holder is unfinished; a new slot is a new incarnation."""
    if not cfg.allow_name_reuse or not (0 <= r < len(state.requests)) or holder_of(state, name) is not None:
        return None
    if not any(q.status.is_finished and name_of(state, x) == name for x, q in enumerate(state.requests)):
        return None
    state = arrive(state, cfg, r, prompt)
    return None if state is None else state.with_request(r, name=name)


def abort(state: State, cfg: Config, r: int) -> State | None:
    """Request r is aborted, whatever it is doing (in flight included)."""
    if not (0 <= r < len(state.requests)) or not state.requests[r].status.is_active:
        return None
    return _forget_counters(_finish(state, cfg, r, Status.FINISHED_ABORTED), r)


def finish_request(state: State, cfg: Config, r: int, status: Status) -> State:
    """vLLM's `finish_requests(r, status)` from outside the batch loop: an
    abort, or the KV connector's fail policy (FINISHED_ERROR)."""
    return _forget_counters(_finish(state, cfg, r, status), r)


def _forget_counters(state: State, r: int) -> State:
    """A finished request leaves vLLM's `self.requests` (`_free_request`), and
    its counters with it: a finished slot keeps none."""
    return state.with_request(r, num_in_flight=0, num_stale=0, drop_stale=False, placeholders=0,
                              decode_countdown=0)


def entry_samples(state: State, cfg: Config, e: Entry) -> bool:
    """Whether the model returns tokens for e: decided by the snapshot."""
    return e.samples


def sampling_entries(state: State, cfg: Config) -> list[Entry]:
    """The entries of the oldest batch whose tokens will be applied, in order:
    `complete_oldest` takes one `Sample` for each."""
    if not state.in_flight:
        return []
    if cfg.rules.stale_output_counters:
        return [e for e in state.in_flight[0] if _output_applied(state, cfg, e)]
    return [e for e in state.in_flight[0]
            if e.fate is not Fate.SUPERSEDED and entry_samples(state, cfg, e)]


def _output_applied(state: State, cfg: Config, e: Entry) -> bool:
    """vLLM 0.33 `update_from_output`: e's token is applied if e samples, its
    name has a holder (`self.requests.get(req_id)`, unfinished), and the
    output is not stale in drop mode. Decided on the state before the batch
    is applied: no other entry of the batch shares e's name."""
    holder = holder_of(state, e.lookup_name)
    if holder is None or not entry_samples(state, cfg, e):
        return False
    req = state.requests[holder]
    return not (_drains_stale(req) and req.drop_stale)


def max_next_drafts(cfg: Config) -> int:
    """The most drafts a completion proposes for a request's next step: k,
    or none where drafts do not come with the output (`Profile.draft_source`)."""
    return cfg.num_spec_tokens if drafts_come_with_output(cfg) else 0


def is_valid_sample(cfg: Config, e: Entry, s: Sample) -> bool:
    return (0 <= s.num_accepted <= e.drafts
            and (s.stop_at is None or 0 <= s.stop_at <= s.num_accepted)
            and 0 <= s.next_drafts <= max_next_drafts(cfg)
            and grammar.verifier_accepts(cfg, e, s.num_accepted, s.illegal_from))


def is_complete_enabled(state: State) -> bool:
    """A batch is in flight: the oldest one can return, whatever its entries' fates."""
    return bool(state.in_flight)


def complete_oldest(state: State, cfg: Config, samples: tuple[Sample, ...],
                    dropped: frozenset[int] = frozenset()) -> State | None:
    """The oldest in-flight batch returns; its entries' outputs are applied in order.

    `dropped`: requests whose ORPHANED entries the scheduler drops instead of
    applying (vLLM 0.8.5 does; wasteful but safe). Only trace validation uses
    it; the model checkers explore the rule that applies them."""
    if not can_complete_oldest(state, cfg, samples):
        return None
    if cfg.rules.stale_output_counters:
        return _complete_by_name(state, cfg, samples, dropped)
    batch = state.in_flight[0]
    flags = [e.fate is not Fate.SUPERSEDED and entry_samples(state, cfg, e) for e in batch]
    remaining = iter(samples)
    state = drain_deferred_frees(replace(state, in_flight=state.in_flight[1:]), cfg, batch)
    for e, samples_here in zip(batch, flags):
        if e.fate is Fate.SUPERSEDED:
            continue
        if e.fate is Fate.LIVE:
            state = _settle_live(state, cfg, e)
        if samples_here:
            sample = next(remaining)
            if not (e.fate is Fate.ORPHANED and e.req in dropped):
                state = _apply_sample(state, cfg, e, sample, e.fate)
    return drain_error_frees(state, cfg, batch)


def _complete_by_name(state: State, cfg: Config, samples: tuple[Sample, ...],
                      dropped: frozenset[int]) -> State:
    """vLLM 0.33 `Scheduler.update_from_output`, entry by entry: the output is
    looked up by NAME; a name without an unfinished holder drops it; else the
    holder's counters settle, and the output is stale while its stale counter
    is > 0 -- discarded in drop mode, appended to the PREEMPTED request in
    deliver mode (`num_computed` untouched), applied as a live output
    otherwise. The entry's fate is not read: with unique names the counters
    agree with it (IF1, IF2); with a reused name they need not."""
    batch = state.in_flight[0]
    applied = [_output_applied(state, cfg, e) for e in batch]
    # Looked up on the state before the batch, as `_output_applied` decides:
    # the batch's names are distinct, and applying an entry changes only its
    # own holder's status, so no entry's holder moves while the batch applies.
    holders = [holder_of(state, e.lookup_name) for e in batch]
    remaining = iter(samples)
    state = drain_deferred_frees(replace(state, in_flight=state.in_flight[1:]), cfg, batch)
    for e, holder, has_output in zip(batch, holders, applied):
        if holder is None:
            continue                                   # finished or never arrived: dropped
        stale = _drains_stale(state.requests[holder])
        state = _floor_in_flight(_settle_counters(state, holder, e, stale), cfg, holder)
        if not has_output:
            continue
        sample = next(remaining)
        if stale and holder in dropped:
            continue
        state = _apply_sample(state, cfg, e, sample, Fate.ORPHANED if stale else Fate.LIVE, holder)
    return after_output(drain_error_frees(state, cfg, batch), cfg)


def after_output(state: State, cfg: Config) -> State:
    """The end of `update_from_output` with structured output: failed
    grammars the waiting loop met finish with FINISHED_ERROR
    (`grammar_compile_error_reqs`), and a deferred bitmask is built from the
    FSM as the output left it (`step_with_batch_queue`)."""
    if not cfg.structured_output:
        return state
    for r in grammar.errored_requests(state):
        state = finish_request(state, cfg, r, Status.FINISHED_ERROR)
    return grammar.build_deferred_masks(replace(state, grammar_errors=frozenset()))


def _drains_stale(req: Request) -> bool:
    """vLLM 0.33 `update_from_output`: an output is stale while the holder's
    stale counter is positive (`num_stale_output_tokens > 0`)."""
    return req.num_stale > 0


def _settle_counters(state: State, r: int, e: Entry, stale: bool) -> State:
    """vLLM 0.33 `update_from_output`: `num_in_flight_tokens -= n` for the
    holder of e's name, and `num_stale_output_tokens -= n` when the output is
    stale (vLLM then asserts the stale count is >= 0; IF2 states it)."""
    req = state.requests[r]
    return state.with_request(r, num_in_flight=req.num_in_flight - e.n,
                              num_stale=req.num_stale - e.n if stale else req.num_stale)


def _floor_in_flight(state: State, cfg: Config, r: int) -> State:
    """The hardened variant's guard (`Profile.in_flight_floor`): r's in-flight
    counter, once settled, is floored at 0, so an output bound to r through a
    reused name cannot drive it negative. vLLM 0.33: no floor."""
    if not cfg.rules.in_flight_floor or state.requests[r].num_in_flight >= 0:
        return state
    return state.with_request(r, num_in_flight=0)


def can_complete_oldest(state: State, cfg: Config, samples: tuple[Sample, ...]) -> bool:
    """complete_oldest's guard (the rest of it always succeeds): a batch is in
    flight, and `samples` holds one valid sample per entry that samples."""
    if not is_complete_enabled(state):
        return False
    sampling = sampling_entries(state, cfg)
    return len(samples) == len(sampling) and all(is_valid_sample(cfg, e, s) for e, s in zip(sampling, samples))


def _settle_live(state: State, cfg: Config, e: Entry) -> State:
    """Bookkeeping every live entry gets, whether or not it sampled."""
    if not cfg.continue_prefill:
        state = replace(state, scheduled_ids=state.scheduled_ids - {e.req})
    return state


def _apply_sample(state: State, cfg: Config, e: Entry, s: Sample, fate: Fate,
                  holder: int | None = None) -> State:
    """e's tokens applied to its request, or to `holder` (vLLM 0.33: whoever
    holds e's name now) with `fate` the rule that applies."""
    r = e.req if holder is None else holder
    req = state.requests[r]
    had_placeholders = req.placeholders > 0
    if _subtracts_rejections(fate):
        req = replace(req, num_computed=req.num_computed - (e.drafts - s.num_accepted))
        req = _settle_rejected_placeholders(req, e.drafts - s.num_accepted)
    finish: Status | None = None
    before = req
    for j in range(s.num_accepted + 1):
        req = evolve(req, num_output=req.num_output + 1)
        finish = _stop_reason(cfg, req, j, s)
        if finish is not None:
            break
    req = grammar.advance_fsm(before, req, e, s.num_accepted, s.illegal_from)
    if req.grammar is Grammar.REJECTED:
        finish = Status.FINISHED_ERROR          # "Failed to advance FSM": the request is terminated
    if fate is Fate.LIVE:
        # every returned token settles a placeholder, those trimmed at a stop too
        req = _settle_returned_placeholders(req, s.num_accepted + 1)
    if (fate is Fate.LIVE and (had_placeholders or cfg.num_spec_tokens > 0) and req.status is Status.RUNNING
            and cfg.rules.cache_settled_blocks_on_output):
        trimmed = s.num_accepted - j           # tokens after a stop, not appended
        state = _cache_settled_blocks(state, cfg, r, req.num_computed - trimmed - req.num_in_flight)
    if finish is not None:
        state = state.with_request(r, num_output=req.num_output, num_computed=req.num_computed,
                                   placeholders=req.placeholders, grammar=req.grammar, fsm=req.fsm)
        # num_computed covers the kept tokens but the last (`_update_request_with_output`); a token
        # the FSM refuses ends a session too (`update_from_output` sets `resumable = False`)
        if req.resumable and finish is not Status.FINISHED_ERROR:
            trimmed = s.num_accepted - j if fate is Fate.LIVE else 0
            return sessions.stop_session(state.with_request(r, num_computed=req.num_computed - trimmed), cfg, r, finish,
                                         end_by_stop)
        return end_by_stop(state, cfg, r, finish)
    if fate is Fate.LIVE and drafts_come_with_output(cfg):
        req = evolve(req, num_drafts=s.next_drafts)       # the drafts proposed for its next step
    return state.with_request(r, num_output=req.num_output, num_computed=req.num_computed,
                              num_drafts=req.num_drafts, placeholders=req.placeholders, fsm=req.fsm)


def end_by_stop(state: State, cfg: Config, r: int, finish: Status) -> State:
    """r finished by a stop or its length (a session: at the end of its last turn)."""
    return _forget_counters(_finish(state, cfg, r, finish), r)


def _settle_rejected_placeholders(req: Request, rejected: int) -> Request:
    """vLLM 0.33 `update_from_output`: a live, not stale output's rejected
    drafts are taken back from the placeholders (`if num_output_placeholders
    > 0`; always 0 outside async scheduling, so a no-op there)."""
    if req.placeholders > 0:
        return replace(req, placeholders=req.placeholders - rejected)
    return req


def _settle_returned_placeholders(req: Request, returned: int) -> Request:
    """vLLM 0.33 `_update_request_with_output`: a live, not stale output's
    returned tokens, those trimmed at a stop included, are taken back from the
    placeholders (`if not is_stale and num_output_placeholders > 0`)."""
    if req.placeholders > 0:
        return replace(req, placeholders=req.placeholders - returned)
    return req


def _cache_settled_blocks(state: State, cfg: Config, r: int, settled: int) -> State:
    """vLLM 0.33 `update_from_output`, async: a live output of a RUNNING
    request with placeholders hashes the full blocks of its `settled` tokens
    (`cache_blocks(request, num_computed - num_in_flight)`, num_computed
    trimmed at a stop and the in-flight counter settled for this output),
    before a stop frees them: a block so hashed goes to the free queue's
    tail, not its head. Called on the state before the output is appended:
    those tokens' blocks are labelled by position, which the append does not change."""
    req = state.requests[r]
    if not cfg.prefix_caching or settled < cfg.block_size:
        return state
    labels = [content_label(state, r, i, cfg.block_size) for i in range(settled // cfg.block_size)]
    pool = blocks.cache_labels(state.pool, req.block_table, labels, cfg.cache_duplicate_blocks)
    return replace(state, pool=pool)


def _subtracts_rejections(fate: Fate) -> bool:
    """Rejected drafts were counted in num_computed at schedule time: a live
    entry takes them back. An orphan's request was reset to 0 by preemption,
    so it has nothing to take back."""
    return fate is Fate.LIVE


def _stop_reason(cfg: Config, req, j: int, s: Sample) -> Status | None:
    """vLLM's check_stop, after each appended token: 0.8.x tests the length
    cap first, then stop tokens; 0.33 (`Profile.stop_tokens_before_length`)
    tests EOS and the stop ids first."""
    if cfg.rules.stop_tokens_before_length and s.stop_at == j:
        return Status.FINISHED_STOPPED
    if req.num_tokens >= cfg.max_model_len:
        return Status.FINISHED_LENGTH
    if req.num_output >= req.max_tokens:
        return Status.FINISHED_LENGTH
    if s.stop_at == j:
        return Status.FINISHED_STOPPED
    return None


def _finish(state: State, cfg: Config, r: int, status: Status) -> State:
    """Finish or abort r: out of every queue, blocks freed, in-flight work
    superseded (with a connector, its table may be held or fenced: kv_fence.py)."""
    if cfg.kv_connector is not None:
        return finish_with_connector(state, cfg, r, status)
    req = state.requests[r]
    state = replace(state, pool=blocks.free_table(state.pool, req.block_table, cfg.release_order,
                                                  cfg.rules.unhashed_blocks_to_head),
                    waiting=tuple(x for x in state.waiting if x != r),
                    running=tuple(x for x in state.running if x != r),
                    kv_holding=tuple(x for x in state.kv_holding if x != r),   # a session holding blocks
                    scheduled_ids=state.scheduled_ids - {r})
    state = retire_entries(state, r, frozenset({Fate.LIVE, Fate.ORPHANED}), Fate.SUPERSEDED)
    return state.with_request(r, status=status, num_computed=0, num_drafts=0, block_table=(),
                              queued_inputs=(), inputs_to_send=())
