"""Where a request's drafts come from (speculative decoding), by version
profile (`Profile.draft_source`), and vLLM 0.33's padded admissions.

* "completion" (vLLM 0.8.x): the completion of a request's sampling entry
  brings the drafts for its next step (`Sample.next_drafts`, actions.py).
* "submission" (0.33, synchronous scheduling): the engine hands the
  scheduler the drafts proposed for the batch it has just submitted, in the
  same engine step, before that batch completes (`EngineCore.post_step` ->
  `Scheduler.update_draft_token_ids`): the environment's action
  `hand_over_drafts`, right after a `schedule`. The completion brings none.
  With pipeline parallelism a request whose hand-off holds more drafts than
  its entry in flight scheduled is scheduled again at once, on those drafts
  alone: a second sampling entry while the first is in flight (S6).
* "placeholders" (0.33, asynchronous scheduling): every entry that is not
  a prefill chunk leaves its request k placeholder drafts
  (`AsyncScheduler._update_after_schedule`); the worker fills them in, and
  the completion brings none (`placeholder_drafts`, read by schedule.py).

Abstracted away: the drafts' token values (only their number matters to the
scheduler), structured outputs' grammar checks of drafts
(`update_draft_token_ids_in_output`, `validate_tokens`), dynamic draft
lengths (`num_speculative_tokens_per_batch_size`) and EAGLE's lookahead slots.
"""

from __future__ import annotations

from collections.abc import Sequence

from .config import Config
from .state import Entry, Fate, State


def drafts_come_with_output(cfg: Config) -> bool:
    """Whether a completion brings the drafts for its request's next step."""
    return cfg.rules.draft_source == "completion"


def placeholder_drafts(cfg: Config) -> int | None:
    """The drafts a sampling entry leaves its request when it is scheduled:
    k under async scheduling (`[-1] * num_spec_tokens_to_schedule`); None
    elsewhere (the request keeps the count `schedule` left it)."""
    return cfg.num_spec_tokens if cfg.rules.draft_source == "placeholders" else None


def hand_over_drafts(state: State, cfg: Config, proposals: Sequence[tuple[int, int]]) -> State | None:
    """vLLM 0.33 `EngineCore.post_step` (synchronous scheduling): the drafts
    proposed for the newest batch, `(request, count)` for each of its
    entries, go to `Scheduler.update_draft_token_ids`: a request that is no
    longer unfinished and RUNNING is skipped, one whose entry was a prefill
    chunk drops its drafts, any other now holds `count` (0..k) on top of the
    tokens its entry scheduled. Guard: the profile takes drafts at
    submission, the newest batch holds each named request once, counts in 0..k."""
    if cfg.rules.draft_source != "submission" or not state.in_flight:
        return None
    newest = {e.req: e for e in state.in_flight[-1]}
    if len({r for r, _ in proposals}) != len(proposals):
        return None
    for r, count in proposals:
        entry = newest.get(r)
        if entry is None or not 0 <= count <= cfg.num_spec_tokens:
            return None
        state = _take_drafts(state, entry, count)
    return state


def _take_drafts(state: State, entry: Entry, count: int) -> State:
    """One request's share of the hand-off. The spec keeps the drafts a
    sampling entry scheduled in `num_drafts` until it completes (S1's
    bound); proposed drafts beyond them are what the next `schedule` sees
    (vLLM: `num_tokens_with_spec - num_computed_tokens` = count - scheduled)."""
    req = state.requests[entry.req]
    if entry.fate is not Fate.LIVE or not req.status.is_active:
        return state
    if not entry.samples:
        return state.with_request(entry.req, num_drafts=0)
    return state.with_request(entry.req, num_drafts=max(count, entry.drafts))


def padded_admission(state: State, cfg: Config, r: int, hit_tokens: int,
                     running_entries: Sequence[int], budget: int) -> int:
    """vLLM 0.33's waiting loop (`Profile.pads_admitted_decodes`): `1 + k`
    when r, with exactly one token left past its hit, is admitted padded with
    k placeholder drafts; -1 when that padding exceeds the budget left
    (admission stops there); 0 otherwise. `running_entries`: the requests the
    running loop scheduled in this call."""
    req = state.requests[r]
    if not cfg.rules.pads_admitted_decodes or not cfg.num_spec_tokens or req.num_tokens - hit_tokens != 1:
        return 0
    if any(_last_entry_was_prefill_chunk(state, x) for x in running_entries):
        return 0
    if not running_entries and hit_tokens == 0:
        return 0
    padded = 1 + cfg.num_spec_tokens
    if hit_tokens + padded + 1 > cfg.max_model_len:
        return 0
    return -1 if padded > budget else padded


def _last_entry_was_prefill_chunk(state: State, r: int) -> bool:
    """vLLM's `request.is_prefill_chunk` as the request's previous entry left
    it (`Scheduler._update_after_schedule`), read before this call's entry:
    its newest live entry in flight did not sample; with none in flight,
    its counter stops more than one token short of its known tokens (a
    completed sampling entry leaves it exactly one short; the abstraction: a
    completed prefill chunk that also stopped one short reads as a decode)."""
    live = state.entries_of(r)
    if live:
        return not live[-1].samples
    req = state.requests[r]
    return req.num_computed < req.num_tokens + req.placeholders - 1
