"""Rules over the decisions of two runs (`differential.decisions`) that the
differential's classifier reads to name a difference: drafts vLLM's sync
engine hands over at submission, blocks moved by a drifted request's
counters, and which requests a decision concerns. Each rule cites the vLLM
function that makes the difference; none decides a verdict alone
(differential.py `_classify` does)."""
from __future__ import annotations

from typing import Any


def _drafts_handed_over_early(vllm_result: dict[str, Any], before: list[tuple[Any, ...]],
                              theirs: tuple[Any, ...] | None, ours: tuple[Any, ...] | None) -> bool:
    """vLLM 0.33's sync engine handed drafts over at submission and they
    showed before the request's sampling entry completed: vLLM scheduled them
    on top of it (the ground truth's double sample), or a completion shows
    them (the two completions differ in their drafts alone), or they
    preempted a request whose token was still in flight
    (`_drafts_preempt_a_sampler_in_flight`)."""
    if vllm_result.get("async_scheduling") or not str(vllm_result.get("vllm_version")).startswith("0.3"):
        return False
    if _drafts_preempt_a_sampler_in_flight(vllm_result, before, theirs, ours):
        return True
    doubles = {item["req"] for item in (vllm_result.get("ground_truth") or {}).get("double_samples", ())}
    if doubles and _concerns(theirs, ours) & doubles:
        return True
    return (theirs is not None and ours is not None and theirs[0] == ours[0] == "complete"
            and theirs[:3] == ours[:3])


def _drafts_preempt_a_sampler_in_flight(vllm_result: dict[str, Any], before: list[tuple[Any, ...]],
                                       theirs: tuple[Any, ...] | None, ours: tuple[Any, ...] | None) -> bool:
    """vLLM 0.33/0.34's sync engine handed drafts over at submission, so its
    next `schedule()` asked blocks for a request's 1 + k tokens while the
    entry that sampled its token was still in flight, and preempted it (or
    another) there, where the reference, whose drafts come with that
    completion, completes a batch first (seed 375 index 41, `--all-features
    --spec-tokens 3`, sync, both releases: r2's drafts preempt it at
    decision 14). The conforming run must then equal vLLM's (`compare`)."""
    if vllm_result.get("async_scheduling") or not str(vllm_result.get("vllm_version")).startswith("0.3"):
        return False
    if theirs is None or ours is None or theirs[0] != "schedule" or ours[0] != "complete":
        return False
    return bool(_concerns(theirs) & _sampling_in_flight(before))


def _sampling_in_flight(events: list[tuple[Any, ...]]) -> set[str]:
    """Requests whose last scheduled entry samples and that no completion
    has given a token since (their token is still in flight)."""
    waiting: set[str] = set()
    for event in events:
        if event[0] == "schedule":
            waiting |= {entry[0] for entry in event[1] if entry[3]}
        elif event[0] == "complete":
            waiting -= {req for req, tokens in event[1] if tokens}
    return waiting


def _first_negative_schedule(events: list[tuple[Any, ...]]) -> int | None:
    """The index of the first `schedule` with an entry of fewer than 0 tokens."""
    return next((i for i, event in enumerate(events)
                 if event[0] == "schedule" and any(entry[2] < 0 for entry in event[1])), None)


def _preempted_since(events: list[tuple[Any, ...]]) -> set[str]:
    """Requests preempted in these decisions and not scheduled again since."""
    waiting: set[str] = set()
    for event in events:
        if event[0] == "schedule":
            waiting -= {entry[0] for entry in event[1]}
            waiting |= set(event[2])
    return waiting


def _drifted_blocks_moved(before: list[tuple[Any, ...]], theirs: tuple[Any, ...] | None,
                          ours: tuple[Any, ...] | None, drifted: set[str]) -> bool:
    """Two schedules that differ in block ids alone, one of them a block a
    drifted request held: vLLM 0.33/0.34 `Scheduler.update_from_output`
    caches a live output's settled blocks (`cache_blocks(request,
    num_computed_tokens - num_in_flight_tokens)`), so a num_in_flight_tokens
    an older batch drove below 0 hashes blocks past the settled tokens (up to
    `num_tokens`), and `BlockPool.free_blocks` appends a hashed block to the
    free queue's tail where it prepends an unhashed one: a later allocation
    takes another block (seed 301 index 2, async; tests/test_vllm_reuse_blocks.py)."""
    if not drifted or theirs is None or ours is None or not theirs[0] == ours[0] == "schedule" \
            or theirs[2:] != ours[2:] or len(theirs[1]) != len(ours[1]):
        return False
    pairs = list(zip(theirs[1], ours[1]))
    if any(mine[:5] + mine[6:] != other[:5] + other[6:] for mine, other in pairs):
        return False
    differing = {block for mine, other in pairs for block in set(mine[5]) ^ set(other[5])}
    held = {block for event in before if event[0] == "schedule"
            for entry in event[1] if entry[0] in drifted for block in entry[5]}
    return bool(differing & held)


def _drifted(truth: dict[str, Any]) -> set[str]:
    """Requests whose vLLM 0.33 counters went wrong (below 0, or apart from
    the tokens of their batches in flight), by the ground truth."""
    return ({item["req"] for item in truth.get("negative_counters", ())}
            | {item["req"] for item in truth.get("in_flight_counter_mismatches", ())})


def _concerns(*events: tuple[Any, ...] | None) -> set[str]:
    """The requests a `decisions` item names (entries, preemptions; tokens,
    drops and the drafts a completion leaves: an older batch bound by a
    reused id may differ only in the new request's drafts)."""
    names: set[str] = set()
    for event in events:
        if event is None:
            continue
        if event[0] == "schedule":
            names |= {entry[0] for entry in event[1]} | set(event[2])
        elif event[0] == "complete":
            names |= {req for req, _ in event[1]} | set(event[2])
            # the drafts its requests hold once it is applied: under a reused id
            # vLLM reads the new request's (an older batch bound to it by id)
            names |= {req for req, _ in (event[3] if len(event) > 3 else ())}
        else:
            names.add(event[1])
    return names
