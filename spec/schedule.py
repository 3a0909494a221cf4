"""The `schedule` action: vLLM V1's policy for forming one batch.

Running requests first, in order, each skipped when it has nothing left to
schedule (`num_new_tokens == 0`: its known tokens are all in flight, or it
waits for its sampled token); when blocks run out, the last running request is
preempted (recompute) until the current one fits. Then, only if nothing was
preempted, FCFS admission from the head of `waiting` with prefix-cache hits.
`num_computed` is advanced once the batch is formed, so the snapshot records
the pre-batch counts.

The action is deterministic: given the state, the batch is fixed. The
environment has no choice here.

Abstracted away: encoder inputs and budgets, LoRA limits, structured-output
grammars (WAITING_FOR_FSM), priorities, KV connectors, and the detail that
vLLM trims a request's draft list only when some drafts were scheduled: here
the unscheduled drafts are always dropped, so a clipped decode cannot leave
drafts behind to be scheduled as a second sampling entry.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import blocks
from .config import Config
from .state import Batch, Entry, Fate, State, Status, content_label, retire_entries


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


@dataclass(frozen=True)
class Scheduled:
    state: State
    entries: tuple[ScheduledEntry, ...]
    preempted: tuple[int, ...]


class _Step:
    """The batch under construction (local to one `schedule` call)."""

    def __init__(self, state: State, cfg: Config) -> None:
        self.state, self.cfg = state, cfg
        self.budget = cfg.max_num_batched_tokens
        self.entries: list[ScheduledEntry] = []
        self.preempted: list[int] = []
        self.new_blocks: tuple[int, ...] = ()   # set by the last successful _allocate
        self.advance: dict[int, int] = {}       # tokens each scheduled request computes


def is_schedule_enabled(state: State, cfg: Config) -> bool:
    """Room in the pipeline, and (one-batch-per-request) vLLM 0.8.4's engine gate."""
    if len(state.in_flight) >= cfg.num_stages:
        return False
    if cfg.is_mutant("schedule_blocked_when_idle") and not state.in_flight:
        return False
    if not cfg.continue_prefill:
        unscheduled = len(state.waiting) + len(state.running) - len(state.scheduled_ids)
        return unscheduled > 0
    return True


def schedule(state: State, cfg: Config) -> Scheduled | None:
    """Form the next batch; None when disabled or when it would do nothing."""
    if not is_schedule_enabled(state, cfg):
        return None
    step = _Step(state, cfg)
    _schedule_running(step)
    if not step.preempted or cfg.is_mutant("admit_after_preemption"):
        _schedule_waiting(step)
    if not step.entries and not step.preempted:
        return None
    return Scheduled(_launch(step), tuple(step.entries), tuple(step.preempted))


def _clip(step: _Step, r: int, num_new: int, is_admission: bool) -> int:
    cfg, req = step.cfg, step.state.requests[r]
    threshold = cfg.long_prefill_token_threshold
    if 0 < threshold < num_new and not (is_admission and cfg.is_mutant("threshold_ignored_on_admission")):
        num_new = threshold
    if not (cfg.is_mutant("budget_ignored") and not is_admission):
        num_new = min(num_new, step.budget)
    return max(0, min(num_new, cfg.max_model_len - req.num_computed))


def _schedule_running(step: _Step) -> None:
    i = 0
    while i < len(step.state.running) and step.budget > 0:
        r = step.state.running[i]
        if not step.cfg.continue_prefill and r in step.state.scheduled_ids:
            i += 1
            continue
        num_new = _clip(step, r, step.state.num_new_tokens(r), is_admission=False)
        if num_new == 0:
            if not _decodes_anyway(step, r):
                i += 1          # all known tokens in flight, or waiting for its token
                continue
            num_new = 1
        while not _allocate(step, r, num_new, hit=()):
            victim = step.state.running[-1]
            _preempt(step, victim)
            if victim == r:
                return
        _add_entry(step, r, num_new, cached=0)
        i += 1


def _decodes_anyway(step: _Step, r: int) -> bool:
    """Mutant: the gate removed, a decode goes in while its token is in flight."""
    req = step.state.requests[r]
    return (step.cfg.is_mutant("decode_while_token_in_flight")
            and req.num_computed >= req.num_tokens
            and req.num_computed < step.cfg.max_model_len)


def _schedule_waiting(step: _Step) -> None:
    cfg = step.cfg
    while step.state.waiting and step.budget > 0:
        if len(step.state.running) >= cfg.max_num_seqs and not cfg.is_mutant("max_num_seqs_ignored"):
            break
        r = step.state.waiting[0]
        hit = _prefix_hit(step.state, cfg, r)
        num_new = _clip(step, r, step.state.requests[r].num_tokens - len(hit) * cfg.block_size,
                        is_admission=True)
        if num_new == 0 or not _allocate(step, r, num_new, hit):
            break                                       # FCFS: head-of-line blocks
        _admit(step, r, len(hit) * cfg.block_size, num_new)


def _prefix_hit(state: State, cfg: Config, r: int) -> tuple[int, ...]:
    """Cached blocks of r's known tokens, never all of them (the last token is recomputed)."""
    if not cfg.prefix_caching:
        return ()
    req = state.requests[r]
    labels = [content_label(state, r, i, cfg.block_size) for i in range(req.num_tokens // cfg.block_size)]
    return blocks.lookup_hit(state.pool, labels, (req.num_tokens - 1) // cfg.block_size)


def _allocate(step: _Step, r: int, num_new: int, hit: tuple[int, ...]) -> bool:
    """vLLM's allocate_slots: room for num_computed (+ hit) + num_new tokens."""
    state, cfg = step.state, step.cfg
    req = state.requests[r]
    computed = req.num_computed + len(hit) * cfg.block_size
    total = computed + num_new
    required = total // cfg.block_size if cfg.is_mutant("no_block_for_last_token") \
        else blocks.cdiv(total, cfg.block_size)
    num_fresh = max(0, required - len(req.block_table) - len(hit))
    if not blocks.can_allocate(state.pool, num_fresh, hit):
        return False
    pool, fresh = blocks.pop_fresh(blocks.touch(state.pool, hit), num_fresh)
    table = req.block_table + hit + fresh
    if cfg.prefix_caching:
        drafts = max(0, total - req.num_tokens)
        num_full = (total - drafts) // cfg.block_size
        labels = [content_label(state, r, i, cfg.block_size) for i in range(num_full)]
        pool = blocks.cache_labels(pool, table, labels)
    step.state = replace(state, pool=pool).with_request(r, block_table=table)
    step.new_blocks = hit + fresh
    return True


def _preempt(step: _Step, victim: int) -> None:
    """Recompute preemption: free everything, back to the head of `waiting`."""
    state = step.state
    req = state.requests[victim]
    state = replace(state, pool=blocks.free_table(state.pool, req.block_table),
                    running=state.running[:-1], waiting=(victim,) + state.waiting)
    if not step.cfg.is_mutant("inflight_set_not_cleared_on_preemption"):
        state = replace(state, scheduled_ids=state.scheduled_ids - {victim})
    state = retire_entries(state, victim, frozenset({Fate.LIVE}), Fate.ORPHANED)
    if step.cfg.is_mutant("preemption_clears_inflight_drafts"):
        state = _clear_inflight_drafts(state, victim)
    keep = req.num_computed if step.cfg.is_mutant("preempt_keeps_counter") else 0
    step.state = state.with_request(victim, status=Status.PREEMPTED, num_computed=keep,
                                    num_drafts=0, block_table=())
    step.preempted.append(victim)


def _admit(step: _Step, r: int, hit_tokens: int, num_new: int) -> None:
    state = step.state
    was_preempted = state.requests[r].status is Status.PREEMPTED
    state = replace(state, waiting=state.waiting[1:], running=state.running + (r,))
    if was_preempted and not step.cfg.is_mutant("orphan_kept_after_reschedule"):
        stale_to = Fate.LIVE if step.cfg.is_mutant("stale_output_applied_to_resumed") else Fate.SUPERSEDED
        state = retire_entries(state, r, frozenset({Fate.ORPHANED}), stale_to)
    step.state = state.with_request(r, status=Status.RUNNING, num_computed=hit_tokens)
    _add_entry(step, r, num_new, cached=hit_tokens)


def _add_entry(step: _Step, r: int, num_new: int, cached: int) -> None:
    req = step.state.requests[r]
    drafts = min(req.num_drafts, max(0, req.num_computed + num_new - req.num_tokens))
    cfg = step.cfg
    start = 0 if cached and cfg.is_mutant("snapshot_omits_prefix_hit") else req.num_computed
    samples = start + num_new - drafts >= req.num_tokens
    if cfg.is_mutant("stale_drafts_on_prefill_chunk") and not samples and cfg.num_spec_tokens:
        drafts = 1
    charged, recorded_start, recorded_n = num_new, start, num_new
    if (cfg.is_mutant("overlapping_chunks") and step.state.entries_of(r)
            and step.budget > num_new and start > 0
            and not 0 < cfg.long_prefill_token_threshold <= num_new):
        recorded_start, recorded_n, charged = start - 1, num_new + 1, num_new + 1
    step.entries.append(ScheduledEntry(r, recorded_start, recorded_n, cached, drafts, samples,
                                       step.new_blocks))
    step.state = step.state.with_request(r, num_drafts=drafts if samples else 0)  # unscheduled drafts dropped
    step.advance[r] = num_new
    if not cfg.is_mutant("budget_ignored"):
        step.budget -= charged


def _launch(step: _Step) -> State:
    """Advance every scheduled request's counter and put the batch in flight."""
    state, cfg = step.state, step.cfg
    batch: Batch = tuple(Entry(e.req, e.start, e.n, e.samples, e.drafts) for e in step.entries)
    for e in step.entries:
        req = state.requests[e.req]
        if not cfg.is_mutant("advance_at_completion"):
            state = state.with_request(e.req, num_computed=req.num_computed + step.advance[e.req])
        if not cfg.continue_prefill:
            state = replace(state, scheduled_ids=state.scheduled_ids | {e.req})
        if cfg.is_mutant("shared_snapshot"):
            state = _overwrite_live_snapshots(state, e)
    if not batch and not cfg.is_mutant("empty_batch_submitted"):
        return state
    return replace(state, in_flight=state.in_flight + (batch,))


def _clear_inflight_drafts(state: State, r: int) -> State:
    """Mutant: r's in-flight entries share its draft list, cleared by preemption."""
    def clear(e: Entry) -> Entry:
        return replace(e, drafts=0) if e.req == r else e
    return replace(state, in_flight=tuple(tuple(clear(e) for e in b) for b in state.in_flight))


def _overwrite_live_snapshots(state: State, new: ScheduledEntry) -> State:
    """Mutant: earlier in-flight entries of the request alias the new snapshot."""
    def alias(e: Entry) -> Entry:
        if e.req == new.req and e.fate is Fate.LIVE:
            return replace(e, start=new.start, n=new.n, samples=new.samples, drafts=new.drafts)
        return e
    return replace(state, in_flight=tuple(tuple(alias(e) for e in b) for b in state.in_flight))
