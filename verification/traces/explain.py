"""Why the spec schedules what it does: the guard of spec/schedule.py that
holds a waiting or running request back, in the user's request names.

check-trace rejects a batch the spec would not form: when the spec forms
nothing (`illegal_schedule`), "the spec schedules nothing here" alone would
leave the user to replay the spec by hand; when it forms another batch
(`schedule_decision`), the user sees both batches but not why a request of
theirs is missing from the spec's. This module walks `schedule`'s own guards
in `schedule`'s own order (the queue gate, then the running loop, then the
waiting loop) and says which one stops each request. It invents no rule:
every test below is the spec's function (or the same comparison the spec's
loop makes: the budget it has spent, the seats it has filled), so when the
spec changes, the explanation follows.
"""

from __future__ import annotations

from typing import Callable

from flightcheck.spec import Config, State, Status
from flightcheck.spec.lookahead import tokens_needing_slots
from flightcheck.spec.schedule import (
    _allocate,
    _clip,
    _fits_whole,
    _has_free_seat,
    _is_resumption_deferred,
    _needs_a_chunk,
    _num_new_waiting,
    _num_required_blocks,
    _placeholders_reach_max_tokens,
    _prefix_hit,
    _stagger_pending,
    _Step,
    _threshold_in_force,
    Scheduled,
    is_schedule_enabled,
)

Namer = Callable[[int], str]


def why_nothing_scheduled(state: State, cfg: Config, name: Namer) -> str:
    """Why `schedule(state, cfg)` forms no batch and preempts nobody: the
    queue gate if it is closed, else one reason per waiting or running
    request, in the order the spec's loops visit them."""
    if len(state.in_flight) >= cfg.queue_depth:
        return (f"the pipeline is full ({len(state.in_flight)} batches in flight, at most "
                f"{cfg.queue_depth})")
    loading = [f"{name(r)} waits for its KV load (WAITING_FOR_REMOTE_KVS, load "
               f"{state.requests[r].load.value})" for r in state.kv_holding if state.requests[r].load.in_transfer]
    if not state.running and not state.waiting:
        return "; ".join(["the spec schedules nothing here"] + loading) if loading else \
            "no request is waiting or running"
    if not is_schedule_enabled(state, cfg):         # the queue has room: vLLM 0.8.4's engine gate
        return ("every waiting or running request has a batch in flight (one batch per request: "
                "policy one-batch-per-request)")
    step = _Step(state, cfg)
    reasons = [f"{name(r)} {_why_running_waits(step, r)}" for r in step.state.running]
    reasons += loading + _why_waiting_wait(step, name)
    return "the spec schedules nothing here: " + "; ".join(reasons)


def why_left_out(state: State, cfg: Config, scheduled: Scheduled, r: int, name: Namer) -> str:
    """Why the spec's schedule step from `state` (`scheduled`) leaves out
    request r, which the trace schedules: the guard that stopped r when the
    spec's loop reached it, with the budget, seats and blocks that the
    requests scheduled before it left."""
    if r in scheduled.preempted:
        return (f"{name(r)} is preempted in this step (the running requests up to it need more blocks "
                "than are free; the spec preempts from the tail of the running list)")
    if r in state.running:
        before = state.running[:state.running.index(r)]
        if _budget_left(cfg, scheduled, before) <= 0:
            return f"{name(r)} is not reached: the token budget ({cfg.max_num_batched_tokens}) is spent"
        return f"{name(r)} {_why_running_waits(_Step(state, cfg), r)}"
    if r not in state.waiting:
        return f"{name(r)} is {state.requests[r].status.value} in the spec"
    if scheduled.preempted:
        return (f"{name(r)} is not admitted: the step preempted "
                f"{', '.join(name(x) for x in scheduled.preempted)}, and admits no one after a preemption")
    left = _budget_left(cfg, scheduled, state.running + state.waiting)
    if left <= 0:
        return f"{name(r)} is not reached: the token budget ({cfg.max_num_batched_tokens}) is spent"
    return _why_waiting_left_out(state, cfg, scheduled, r, left, name)


def _why_waiting_left_out(state: State, cfg: Config, scheduled: Scheduled, r: int, left: int,
                          name: Namer) -> str:
    """Waiting request r after the step's admissions: the waiting loop stopped
    at a full house, or at the first request it could not admit (r or one
    ahead of r), with `left` tokens of budget."""
    step = _Step(scheduled.state, cfg)
    step.budget, step.threshold = left, _threshold_in_force(state, cfg)
    if not _has_free_seat(step):
        return f"{name(r)} waits for a seat (max_num_seqs is {cfg.max_num_seqs}; {len(step.state.running)} running)"
    for x in step.state.waiting:
        if _is_resumption_deferred(step.state, cfg, x):
            if x == r:
                return f"{name(r)} is preempted with output still in flight (its resumption waits)"
            continue
        if x == r:
            return f"{name(r)} {_why_not_admitted(step, r)}"
        return f"{name(r)} waits behind {name(x)} (first come, first served), which {_why_not_admitted(step, x)}"
    return f"{name(r)} is not waiting after the step (a bug in check-trace)"


def _budget_left(cfg: Config, scheduled: Scheduled, requests: tuple[int, ...]) -> int:
    """The token budget left after the step's entries of `requests`."""
    among = set(requests)
    return cfg.max_num_batched_tokens - sum(e.n for e in scheduled.entries if e.req in among)


def _why_running_waits(step: _Step, r: int) -> str:
    """The running loop's guard that skips running request r (in the order
    `_schedule_running` tests them)."""
    cfg, req = step.cfg, step.state.requests[r]
    if not cfg.continue_prefill and r in step.state.scheduled_ids:
        return "has a batch in flight (one batch per request)"
    if _placeholders_reach_max_tokens(step, r):
        return (f"has {req.placeholders} output placeholders in flight, which reach its max_tokens "
                f"({req.max_tokens})")
    if _stagger_pending(step, r):
        return (f"waits {req.decode_countdown} more schedule() call(s) of its decode stagger "
                f"({cfg.stagger})")
    if step.state.num_new_tokens(r) <= 0:
        return _nothing_left(step.state, r)
    if _clip(step, r, step.state.num_new_tokens(r)) == 0:
        return _no_room(cfg, req.num_computed)
    return "would be scheduled (the spec's own schedule disagrees: a bug in check-trace)"


def _nothing_left(state: State, r: int) -> str:
    """A running request with no token to schedule: its known tokens are all
    scheduled, and the one it needs next is sampled by a batch in flight."""
    req, in_flight = state.requests[r], len(state.entries_of(r))
    if not in_flight:
        return f"has nothing left to schedule ({req.num_computed} tokens computed)"
    batches = "1 batch" if in_flight == 1 else f"{in_flight} batches"
    return (f"has nothing left to schedule: all its {req.num_computed} tokens are scheduled, in "
            f"{batches} in flight (it waits for the token {'it' if in_flight == 1 else 'the last'} samples)")


def _why_waiting_wait(step: _Step, name: Namer) -> list[str]:
    """One reason per waiting request, as `_schedule_waiting` meets them:
    no free seat stops the loop; a deferred resumption is skipped; the first
    request that cannot be admitted blocks every request behind it (FCFS)."""
    state, cfg = step.state, step.cfg
    if not state.waiting:
        return []
    if not _has_free_seat(step):
        waiting = ", ".join(name(r) for r in state.waiting)
        return [f"{waiting} wait{'s' if len(state.waiting) == 1 else ''} for a seat "
                f"(max_num_seqs is {cfg.max_num_seqs}; {len(state.running)} running)"]
    reasons = []
    for i, r in enumerate(state.waiting):
        if _is_resumption_deferred(state, cfg, r):
            reasons.append(f"{name(r)} is preempted with output still in flight (its resumption waits "
                           "until that output is back)")
            continue
        reasons.append(f"{name(r)} {_why_not_admitted(step, r)}")
        behind = [name(x) for x in state.waiting[i + 1:]]
        if behind:
            reasons.append(f"{', '.join(behind)} wait{'s' if len(behind) == 1 else ''} behind "
                           f"{name(r)} (first come, first served)")
        break
    return reasons


def _why_not_admitted(step: _Step, r: int) -> str:
    """The waiting loop's guard that stops admitting r (in the order
    `_schedule_waiting` tests them)."""
    state, cfg = step.state, step.cfg
    req = state.requests[r]
    what = "cannot resume" if req.status is Status.PREEMPTED else "cannot be admitted"
    hit = _prefix_hit(state, cfg, r)
    num_new = _num_new_waiting(step, r, hit)
    if num_new == 0:
        return f"{what}: {_no_room(cfg, len(hit) * cfg.block_size)}"
    if _needs_a_chunk(step, r, hit):
        return (f"{what}: chunked prefill is off and its {req.num_tokens - len(hit) * cfg.block_size} "
                f"new tokens exceed the {step.budget} of budget left")
    free = _free_blocks(state, hit)
    if not _fits_whole(step, r, hit):
        whole = _num_required_blocks(cfg, min(req.num_tokens, cfg.max_model_len)) - len(hit)
        return (f"{what}: its whole sequence ({req.num_tokens} tokens) needs {whole} KV blocks "
                f"beyond its prefix-cache hit, {_are_free(free)}")
    if not _allocate(_Step(state, cfg), r, num_new, hit):
        total = len(hit) * cfg.block_size + num_new
        needed = _num_required_blocks(cfg, tokens_needing_slots(cfg, total, async_load=False)) - len(hit)
        return (f"{what}: its first {num_new} tokens need {needed} new KV blocks, {_are_free(free)}")
    return "would be admitted (the spec's own schedule disagrees: a bug in check-trace)"


def _free_blocks(state: State, hit: tuple[int, ...]) -> int:
    """The free blocks an allocation may take: the free queue less the hit's
    evictable blocks (the count `blocks.can_allocate` compares with)."""
    return len(state.pool.free_queue) - sum(1 for b in hit if state.pool.ref_counts[b] == 0)


def _are_free(count: int) -> str:
    return "1 is free" if count == 1 else f"{count} are free"


def _no_room(cfg: Config, num_computed: int) -> str:
    slot = " (less the sampled token's slot)" if cfg.rules.sampled_token_slot else ""
    return (f"no room below max_model_len ({cfg.max_model_len}){slot}: {num_computed} tokens computed")

