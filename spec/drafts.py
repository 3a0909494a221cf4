"""Where a request's drafts come from (speculative decoding), by version
profile (`Profile.draft_source`), and vLLM 0.33's padded admissions.

* "completion" (vLLM 0.8.x): the completion of a request's sampling entry
  brings the drafts for its next step (`Sample.next_drafts`, actions.py).
* "submission" (0.33, synchronous scheduling): the engine hands the
  scheduler the drafts proposed for the batch it has just submitted, in the
  same engine step, before that batch completes (`EngineCore.post_step` ->
  `Scheduler.update_draft_token_ids`). Until the request is scheduled
  again nothing tells this from drafts that come with the completion, so
  the spec keeps `Sample.next_drafts` for them and adds the one difference
  as the environment's action `hand_over_drafts`: with pipeline parallelism
  a request whose hand-off holds more drafts than its entry in flight
  scheduled is scheduled again before that entry completes, on those
  drafts alone: a second sampling entry in flight (S5, S6). The model
  checkers do not explore that action yet; check-trace takes it from the
  trace (verification/traces/drafts.py).
* "placeholders" (0.33, asynchronous scheduling): every entry that is not
  a prefill chunk leaves its request k placeholder drafts
  (`AsyncScheduler._update_after_schedule`); the worker fills them in, and
  the completion brings none (`placeholder_drafts`, read by schedule.py).

What held drafts do to caching (`Profile.held_drafts_left_uncached`, read
here only): under vLLM 0.8.x every draft a request holds is left out of the
blocks an allocation caches, scheduled or not, and a preempted request holds
its drafts to its resumption (`drafts_left_uncached`,
`drafts_after_preemption`); elsewhere only the scheduled drafts are left out
and a preemption clears them. The admission that resumes the request
schedules none of them and drops them (schedule.py's `_add_entry`), as the
running loop drops the drafts a clip leaves unscheduled: vLLM 0.8.x keeps
both until the completion replaces them, which only pipeline parallelism
can tell apart (README "Speculative decoding": the drafts scheduled twice).

Abstracted away: the drafts' token values (only their number matters to the
scheduler), structured outputs' grammar checks of drafts
(`update_draft_token_ids_in_output`, `validate_tokens`), dynamic draft
lengths (`num_speculative_tokens_per_batch_size`) and EAGLE's lookahead slots.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import blocks
from .config import Config
from .state import State, Status


def drafts_come_with_output(cfg: Config) -> bool:
    """Whether a completion brings the drafts for its request's next step
    (as far as the scheduler can tell: also when they were handed over at
    submission and not used before the completion)."""
    return cfg.rules.draft_source in ("completion", "submission")


def placeholder_drafts(cfg: Config) -> int | None:
    """The drafts a sampling entry leaves its request when it is scheduled:
    k under async scheduling (`[-1] * num_spec_tokens_to_schedule`); None
    elsewhere (the request keeps the count `schedule` left it)."""
    return cfg.num_spec_tokens if cfg.rules.draft_source == "placeholders" else None


def hand_over_drafts(state: State, cfg: Config, r: int, count: int) -> State | None:
    """vLLM 0.33 `EngineCore.post_step` -> `Scheduler.update_draft_token_ids`
    (synchronous scheduling): r now holds the `count` (0..k) drafts proposed
    for its last entry. Guard: the profile takes drafts at submission, r is
    RUNNING, and its newest live entry in flight, if any, samples (a prefill
    chunk's hand-off drops the drafts: `is_prefill_chunk`; `schedule` leaves
    none then). The environment's choice: vLLM hands them over in the engine
    step that submitted that entry; here they may come any time before r is
    scheduled again (a superset of vLLM's interleavings: check-trace learns
    the count only when the trace shows it).

    While that entry is in flight r's counter counts the drafts it
    scheduled, so r holds at least those (S1's bound); proposed drafts beyond
    them are what the next `schedule` sees (vLLM: `num_tokens_with_spec -
    num_computed_tokens` = count - scheduled), fewer leave nothing to
    schedule, as in vLLM; the entry's completion brings `count` again."""
    if cfg.rules.draft_source != "submission" or not 0 <= count <= cfg.num_spec_tokens:
        return None
    req = state.requests[r]
    if req.status is not Status.RUNNING:
        return None
    live = state.entries_of(r)
    if live and not live[-1].samples:
        return None
    scheduled = max((e.drafts for e in live), default=0)
    return state.with_request(r, num_drafts=max(count, scheduled))


def drafts_left_uncached(cfg: Config, num_drafts_held: int, num_drafts_scheduled: int) -> int:
    """The drafts an allocation leaves out of the blocks it caches (they may
    be rejected). vLLM 0.8.4/0.8.5 `KVCacheManager.allocate_slots`: all the
    request holds, `len(request.spec_token_ids)` at the call (the running
    loop trims them after it, the waiting loop not at all); 0.33
    `allocate_slots` (`min(num_computed_tokens + num_new_tokens,
    request.num_tokens)`): only those scheduled."""
    if cfg.rules.held_drafts_left_uncached:
        return max(num_drafts_held, num_drafts_scheduled)
    return num_drafts_scheduled


def unclipped_demand_fits(state: State, cfg: Config, r: int, threshold: int, budget: int) -> bool:
    """Whether the blocks vLLM 0.8.4's running loop asks for can be had
    (`Profile.demands_blocks_past_max_model_len`; always true elsewhere):
    `Scheduler.schedule` clips `num_tokens_with_spec - num_computed_tokens`
    by the long-prefill threshold and the budget only, not by max_model_len,
    and `KVCacheManager.allocate_slots` fails when the blocks for all of them
    exceed the free ones: r's drafts past max_model_len can get it preempted
    where 0.8.5 schedules it clipped."""
    if not cfg.rules.demands_blocks_past_max_model_len:
        return True
    req = state.requests[r]
    num_new = state.num_new_tokens(r)
    if 0 < threshold < num_new:
        num_new = threshold
    num_new = min(num_new, budget)
    needed = blocks.cdiv(req.num_computed + num_new, cfg.block_size) - len(req.block_table)
    return blocks.can_allocate(state.pool, max(0, needed), ())


def drafts_after_preemption(cfg: Config, num_drafts_held: int) -> int:
    """The drafts a preempted request keeps. vLLM 0.8.4/0.8.5
    `Scheduler.schedule`, preemption branch: only `status` and
    `num_computed_tokens` are reset, so all of them (its resumption's
    allocation leaves them uncached: `drafts_left_uncached`); 0.33
    `_preempt_request`: `spec_token_ids = []`."""
    return num_drafts_held if cfg.rules.held_drafts_left_uncached else 0


def keeps_prefill_chunk_flag(cfg: Config) -> bool:
    """Whether the padding rule reads `Request.is_prefill_chunk`, so the
    state keeps it (cadence.mark_prefill_chunk sets it where vLLM's
    `Scheduler._update_after_schedule` does): a profile that pads admitted
    decodes, with drafts. Elsewhere the flag stays False (no state count of
    a model without drafts, or under 0.8.x, moves)."""
    return cfg.rules.pads_admitted_decodes and cfg.num_spec_tokens > 0


def padded_admission(state: State, cfg: Config, r: int, hit_tokens: int,
                     running_entries: Sequence[int], budget: int) -> int:
    """vLLM 0.33/0.34's waiting loop (`Scheduler.schedule`,
    `Profile.pads_admitted_decodes`): `1 + k` when r, with exactly one token
    left past its hit, is admitted padded with k placeholder drafts; -1 when
    that padding exceeds the budget left (admission stops there: "prefer not
    to schedule than schedule un-padded"); 0 otherwise. `running_entries`:
    the requests the running loop scheduled in this call; the running loop's
    `prefill_scheduled |= request.is_prefill_chunk` reads the flag each one's
    previous schedule left (`_update_after_schedule`), kept in the state
    (`keeps_prefill_chunk_flag`) and set only when this call launches."""
    req = state.requests[r]
    if not keeps_prefill_chunk_flag(cfg) or req.num_tokens - hit_tokens != 1:
        return 0
    if any(state.requests[x].is_prefill_chunk for x in running_entries):
        return 0
    if not running_entries and hit_tokens == 0:
        return 0
    padded = 1 + cfg.num_spec_tokens
    if hit_tokens + padded + 1 > cfg.max_model_len:
        return 0
    return -1 if padded > budget else padded
