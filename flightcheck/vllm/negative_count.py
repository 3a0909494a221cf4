"""The differential's reading of vLLM 0.8.x's negative full-block count.

0.8.4 and 0.8.5 `KVCacheManager.allocate_slots` count the full blocks to
cache as `(num_computed_tokens + num_tokens - len(request.spec_token_ids)) //
block_size`; a request resumed holding the drafts it kept through its
preemption and given fewer tokens than those drafts gets a negative count, and
`BlockPool.cache_full_blocks` caches `blocks[num_cached_blocks:num_full_blocks]`,
every block of its table but the last ones (seed 376 index 149: `blocks[0:-1]`,
the first block). The reference caches nothing there (its released profiles
do as vLLM: reference/profiles.py `caches_through_a_negative_count`), so a
later admission of the request hits more in vLLM than in the reference.
"""

from __future__ import annotations

from typing import Any

# A `decisions` entry: (req, start, tokens, samples, cached, block ids, ..., drafts).
REQ, START, TOKENS, CACHED = 0, 1, 2, 4


def _entries(event: tuple[Any, ...] | None) -> dict[str, tuple[Any, ...]]:
    if event is None or event[0] != "schedule":
        return {}
    return {entry[REQ]: entry for entry in event[1]}


def _admissions_holding_drafts(truth: dict[str, Any], before: list[tuple[Any, ...]]) -> set[str]:
    """The requests vLLM admitted (before the difference) holding more drafts
    than the tokens they then had computed or scheduled: the ground truth's
    `drafts_held_at_admission`, each read at its batch (the n-th schedule
    decision with entries is batch n)."""
    held = {(item["batch"], item["req"]): item["drafts"] for item in truth.get("drafts_held_at_admission", ())}
    batches = [event for event in before if _entries(event)]
    negative: set[str] = set()
    for (batch, req), drafts in held.items():
        entry = _entries(batches[batch - 1]).get(req) if 0 < batch <= len(batches) else None
        if entry is not None and entry[START] + entry[TOKENS] < drafts:
            negative.add(req)
    return negative


def cached_through_a_negative_count(truth: dict[str, Any], before: list[tuple[Any, ...]],
                                    theirs: tuple[Any, ...] | None, ours: tuple[Any, ...] | None) -> bool:
    """Whether the first difference is an admission that hits more tokens in
    vLLM than in the reference, of a request that vLLM admitted before holding
    more drafts than its tokens (start + tokens): a negative count."""
    vllm_entries, reference_entries = _entries(theirs), _entries(ours)
    hits_more = {req for req, entry in vllm_entries.items()
                 if req in reference_entries and entry[CACHED] > reference_entries[req][CACHED]}
    return bool(hits_more and hits_more & _admissions_holding_drafts(truth, before))
