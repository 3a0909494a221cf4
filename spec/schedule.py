"""The `schedule` action: vLLM V1's policy for forming one batch.

Running requests first, in order, each skipped when it has nothing left to
schedule (`num_new_tokens == 0`: its known tokens are all in flight, or it
waits for its sampled token); when blocks run out, the last running request
(under the priority policy, the lowest-priority one: priority.py) is
preempted (recompute) until the current one fits. Then, only if nothing was
preempted, FCFS admission from the head of `waiting` with prefix-cache hits.
`num_computed` is advanced once the batch is formed, so the snapshot records
the pre-batch counts.

Under vLLM 0.33 (`Config.rules`): the long-prefill threshold only with more
than one request, a running request's tokens clipped one short of
max_model_len, admission only when the whole sequence fits, and a preempted
request with orphaned entries in flight skipped (not a stop: the waiting
requests behind it may be admitted; its resumption is deferred). The action
is deterministic: given the state, the batch is fixed.

With a KV connector, the waiting loop asks it for hits, parks async loads
and promotes landed ones (kv_loads.py); a fenced victim is not preempted.

Structured output (grammar.py): the waiting loop skips a request whose
grammar still compiles and records one whose grammar failed
(`_handle_blocked_waiting_request`); no call schedules while a batch's
bitmask waits for the oldest output.

Abstracted away: encoder inputs and budgets, LoRA adapters beyond the
`max_loras` skip (lora.py), and the detail that
vLLM trims a request's draft list only when some drafts were scheduled: here
the unscheduled drafts are always dropped, so a clipped decode cannot leave
drafts behind to be scheduled as a second sampling entry.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import blocks, cadence, grammar, kv_invalid, kv_loads, kv_unwritten, lookahead, lora, priority, sessions
from .admission_order import reorder_waiting
from .config import Config
from .drafts import drafts_after_preemption, drafts_left_uncached, padded_admission, unclipped_demand_fits
from .kv_fence import can_free_now, requires_kv_delivery
from .launch import ScheduledEntry, count_down, count_in_flight, snapshot
from .reset_pause import has_requests, runs_running_loop, runs_waiting_loop, takes_waiting_queue
from .state import Batch, Fate, Load, Request, State, Status, content_label, evolve, retire_entries


@dataclass(frozen=True)
class Scheduled:
    state: State
    entries: tuple[ScheduledEntry, ...]
    preempted: tuple[int, ...]
    kv_loads: tuple[tuple[int, int], ...] = ()   # (request, start): async KV loads parked in this call
    taken_back: tuple[int, ...] = ()   # scheduled, then taken back out by a priority preemption (priority.hand_back)


class _Step:
    """The batch under construction (local to one `schedule` call)."""

    def __init__(self, state: State, cfg: Config) -> None:
        self.state, self.cfg = count_down(state, cfg), cfg
        self.budget = lookahead.initial_budget(cfg)      # input_budget - draft_slots (lookahead.py)
        self.entries: list[ScheduledEntry] = []
        self.preempted: list[int] = []
        self.new_blocks: tuple[int, ...] = ()   # set by the last successful _allocate
        self.kv_loads: list[tuple[int, int]] = []
        self.taken_back: list[int] = []
        self.threshold = _threshold_in_force(state, cfg)
        self.defers_prefills = cadence.defers_prefills(state, cfg)     # the prefill cadence (cadence.py)
        self.carried_prefill = False


def _threshold_in_force(state: State, cfg: Config) -> int:
    """The long-prefill threshold for this call (0 = none). vLLM 0.33
    `Scheduler.schedule` counts running + waiting once, before either loop,
    and drops the threshold for a lone request (`Profile.threshold_needs_company`);
    0.34 drops it with chunked prefill off too (`Profile.threshold_needs_chunked_prefill`);
    `get_request_counts` counts `kv_holding_waiting` (a KV connector's loads) as waiting."""
    waiting = len(state.waiting) + len(state.kv_holding)
    if cfg.rules.threshold_needs_company and len(state.running) + waiting <= 1:
        return 0
    if cfg.rules.threshold_needs_chunked_prefill and not cfg.enable_chunked_prefill:
        return 0
    return cfg.long_prefill_token_threshold


def is_schedule_enabled(state: State, cfg: Config) -> bool:
    """Room in the batch queue (D = K, or K + 1 under async scheduling), and
    (one-batch-per-request) vLLM 0.8.4's engine gate."""
    if len(state.in_flight) >= cfg.queue_depth or grammar.mask_pending(state):
        return False                    # (a deferred bitmask waits for the oldest output: grammar.py)
    if not cfg.continue_prefill:
        unscheduled = len(state.waiting) + len(state.running) - len(state.scheduled_ids)
        return unscheduled > 0
    return True


def schedule(state: State, cfg: Config) -> Scheduled | None:
    """Form the next batch; None when disabled or when it would do nothing."""
    if not is_schedule_enabled(state, cfg):
        return None
    step = _Step(state, cfg)
    if runs_running_loop(state):
        _schedule_running(step)
    if not step.preempted and runs_waiting_loop(state):
        _schedule_waiting(step)
        step.state = cadence.after_waiting_loop(step.state, cfg, step.defers_prefills)
    if not step.entries and not step.preempted:
        return _idle(state, cfg, step)   # 0.34's reorder and a KV connector's loads stay
    launched = kv_unwritten.forget_written(_launch(step), cfg, step.entries)
    return Scheduled(kv_invalid.forget_rewritten(launched, cfg, step.entries), tuple(step.entries),
                     tuple(step.preempted), tuple(step.kv_loads), tuple(step.taken_back))


def _idle(state: State, cfg: Config, step: _Step | None = None) -> Scheduled | None:
    """A step that forms nothing. vLLM 0.33 `EngineCore.step_with_batch_queue`
    calls `schedule()` whenever `Scheduler.has_requests()` (reset_pause.py:
    an unfinished request, none under PAUSED_ALL; or a KV connector's finished
    request held for a transfer) and queues its result even with 0 tokens
    (`Profile.empty_batches`): an empty batch takes a queue slot. The spec lets
    `schedule` and `complete_oldest` interleave freely, so this one rule covers
    every engine step that schedules nothing; it stays finite because the queue
    holds at most K batches, empty ones included. 0.8.x: nothing. `step`: the
    call's own, counted down, with its waiting loop's changes; None: on `state`."""
    counted = count_down(state, cfg) if step is None else step.state
    if not cfg.rules.empty_batches or not has_requests(counted):
        return None
    queued = kv_invalid.forget_rewritten(replace(counted, in_flight=counted.in_flight + ((),)), cfg, ())
    return Scheduled(queued, (), (), () if step is None else tuple(step.kv_loads))


def is_empty_step(scheduled: Scheduled | None) -> bool:
    """Whether a schedule step formed no entry and preempted nobody (None, or
    vLLM 0.33's empty batch)."""
    return scheduled is None or (not scheduled.entries and not scheduled.preempted)


def _clip(step: _Step, r: int, num_new: int) -> int:
    """The long-prefill threshold, the token budget, and room below
    max_model_len, less the sampled token's slot under vLLM 0.33
    (`Profile.sampled_token_slot`). 0.33 clips only in the running loop; in
    the waiting loop the clip never binds (an unfinished request has fewer
    than max_model_len tokens, and its counter is its hit), so one clip
    serves both."""
    cfg, req = step.cfg, step.state.requests[r]
    if 0 < step.threshold < num_new:
        num_new = step.threshold
    num_new = min(num_new, step.budget)
    room = cfg.max_model_len - req.num_computed - cfg.rules.sampled_token_slot
    return max(0, min(num_new, room))


def _schedule_running(step: _Step) -> None:
    i = 0
    while i < len(step.state.running) and step.budget > 0:
        r = step.state.running[i]
        if not step.cfg.continue_prefill and r in step.state.scheduled_ids:
            i += 1
            continue
        if _is_held_back(step, r):
            i += 1
            continue
        num_new = _num_new_running(step, r)
        if num_new == 0:
            i += 1          # all known tokens in flight, or waiting for its token
            continue
        while not (unclipped_demand_fits(step.state, step.cfg, r, step.threshold, step.budget)
                   and _allocate(step, r, num_new, hit=())):
            victim = priority.choose_victim(step.state, step.cfg)
            if not _victim_frees_at_once(step, victim):
                return
            i = _preempt_victim(step, victim, i)
            if victim == r:
                if not priority.is_priority(step.cfg):
                    return
                break       # priority: r preempted itself; i already points past it
        else:
            step.carried_prefill |= cadence.carries_prefill(step.state, r, 0, admitted=False)
            _add_entry(step, r, num_new, cached=0)
            i += 1


def _preempt_victim(step: _Step, victim: int, i: int) -> int:
    """The victim leaves `running` (and, under the priority policy, the batch
    it was scheduled into: `priority.hand_back`); the loop's index after it."""
    i = priority.index_after_removal(step.state, victim, i)
    step.state = kv_unwritten.hand_back_blocks(step.state, step.cfg, victim, step.entries)   # KV8
    priority.hand_back(step, victim)
    step.state = priority.to_tail(step.state, victim)
    _preempt(step, victim)
    step.state = priority.in_priority_order(step.state, step.cfg)
    _mark_stale_output(step, victim)
    return i


def _victim_frees_at_once(step: _Step, victim: int) -> bool:
    """vLLM 0.33/0.34 under the step fence: a victim whose blocks would be put
    aside is not preempted and the running loop stops ("a deferred free will not help")."""
    return can_free_now(step.state, step.cfg, victim)


def _is_held_back(step: _Step, r: int) -> bool:
    """The running loop's async skips (vLLM 0.33 `Scheduler.schedule`, before
    `num_new_tokens`): the max_tokens guard, then the decode stagger; and a
    prefill chunk while the call defers prefills (cadence.py)."""
    return (_placeholders_reach_max_tokens(step, r) or _stagger_pending(step, r)
            or cadence.skips_running(step.state, r, step.defers_prefills))


def _placeholders_reach_max_tokens(step: _Step, r: int) -> bool:
    """vLLM 0.33's async max_tokens guard: `num_output_placeholders > 0 and
    num_computed_tokens + 2 - num_output_placeholders >= num_prompt_tokens +
    max_tokens`, i.e. even if every draft in flight is rejected, the tokens
    in flight reach max_tokens. Never true without placeholders (sync)."""
    req = step.state.requests[r]
    return req.placeholders > 0 and req.num_computed + 2 - req.placeholders >= req.prompt_len + req.max_tokens


def _stagger_pending(step: _Step, r: int) -> bool:
    """vLLM 0.33 (V2 runner, PP, async): `current_step <
    next_decode_eligible_step` skips the request, a prefill chunk included;
    here, its countdown (`count_down`) has not reached 0."""
    return step.state.requests[r].decode_countdown > 0


def _num_new_running(step: _Step, r: int) -> int:
    """What running request r can be scheduled: its unscheduled known tokens
    and drafts, clipped; 0 while its sampled token is still in flight."""
    return _clip(step, r, step.state.num_new_tokens(r))


def _schedule_waiting(step: _Step) -> None:
    cfg = step.cfg
    if cfg.kv_connector is not None:
        return _schedule_waiting_with_connector(step)
    step.state = reorder_waiting(step.state, cfg)       # vLLM 0.34, opt-in (admission_order.py)
    running_entries = [e.req for e in step.entries]    # what the running loop scheduled
    i = 0                                   # requests before i were skipped: they keep their place
    while i < len(queue := _waiting_order(step.state)) and step.budget > 0 and _has_free_seat(step):
        r = queue[i]
        step.state, blocked = grammar.blocked_on_grammar(step.state, r)     # structured output
        if blocked or _is_resumption_deferred(step.state, cfg, r) or sessions.waits_for_input(step.state, r):
            step.state = cadence.note_skipped(step.state, cfg, r)
            i += 1
            continue
        if lora.held_by_lora_cap(step.state, cfg, r, step.state.running):
            step.state = cadence.note_skipped(step.state, cfg, r)
            i += 1
            continue                                    # passed over: max_loras (lora.py)
        held = _session_computed(step, r)               # a session's next turn: its computed tokens (else 0)
        hit = _prefix_hit(step.state, cfg, r) if held == 0 else ()
        if cadence.stops_admission(step.state, r, held + len(hit) * cfg.block_size, step.defers_prefills):
            break                                       # the prefill cadence holds prefills (cadence.py)
        padded = padded_admission(step.state, cfg, r, held + len(hit) * cfg.block_size, running_entries, step.budget)
        if padded < 0:
            break                                       # vLLM 0.33: not scheduled un-padded
        num_new = _clip(step, r, padded) if padded else _num_new_waiting(step, r, hit)
        if _needs_a_chunk(step, r, hit, held):
            break                                       # chunked prefill off: whole or not at all
        if num_new == 0 or not _fits_whole(step, r, hit) or not _allocate(step, r, num_new, hit):
            break                                       # FCFS: head-of-line blocks
        if padded:                                      # its k placeholder drafts (drafts.py)
            step.state = step.state.with_request(r, num_drafts=cfg.num_spec_tokens)
        _admit(step, r, held + len(hit) * cfg.block_size, num_new)


def _waiting_order(state: State) -> tuple[int, ...]:
    """The order without a connector: `kv_holding` (sessions between turns holding
    blocks, sessions.py) before `waiting` (PAUSED_NEW: `kv_holding` alone, reset_pause.py)."""
    if not takes_waiting_queue(state):
        return state.kv_holding
    return state.kv_holding + state.waiting if state.kv_holding else state.waiting


def _schedule_waiting_with_connector(step: _Step) -> None:
    """The waiting loop with a KV connector (vLLM 0.34 `Scheduler.schedule`;
    the order, offers, parking, promotion and load limit: kv_loads.py)."""
    cfg = step.cfg
    step.state = reorder_waiting(step.state, cfg)
    running_entries = [e.req for e in step.entries]
    walk = kv_loads.Walk()
    while (pick := kv_loads.next_candidate(step.state, cfg, walk, _loads_only(step))) is not None:
        r, queue = pick
        if step.budget <= 0 and not _loads_only(step):
            break                                       # `input_budget <= draft_slots` (lookahead.py)
        step.state, blocked = grammar.blocked_on_grammar(step.state, r)     # structured output
        if (blocked or kv_loads.is_blocked(step.state, r) or _is_resumption_deferred(step.state, cfg, r)
                or sessions.waits_for_input(step.state, r)):            # a parked session (sessions.py)
            walk.skipped.add(r)
            continue
        if step.state.requests[r].status is Status.WAITING_FOR_REMOTE_KVS:
            step.state = kv_loads.promote(step.state, cfg, r)
        if lora.held_by_lora_cap(step.state, cfg, r, step.state.running):
            step.state = kv_loads.pass_over(step.state, cfg, r)
            walk.skipped.add(r)
            continue                                    # max_loras (lora.py), after the promotion
        computed = step.state.requests[r].num_computed
        hit = _prefix_hit(step.state, cfg, r) if computed == 0 else ()
        external, is_async = kv_loads.connector_offer(step.state, cfg, r, len(hit) * cfg.block_size)
        if (is_async and not kv_loads.admits_inflight_load(step.state, cfg)) or (_loads_only(step) and not is_async):
            if queue != "async":
                break                                   # past the limit, or no slot: it waits at the head
            walk.take_async = False
            continue
        computed += len(hit) * cfg.block_size + external
        if is_async:
            if not (_fits_whole(step, r, hit) and kv_loads.fits_beside_reservations(
                    step.state, cfg, r, hit, computed, step.entries[len(running_entries):], walk.parked)
                    and _allocate(step, r, 0, hit, external, cache=False)):
                break
            step.state = kv_loads.park(step.state, cfg, r, computed, external)
            step.kv_loads.append((r, computed))
            walk.skipped.add(r)
            continue
        if cadence.stops_admission(step.state, r, computed, step.defers_prefills):
            break                                       # the prefill cadence holds a sync or landed load (cadence.py)
        if not _admit_with_connector(step, r, hit, external, computed, running_entries):
            break
    step.state = cadence.note_all_skipped(step.state, cfg, walk.skipped)


def _admit_with_connector(step: _Step, r: int, hit: tuple[int, ...], external: int, computed: int,
                          running_entries: list[int]) -> bool:
    """Admit r with `computed` tokens (local hit + a sync load's, or a promoted
    load's), as `_schedule_waiting` admits; False: the loop stops (head-of-line)."""
    cfg, req = step.cfg, step.state.requests[r]
    padded = padded_admission(step.state, cfg, r, computed, running_entries, step.budget)
    if padded < 0:
        return False
    num_new = _clip(step, r, padded) if padded else _clip(step, r, req.num_tokens - computed)
    if _needs_a_chunk(step, r, hit, computed - len(hit) * cfg.block_size):
        return False
    if num_new == 0 or not _fits_whole(step, r, hit) or not _allocate(step, r, num_new, hit, external):
        return False
    if padded:
        step.state = step.state.with_request(r, num_drafts=cfg.num_spec_tokens)
    step.state = step.state.with_request(r, load=Load.DONE, external=0)
    _admit(step, r, computed, num_new)
    step.entries[-1] = replace(step.entries[-1], external=external)
    return True


def _loads_only(step: _Step) -> bool:
    """vLLM 0.34's `loads_only`: no running slot or budget left (only async loads may start)."""
    return lookahead.tokens_left(step.cfg, step.budget, len(step.entries)) <= 0 or not _has_free_seat(step)


def _is_resumption_deferred(state: State, cfg: Config, r: int) -> bool:
    """vLLM 0.33's waiting loop skips (`skip_request`) a preempted request whose
    deliver-mode stale output is still in flight (`num_stale_output_tokens`):
    here, its ORPHANED entries. 0.8.x resumes it and supersedes them."""
    if not cfg.rules.defer_resume_while_stale:
        return False
    if cfg.rules.stale_output_counters and cfg.rules.stale_test == "positive":
        return _has_positive_stale_output(state.requests[r])
    if cfg.rules.stale_output_counters:
        return _has_stale_output(state.requests[r])
    return state.requests[r].status is Status.PREEMPTED and any(
        e.req == r and e.fate is Fate.ORPHANED for batch in state.in_flight for e in batch)


def _has_stale_output(req: Request) -> bool:
    """vLLM 0.33's test in the waiting loop, on its counter:
    `num_stale_output_tokens and not drop_stale_output` -- truthiness, so a
    counter driven below 0 defers the request too (IF2 says it never is)."""
    return req.num_stale != 0 and not req.drop_stale


def _has_positive_stale_output(req: Request) -> bool:
    """The hardened waiting loop's test (`Profile.stale_test == "positive"`):
    `num_stale_output_tokens > 0 and not drop_stale_output`, the drain's own
    test, so a count driven below 0 cannot defer the request for ever."""
    return req.num_stale > 0 and not req.drop_stale


def _mark_stale_output(step: _Step, victim: int) -> None:
    """vLLM 0.33 `Scheduler._preempt_request`: the victim's tokens in flight
    become its stale output (`num_stale_output_tokens = num_in_flight_tokens`),
    and drop mode is set by the configuration, or kept while an earlier drop
    share is undrained (`drop_stale_output or (drop_stale_output and stale > 0)`,
    read before the stale count is overwritten). 0.8.x: no counters."""
    if not step.cfg.rules.stale_output_counters:
        return
    req = step.state.requests[victim]
    drop = (step.cfg.stale_mode == "drop" or requires_kv_delivery(step.cfg)
            or (req.drop_stale and req.num_stale > 0))
    step.state = step.state.with_request(victim, num_stale=req.num_in_flight, drop_stale=drop)
    _reset_placeholders(step, victim)


def _reset_placeholders(step: _Step, victim: int) -> None:
    """vLLM 0.33 `_preempt_request`: `num_output_placeholders = 0` (the
    tokens in flight become stale output; the recompute starts from 0)."""
    step.state = step.state.with_request(victim, placeholders=0)


def _needs_a_chunk(step: _Step, r: int, hit: tuple[int, ...], external: int = 0) -> bool:
    """Chunked prefill off (`Config.enable_chunked_prefill`), vLLM 0.33 and
    0.34's waiting loop (`Profile.unchunked_prefill_stops_admission`): r's
    tokens past its hit, cut by the threshold in force, exceed the budget
    left, so admitting it would cut a chunk: the loop stops instead."""
    if step.cfg.enable_chunked_prefill or not step.cfg.rules.unchunked_prefill_stops_admission:
        return False
    num_new = step.state.requests[r].num_tokens - len(hit) * step.cfg.block_size - external
    if 0 < step.threshold < num_new:
        num_new = step.threshold
    return num_new > step.budget


def _fits_whole(step: _Step, r: int, hit: tuple[int, ...]) -> bool:
    """vLLM 0.33's admission gate (`allocate_slots(full_sequence_must_fit=True)`,
    `scheduler_reserve_full_isl`): blocks for r's whole current sequence,
    less its hit, fit among the free blocks not being hit. Off in 0.8.x."""
    if not step.cfg.rules.full_sequence_admission:
        return True
    cfg, req = step.cfg, step.state.requests[r]
    whole = _num_required_blocks(cfg, min(req.num_tokens, cfg.max_model_len))
    held = len(req.block_table)             # a promoted KV load's blocks (none otherwise)
    return blocks.can_allocate(step.state.pool, max(0, whole - len(hit) - held), hit)


def _session_computed(step: _Step, r: int) -> int:
    """A waiting session's computed tokens, kept between its turns (sessions.py);
    0 without sessions, where a waiting request has computed nothing."""
    return step.state.requests[r].num_computed if step.cfg.streaming_sessions else 0


def _num_new_waiting(step: _Step, r: int, hit: tuple[int, ...]) -> int:
    """What waiting request r can be admitted with: its known tokens past the hit, clipped."""
    if held := _session_computed(step, r):             # a session's next turn (sessions.py)
        return _clip(step, r, step.state.requests[r].num_tokens - held)
    return _clip(step, r, step.state.requests[r].num_tokens - len(hit) * step.cfg.block_size)


def _has_free_seat(step: _Step) -> bool:
    """Fewer than max_num_seqs requests running (and sessions waiting for input: sessions.py)."""
    if step.cfg.streaming_sessions and sessions.seats_taken(step.state) >= step.cfg.max_num_seqs:
        return False
    return len(step.state.running) < step.cfg.max_num_seqs


def _prefix_hit(state: State, cfg: Config, r: int) -> tuple[int, ...]:
    """Cached blocks of r's known tokens, never all of them (the last token is
    recomputed); none for a prompt-logprobs request (lora.py)."""
    if not cfg.prefix_caching or not lora.reads_prefix_cache(state, r):
        return ()
    req = state.requests[r]
    labels = [content_label(state, r, i, cfg.block_size) for i in range(req.num_tokens // cfg.block_size)]
    return blocks.lookup_hit(state.pool, labels, (req.num_tokens - 1) // cfg.block_size)


def _num_required_blocks(cfg: Config, num_tokens: int) -> int:
    """Blocks to hold num_tokens: the last, partly filled block included."""
    return blocks.cdiv(num_tokens, cfg.block_size)


def _allocate(step: _Step, r: int, num_new: int, hit: tuple[int, ...], external: int = 0,
              cache: bool = True) -> bool:
    """vLLM's allocate_slots: room for num_computed (+ hit + a KV connector's
    external tokens) + num_new tokens; full blocks cached unless `cache` is
    off (an async load's: `delay_cache_blocks`)."""
    state, cfg = step.state, step.cfg
    req = state.requests[r]
    computed = req.num_computed + len(hit) * cfg.block_size + external
    total = computed + num_new
    num_fresh = max(0, _num_required_blocks(cfg, lookahead.tokens_needing_slots(cfg, total, not cache))
                    - len(req.block_table) - len(hit))
    if not blocks.can_allocate(state.pool, num_fresh, hit):
        return False
    pool = blocks.touch(state.pool, hit)
    num_fresh += blocks.num_preallocated_under(cfg, pool, num_fresh, len(req.block_table) + len(hit))
    pool, fresh = blocks.pop_fresh(pool, num_fresh)
    table = req.block_table + hit + fresh
    if cfg.prefix_caching and cache:
        drafts = drafts_left_uncached(cfg, req.num_drafts, max(0, total - req.num_tokens))
        num_full = max(0, total - drafts) // cfg.block_size
        labels = [blocks.label_of(pool, b) is None and content_label(state, r, i, cfg.block_size) for i, b in enumerate(table[:num_full])]
        pool = blocks.cache_labels(pool, table, labels, cfg.cache_duplicate_blocks)
    step.state = evolve(state, pool=pool).with_request(r, block_table=table)
    step.new_blocks = hit + fresh
    return True


def _preempt(step: _Step, victim: int) -> None:
    """Recompute preemption: free everything, back to the head of `waiting`
    (at once: a KV connector's fence spares fenced victims, `_victim_frees_at_once`)."""
    state = step.state
    req = state.requests[victim]
    state = replace(state, pool=blocks.free_table(state.pool, req.block_table, step.cfg.release_order,
                                                  step.cfg.rules.unhashed_blocks_to_head),
                    running=state.running[:-1], waiting=(victim,) + state.waiting,
                    scheduled_ids=state.scheduled_ids - {victim})
    state = retire_entries(state, victim, frozenset({Fate.LIVE}), Fate.ORPHANED)
    step.state = state.with_request(victim, status=Status.PREEMPTED, num_computed=0,
                                    num_drafts=drafts_after_preemption(step.cfg, req.num_drafts), block_table=())
    step.preempted.append(victim)


def _admit(step: _Step, r: int, hit_tokens: int, num_new: int) -> None:
    state = step.state
    was_preempted = state.requests[r].status is Status.PREEMPTED
    step.carried_prefill |= cadence.carries_prefill(state, r, hit_tokens, admitted=True)
    state = replace(state, waiting=tuple(x for x in state.waiting if x != r), running=state.running + (r,),
                    kv_holding=tuple(x for x in state.kv_holding if x != r))
    if was_preempted:
        state = _supersede_orphans(state, r)
    step.state = state.with_request(r, status=Status.RUNNING, num_computed=hit_tokens)
    _add_entry(step, r, num_new, cached=hit_tokens)


def _supersede_orphans(state: State, r: int) -> State:
    """A resumed request recomputes what its orphaned entries were computing:
    their outputs must never be applied to the new incarnation."""
    return retire_entries(state, r, frozenset({Fate.ORPHANED}), Fate.SUPERSEDED)


def _add_entry(step: _Step, r: int, num_new: int, cached: int) -> None:
    """The batch records r's snapshot from num_computed on, charged to the budget;
    drafts ride only on the entry that reaches the known tokens (it samples)."""
    req = step.state.requests[r]
    known = req.num_tokens + req.placeholders      # async: tokens in flight count as known
    drafts = min(req.num_drafts, max(0, req.num_computed + num_new - known))
    samples = req.num_computed + num_new - drafts >= known
    step.entries.append(ScheduledEntry(r, req.num_computed, num_new, cached, drafts, samples,
                                       step.new_blocks))
    step.state = step.state.with_request(r, num_drafts=drafts if samples else 0)  # unscheduled drafts dropped
    step.budget -= num_new
    step.budget -= lookahead.input_slots(step.cfg)     # a draft model's, per entry (lookahead.py)


def _launch(step: _Step) -> State:
    """Advance every scheduled request's counter and put the batch in flight."""
    state = step.state
    for e in step.entries:
        state = _advance_counter(state, e)
        state = cadence.mark_prefill_chunk(state, step.cfg, e.req)    # before its placeholders
        state = count_in_flight(state, step.cfg, e)
        if not step.cfg.continue_prefill:
            state = replace(state, scheduled_ids=state.scheduled_ids | {e.req})
    state = cadence.after_schedule(state, step.cfg, bool(step.entries), step.carried_prefill)
    if not step.entries and not step.cfg.rules.empty_batches:
        return state                    # the step only preempted: nothing to run (0.33 queues it empty)
    batch: Batch = tuple(snapshot(state, step.cfg, e) for e in step.entries)
    return replace(state, in_flight=state.in_flight + (batch,))


def _advance_counter(state: State, e: ScheduledEntry) -> State:
    """num_computed moves past the entry when it is scheduled, not when its
    output returns: the next batch continues where this one ends."""
    return state.with_request(e.req, num_computed=state.requests[e.req].num_computed + e.n)
