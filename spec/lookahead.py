"""A drafter with its own forward pass (vLLM 0.33/0.34: a draft model,
EAGLE): the KV slots the scheduler reserves past an entry's tokens, and the
input slots the drafter takes from the batch's budget. Read where
`schedule.py` allocates and charges the budget, and by kv_loads.py's
reservations; `Profile.lookahead_slots` says which versions have them.

* Lookahead slots (`Config.num_lookahead_tokens`, vLLM's
  `VllmConfig.num_lookahead_tokens`: k for a draft model or EAGLE, 0 for
  n-gram): 0.34 `Scheduler.schedule` passes them to
  `KVCacheManager.allocate_slots(num_lookahead_tokens=...)`, which finds
  room for `min(computed + new + lookahead, max_model_len)` tokens; an async
  KV load gets none (`limit_lookahead_tokens`: "Allocate speculative
  lookahead slots later"). The async-load reservations count them too
  (`_spec_decode_step_blocks`, `_request_remaining_blocks`: `1 + k +
  lookahead` with drafts).
* Draft input slots (`Config.draft_input_slots`, vLLM's
  `SpeculativeConfig.max_num_new_slots_for_drafting`: 1 for a draft model,
  0 for EAGLE and n-gram): `Scheduler.schedule` keeps `input_budget` beside
  `token_budget` (both start at max_num_batched_tokens), charges each entry
  `num_new_tokens + draft_slots` to it, clips every entry to
  `input_budget - draft_slots` and stops both loops once
  `input_budget <= draft_slots`. That is one budget, the spec's
  `_Step.budget` = `input_budget - draft_slots` (never above
  `token_budget`), charged `n + draft_slots` per entry; `token_budget` itself
  is read only by 0.34's `loads_only` (`tokens_left`).

Abstracted away: skip_drafts' effect on the drafter (the worker's), DFlash's
k + 1 slots and `max_num_draft_seqs`, EAGLE's prefill and hash lookahead.
"""

from __future__ import annotations

from .config import Config


def lookahead_tokens(cfg: Config, async_load: bool) -> int:
    """The slots allocate_slots reserves past the entry (none for an async KV load)."""
    return 0 if async_load else cfg.num_lookahead_tokens


def tokens_needing_slots(cfg: Config, num_tokens: int, async_load: bool) -> int:
    """`KVCacheManager.allocate_slots`' `num_tokens_need_slot`: the entry's
    tokens and the lookahead slots, clipped at max_model_len; the entry's
    tokens alone without lookahead (as before)."""
    lookahead = lookahead_tokens(cfg, async_load)
    return min(num_tokens + lookahead, cfg.max_model_len) if lookahead else num_tokens


def initial_budget(cfg: Config) -> int:
    """`input_budget - draft_slots` before any entry (= max_num_batched_tokens without a draft model)."""
    return cfg.max_num_batched_tokens - cfg.draft_input_slots


def input_slots(cfg: Config) -> int:
    """What an entry takes from the budget beside its tokens (`input_budget -= num_new_tokens + draft_slots`)."""
    return cfg.draft_input_slots


def budget_spent(cfg: Config, scheduled: list[int]) -> bool:
    """Whether entries of these token counts leave the loops no budget
    (`input_budget <= draft_slots`; `token_budget <= 0` without a draft model)."""
    return initial_budget(cfg) - sum(scheduled) - cfg.draft_input_slots * len(scheduled) <= 0


def tokens_left(cfg: Config, budget: int, num_entries: int) -> int:
    """vLLM's `token_budget`, from the spec's budget and the batch's entries."""
    return budget + cfg.draft_input_slots * (num_entries + 1)


def step_tokens(cfg: Config) -> int:
    """One decode step's tokens with drafts, for the async-load reservations
    (`1 + num_spec_tokens + num_lookahead_tokens`; 0 without drafts)."""
    k = cfg.num_spec_tokens
    return 1 + k + cfg.num_lookahead_tokens if k else 0
