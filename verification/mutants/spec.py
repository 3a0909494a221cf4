"""The spec's mutants, as code: each function here is one function of the
correct spec (`spec/schedule.py`, `spec/actions.py`) rewritten with one bug.

Each docstring says what changed against the original and why it matters.
A mutant that spans several functions has one function here per function it
replaces. The registry (`registry.py`) says which original each one replaces;
`applied(name)` swaps them in for the duration of a check.

Calls to the rest of the spec go through the spec's modules (`scheduling.`,
`actions.`), so a mutant never holds a stale copy of a function it does not
replace.
"""

from __future__ import annotations

import importlib
from dataclasses import replace

from flightcheck.spec import blocks
from flightcheck.spec.config import Config
from flightcheck.spec.state import Batch, Entry, Fate, Request, State, Status, retire_entries

# `flightcheck.spec.schedule` as an attribute is the function the package
# re-exports, so the modules are looked up by their full names.
scheduling = importlib.import_module("flightcheck.spec.schedule")
actions = importlib.import_module("flightcheck.spec.actions")


# --- historical -----------------------------------------------------------------

def advance_counter_not_at_schedule(state: State, e: "scheduling.ScheduledEntry") -> State:
    """advance_at_completion, part 1 (replaces schedule._advance_counter):
    num_computed is not moved when the entry is scheduled. The next batch then
    starts where this one started and schedules the same tokens again: the
    double scheduling vLLM's scheduled_req_ids prevented (#15307)."""
    return state


def settle_live_and_advance(state: State, cfg: Config, e: Entry) -> State:
    """advance_at_completion, part 2 (replaces actions._settle_live): the
    counter moves when the live entry's output returns, too late for a
    prefill that continued meanwhile."""
    if not cfg.continue_prefill:
        state = replace(state, scheduled_ids=state.scheduled_ids - {e.req})
    req = state.requests[e.req]
    return state.with_request(e.req, num_computed=req.num_computed + e.n)


def launch_with_shared_snapshot(step: "scheduling._Step") -> State:
    """shared_snapshot (replaces schedule._launch): one snapshot object per
    request, so forming a batch overwrites the snapshot of the request's
    earlier, still running batches (vLLM before 0.8.5 reused its
    CachedRequestData). The in-flight batch then returns tokens for the wrong
    range."""
    state = step.state
    for e in step.entries:
        state = scheduling._advance_counter(state, e)
        state = scheduling._count_in_flight(state, step.cfg, e)
        if not step.cfg.continue_prefill:
            state = replace(state, scheduled_ids=state.scheduled_ids | {e.req})
        state = _alias_live_snapshots(state, e)
    if not step.entries and not step.cfg.rules.empty_batches:
        return state
    batch: Batch = tuple(scheduling._snapshot(state, e) for e in step.entries)
    return replace(state, in_flight=state.in_flight + (batch,))


def _alias_live_snapshots(state: State, new: "scheduling.ScheduledEntry") -> State:
    """The request's live in-flight entries take the new snapshot's values."""
    def alias(e: Entry) -> Entry:
        if e.req == new.req and e.fate is Fate.LIVE:
            return replace(e, start=new.start, n=new.n, samples=new.samples, drafts=new.drafts)
        return e
    return replace(state, in_flight=tuple(tuple(alias(e) for e in b) for b in state.in_flight))


def entry_samples_from_live_counter(state: State, cfg: Config, e: Entry) -> bool:
    """final_chunk_from_live_counter (replaces actions.entry_samples): whether
    a live entry returns a token is read from the request's counter when the
    batch completes, not from the batch's snapshot (the design note of
    #13637). With a later chunk already scheduled, an earlier chunk passes for
    the final one and samples."""
    if e.fate is Fate.LIVE:
        req = state.requests[e.req]
        return req.num_computed >= req.num_tokens
    return e.samples


def add_entry_without_prefix_hit(step: "scheduling._Step", r: int, num_new: int, cached: int) -> None:
    """snapshot_omits_prefix_hit (replaces schedule._add_entry): the
    snapshot's start leaves out the prefix-cache hit, so a final chunk after a
    hit looks partial, its sampled token is dropped and the request waits for
    it forever (the #13637 hang)."""
    req = step.state.requests[r]
    known = req.num_tokens + req.placeholders      # async: tokens in flight count as known
    drafts = min(req.num_drafts, max(0, req.num_computed + num_new - known))
    start = 0 if cached else req.num_computed
    samples = start + num_new - drafts >= known
    step.entries.append(scheduling.ScheduledEntry(r, start, num_new, cached, drafts, samples,
                                                  step.new_blocks))
    step.state = step.state.with_request(r, num_drafts=drafts if samples else 0)
    step.budget -= num_new


def never_subtracts_rejections(fate: Fate) -> bool:
    """rejections_not_subtracted (replaces actions._subtracts_rejections):
    rejected drafts stay counted in num_computed, so the request's KV counter
    runs ahead of its tokens."""
    return False


def num_new_running_decodes_in_flight(step: "scheduling._Step", r: int) -> int:
    """decode_while_token_in_flight (replaces schedule._num_new_running): the
    num_new_tokens == 0 gate removed, so a request whose sampled token is
    still in flight is scheduled a decode of one token it does not have yet."""
    num_new = scheduling._clip(step, r, step.state.num_new_tokens(r))
    req = step.state.requests[r]
    if num_new == 0 and req.num_tokens <= req.num_computed < step.cfg.max_model_len:
        return 1
    return num_new


def resumed_request_takes_orphans_live(state: State, r: int) -> State:
    """stale_output_applied_to_resumed (replaces schedule._supersede_orphans):
    the output of a batch scheduled before the preemption is applied by
    request name to the resumed request, as if it were its own (vLLM 0.8.5,
    with PP >= 3)."""
    return retire_entries(state, r, frozenset({Fate.ORPHANED}), Fate.LIVE)


def preempt_keeping_inflight_set(step: "scheduling._Step", victim: int) -> None:
    """inflight_set_not_cleared_on_preemption (replaces schedule._preempt):
    one-batch-per-request's scheduled_req_ids keeps the preempted request, so
    the engine's count of unscheduled requests drifts and it stops
    scheduling (vLLM 0.8.1-0.8.4)."""
    state = step.state
    req = state.requests[victim]
    state = replace(state, pool=blocks.free_table(state.pool, req.block_table, step.cfg.release_order,
                                                  step.cfg.rules.unhashed_blocks_to_head),
                    running=state.running[:-1], waiting=(victim,) + state.waiting)
    state = retire_entries(state, victim, frozenset({Fate.LIVE}), Fate.ORPHANED)
    step.state = state.with_request(victim, status=Status.PREEMPTED, num_computed=0,
                                    num_drafts=0, block_table=())
    step.preempted.append(victim)


def subtracts_rejections_after_reset(fate: Fate) -> bool:
    """rejections_subtracted_after_reset (replaces actions._subtracts_rejections):
    a stale (orphaned) batch's rejected drafts are subtracted from the counter
    that preemption already reset to 0, driving it negative (the guard vLLM
    0.12.0 added)."""
    return fate in (Fate.LIVE, Fate.ORPHANED)


# --- synthetic: each shows one property carries weight ----------------------------

def num_new_running_over_budget(step: "scheduling._Step", r: int) -> int:
    """budget_ignored, part 1 (replaces schedule._num_new_running): a running
    request is not clipped to the token budget (S10)."""
    cfg, req = step.cfg, step.state.requests[r]
    num_new = step.state.num_new_tokens(r)
    threshold = cfg.long_prefill_token_threshold
    if 0 < threshold < num_new:
        num_new = threshold
    return max(0, min(num_new, cfg.max_model_len - req.num_computed))


def add_entry_uncharged(step: "scheduling._Step", r: int, num_new: int, cached: int) -> None:
    """budget_ignored, part 2 (replaces schedule._add_entry): no entry is
    charged to the token budget."""
    req = step.state.requests[r]
    known = req.num_tokens + req.placeholders      # async: tokens in flight count as known
    drafts = min(req.num_drafts, max(0, req.num_computed + num_new - known))
    samples = req.num_computed + num_new - drafts >= known
    step.entries.append(scheduling.ScheduledEntry(r, req.num_computed, num_new, cached, drafts, samples,
                                                  step.new_blocks))
    step.state = step.state.with_request(r, num_drafts=drafts if samples else 0)


def always_a_free_seat(step: "scheduling._Step") -> bool:
    """max_num_seqs_ignored (replaces schedule._has_free_seat): admission does
    not check max_num_seqs (S10)."""
    return True


def num_new_waiting_over_threshold(step: "scheduling._Step", r: int, hit: tuple[int, ...]) -> int:
    """threshold_ignored_on_admission (replaces schedule._num_new_waiting): the
    long-prefill threshold is not applied to admissions (S10)."""
    req = step.state.requests[r]
    num_new = min(req.num_tokens - len(hit) * step.cfg.block_size, step.budget)
    return max(0, min(num_new, step.cfg.max_model_len - req.num_computed))


def stop_reason_without_length_cap(cfg: Config, req, j: int, s: "actions.Sample") -> Status | None:
    """no_length_cap (replaces actions._stop_reason): max_tokens is not
    checked after an appended token (S2)."""
    if cfg.rules.stop_tokens_before_length and s.stop_at == j:
        return Status.FINISHED_STOPPED
    if req.num_tokens >= cfg.max_model_len:
        return Status.FINISHED_LENGTH
    if s.stop_at == j:
        return Status.FINISHED_STOPPED
    return None


def finish_keeping_blocks_on_abort(state: State, cfg: Config, r: int, status: Status) -> State:
    """blocks_not_freed_on_abort (replaces actions._finish): an aborted request
    keeps its block table, so its blocks are never returned to the pool (S9)."""
    req = state.requests[r]
    keep_blocks = status is Status.FINISHED_ABORTED
    pool = state.pool if keep_blocks else blocks.free_table(state.pool, req.block_table, cfg.release_order,
                                                            cfg.rules.unhashed_blocks_to_head)
    state = replace(state, pool=pool,
                    waiting=tuple(x for x in state.waiting if x != r),
                    running=tuple(x for x in state.running if x != r),
                    scheduled_ids=state.scheduled_ids - {r})
    state = retire_entries(state, r, frozenset({Fate.LIVE, Fate.ORPHANED}), Fate.SUPERSEDED)
    return state.with_request(r, status=status, num_computed=0, num_drafts=0,
                              block_table=req.block_table if keep_blocks else ())


def schedule_admitting_after_preemption(state: State, cfg: Config) -> "scheduling.Scheduled | None":
    """admit_after_preemption (replaces schedule.schedule): admission runs in
    a step that preempted, so a request can be preempted and re-admitted in
    one step (S12)."""
    if not scheduling.is_schedule_enabled(state, cfg):
        return None
    step = scheduling._Step(state, cfg)
    scheduling._schedule_running(step)
    scheduling._schedule_waiting(step)
    if not step.entries and not step.preempted:
        return scheduling._idle(state, cfg)
    return scheduling.Scheduled(scheduling._launch(step), tuple(step.entries), tuple(step.preempted))


def orphans_kept_on_resume(state: State, r: int) -> State:
    """orphan_kept_after_reschedule (replaces schedule._supersede_orphans): a
    resumed request's orphaned entries stay orphaned, bound to a request that
    is RUNNING again (S7)."""
    return state


def preempt_keeping_counter(step: "scheduling._Step", victim: int) -> None:
    """preempt_keeps_counter (replaces schedule._preempt): preemption does not
    reset num_computed, though the KV it counted is freed (S1)."""
    state = step.state
    req = state.requests[victim]
    state = replace(state, pool=blocks.free_table(state.pool, req.block_table, step.cfg.release_order,
                                                  step.cfg.rules.unhashed_blocks_to_head),
                    running=state.running[:-1], waiting=(victim,) + state.waiting,
                    scheduled_ids=state.scheduled_ids - {victim})
    state = retire_entries(state, victim, frozenset({Fate.LIVE}), Fate.ORPHANED)
    step.state = state.with_request(victim, status=Status.PREEMPTED, num_computed=req.num_computed,
                                    num_drafts=0, block_table=())
    step.preempted.append(victim)


def preempt_clearing_inflight_drafts(step: "scheduling._Step", victim: int) -> None:
    """preemption_clears_inflight_drafts (replaces schedule._preempt): the
    in-flight entries alias the request's draft list, which preemption
    clears, so a running batch's snapshot changes (S4)."""
    state = step.state
    req = state.requests[victim]
    state = replace(state, pool=blocks.free_table(state.pool, req.block_table, step.cfg.release_order,
                                                  step.cfg.rules.unhashed_blocks_to_head),
                    running=state.running[:-1], waiting=(victim,) + state.waiting,
                    scheduled_ids=state.scheduled_ids - {victim})
    state = retire_entries(state, victim, frozenset({Fate.LIVE}), Fate.ORPHANED)

    def clear(e: Entry) -> Entry:
        return replace(e, drafts=0) if e.req == victim else e
    state = replace(state, in_flight=tuple(tuple(clear(e) for e in b) for b in state.in_flight))
    step.state = state.with_request(victim, status=Status.PREEMPTED, num_computed=0,
                                    num_drafts=0, block_table=())
    step.preempted.append(victim)


def launch_even_when_empty(step: "scheduling._Step") -> State:
    """empty_batch_submitted (replaces schedule._launch): a step that only
    preempted still puts an empty batch in flight, taking a pipeline slot for
    nothing (S11)."""
    state = step.state
    for e in step.entries:
        state = scheduling._advance_counter(state, e)
        state = scheduling._count_in_flight(state, step.cfg, e)
        if not step.cfg.continue_prefill:
            state = replace(state, scheduled_ids=state.scheduled_ids | {e.req})
    batch: Batch = tuple(scheduling._snapshot(state, e) for e in step.entries)
    return replace(state, in_flight=state.in_flight + (batch,))


def arrive_with_stale_counter(state: State, cfg: Config, r: int, prompt: "actions.Prompt") -> State | None:
    """arrival_counter_stale (replaces actions.arrive): an arriving request
    keeps a stale num_computed of 1 until admitted (S1: 0 outside RUNNING)."""
    if not (0 <= r < len(state.requests)) or state.requests[r].status is not Status.NEW:
        return None
    if not (1 <= prompt.prompt_len < cfg.max_model_len) or prompt.max_tokens < 1:
        return None
    labels = prompt.labels if cfg.prefix_caching else ()
    if cfg.prefix_caching and len(labels) != prompt.prompt_len // cfg.block_size:
        return None
    if len(set(labels)) != len(labels):
        return None
    state = replace(state, waiting=state.waiting + (r,))
    return state.with_request(r, status=Status.WAITING, prompt_len=prompt.prompt_len,
                              max_tokens=prompt.max_tokens, prompt_labels=labels, num_computed=1)


def add_entry_overlapping(step: "scheduling._Step", r: int, num_new: int, cached: int) -> None:
    """overlapping_chunks, part 1 (replaces schedule._add_entry): a continuing
    prefill chunk (the request has a live entry in flight) restarts one token
    early when budget and threshold leave room, recomputing a token already in
    flight (S3); it is charged for that token too."""
    cfg, req = step.cfg, step.state.requests[r]
    known = req.num_tokens + req.placeholders      # async: tokens in flight count as known
    drafts = min(req.num_drafts, max(0, req.num_computed + num_new - known))
    start = req.num_computed
    samples = start + num_new - drafts >= known
    recorded_start, recorded_n = start, num_new
    if (step.state.entries_of(r) and step.budget > num_new and start > 0
            and not 0 < cfg.long_prefill_token_threshold <= num_new):
        recorded_start, recorded_n = start - 1, num_new + 1
    step.entries.append(scheduling.ScheduledEntry(r, recorded_start, recorded_n, cached, drafts, samples,
                                                  step.new_blocks))
    step.state = step.state.with_request(r, num_drafts=drafts if samples else 0)
    step.budget -= recorded_n


def advance_counter_to_entry_end(state: State, e: "scheduling.ScheduledEntry") -> State:
    """overlapping_chunks, part 2 (replaces schedule._advance_counter): the
    counter moves to the end of the (widened) entry, which is where the
    request's tokens really end, not by the entry's length."""
    return state.with_request(e.req, num_computed=e.start + e.n)


def add_entry_with_stale_draft(step: "scheduling._Step", r: int, num_new: int, cached: int) -> None:
    """stale_drafts_on_prefill_chunk (replaces schedule._add_entry): a prefill
    chunk's snapshot records a draft, as if the request's old proposal were
    still scheduled; drafts may ride only on a sampling entry (S5)."""
    req = step.state.requests[r]
    known = req.num_tokens + req.placeholders      # async: tokens in flight count as known
    drafts = min(req.num_drafts, max(0, req.num_computed + num_new - known))
    samples = req.num_computed + num_new - drafts >= known
    if not samples and step.cfg.num_spec_tokens:
        drafts = 1
    step.entries.append(scheduling.ScheduledEntry(r, req.num_computed, num_new, cached, drafts, samples,
                                                  step.new_blocks))
    step.state = step.state.with_request(r, num_drafts=drafts if samples else 0)
    step.budget -= num_new


def max_next_drafts_plus_one(cfg: Config) -> int:
    """draft_cap_ignored (replaces actions.max_next_drafts): the drafter may
    propose k + 1 drafts (S8)."""
    return cfg.num_spec_tokens + 1


def complete_enabled_without_orphans(state: State) -> bool:
    """complete_refuses_orphans (replaces actions.is_complete_enabled): a batch
    holding an orphaned entry can never be consumed, so the pipeline stalls
    (L3)."""
    return bool(state.in_flight) and not any(e.fate is Fate.ORPHANED for e in state.in_flight[0])


def schedule_enabled_only_while_busy(state: State, cfg: Config) -> bool:
    """schedule_blocked_when_idle (replaces schedule.is_schedule_enabled): the
    engine will not schedule while nothing is in flight, so it never starts
    (L2)."""
    if len(state.in_flight) >= cfg.queue_depth or not state.in_flight:
        return False
    if not cfg.continue_prefill:
        unscheduled = len(state.waiting) + len(state.running) - len(state.scheduled_ids)
        return unscheduled > 0
    return True


def num_required_blocks_rounded_down(cfg: Config, num_tokens: int) -> int:
    """no_block_for_last_token (replaces schedule._num_required_blocks):
    allocation rounds down, so the last, partly filled block is missing (S9)."""
    return num_tokens // cfg.block_size


# --- vLLM 0.33's stale-output counters (hunted under the vllm-0.33 profile only) ------------

def has_stale_output_never(req: Request) -> bool:
    """resumption_not_deferred (replaces schedule._has_stale_output): the
    waiting loop never sees stale output in flight, so a preempted request
    resumes at once in deliver mode too: vLLM 0.8.5's bug returns, its stale
    output later applied to the running request (IF3)."""
    return False


def settle_counters_skipping_dropped(state: State, r: int, e: Entry, stale: bool) -> State:
    """drop_leaves_counters (replaces actions._settle_counters): a stale output
    discarded in drop mode leaves both counters untouched, so the in-flight
    count keeps the dropped batch's tokens (IF1)."""
    req = state.requests[r]
    if stale and req.drop_stale:
        return state
    return state.with_request(r, num_in_flight=req.num_in_flight - e.n,
                              num_stale=req.num_stale - e.n if stale else req.num_stale)


def settle_counters_by_newest_batch(state: State, r: int, e: Entry, stale: bool) -> State:
    """stale_drained_by_wrong_batch (replaces actions._settle_counters): the
    stale count is drained by the size of the request's newest entry still in
    flight (the wrong batch) instead of the completed one's (IF2)."""
    req = state.requests[r]
    newest = [x for b in state.in_flight for x in b if x.req == r]
    size = newest[-1].n if newest else e.n
    return state.with_request(r, num_in_flight=req.num_in_flight - e.n,
                              num_stale=req.num_stale - size if stale else req.num_stale)


def settle_counters_only_with_output(state: State, r: int, e: Entry, stale: bool) -> State:
    """in_flight_kept_without_output (replaces actions._settle_counters): an
    entry that returns no token (a partial prefill chunk, an empty output)
    leaves the counters as they were, as if the decrement sat behind the
    "no generated tokens" skip (IF1)."""
    if not e.samples:
        return state
    req = state.requests[r]
    return state.with_request(r, num_in_flight=req.num_in_flight - e.n,
                              num_stale=req.num_stale - e.n if stale else req.num_stale)


# --- asynchronous scheduling (vLLM 0.33 AsyncScheduler, profile vllm-0.33-async) ---

def rejected_placeholders_kept(req: Request, rejected: int) -> Request:
    """async_rejections_not_settled (replaces actions._settle_rejected_placeholders):
    a rejected draft's placeholder is never taken back, so the request believes
    a token is still in flight that never will be (IA1)."""
    return req


def reset_placeholders_never(step: "scheduling._Step", victim: int) -> None:
    """async_placeholders_kept_on_preemption (replaces schedule._reset_placeholders):
    `_preempt_request` leaves num_output_placeholders as it was, so the
    recompute after resumption counts tokens of batches it no longer owns."""


def stagger_never_pending(step: "scheduling._Step", r: int) -> bool:
    """async_stagger_ignored (replaces schedule._stagger_pending): the
    `current_step < next_decode_eligible_step` skip is gone, so two decodes of
    one request may be scheduled in consecutive steps (S6'), against the
    workers' sampled-token broadcast ring of pp_size slots."""
    return False


def placeholders_reach_max_tokens_one_late(step: "scheduling._Step", r: int) -> bool:
    """async_max_tokens_guard_off_by_one (replaces
    schedule._placeholders_reach_max_tokens): `num_computed + 1 -
    placeholders` instead of `+ 2`, so the guard never fires and a decode is
    scheduled whose token can only go past max_tokens (IA2)."""
    req = step.state.requests[r]
    return req.placeholders > 0 and req.num_computed + 1 - req.placeholders >= req.prompt_len + req.max_tokens


def admit_taking_stale_placeholders(step: "scheduling._Step", r: int, hit_tokens: int, num_new: int) -> None:
    """async_decode_on_stale_placeholder (replaces schedule._admit): a
    preempted request resumed at once (drop mode) takes its stale sampling
    entries still in flight as its own placeholders, so the running loop
    schedules decodes on tokens that belong to the old, dropped output (IA1)."""
    state = step.state
    was_preempted = state.requests[r].status is Status.PREEMPTED
    stale = sum(1 + e.drafts for e in state.entries_of(r, fate=Fate.ORPHANED) if e.samples)
    state = replace(state, waiting=tuple(x for x in state.waiting if x != r), running=state.running + (r,))
    if was_preempted:
        state = scheduling._supersede_orphans(state, r)
    step.state = state.with_request(r, status=Status.RUNNING, num_computed=hit_tokens, placeholders=stale)
    scheduling._add_entry(step, r, num_new, cached=hit_tokens)


# --- the hardened 0.33 variant's guards (hunted under vllm-0.33-hardened, names reused) -------

def has_stale_output_truthy(req: Request) -> bool:
    """stale_tested_by_truthiness (replaces schedule._has_positive_stale_output):
    the hardened waiting loop tests the stale count for truthiness again, as
    vLLM 0.33 does (`num_stale_output_tokens and not drop_stale_output`): a
    count a reused name drove below 0 defers the request for ever, and the
    engine spins on empty batches (L4)."""
    return req.num_stale != 0 and not req.drop_stale


def in_flight_not_floored(state: State, cfg: Config, r: int) -> State:
    """in_flight_below_zero (replaces actions._floor_in_flight): the in-flight
    counter is left as settled, so an old incarnation's output bound to r
    through a reused name drives it below 0, as in vLLM 0.33 (IF0)."""
    return state
