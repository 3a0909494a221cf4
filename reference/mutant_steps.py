"""The reference mutants' code: each replaces one or two named steps of
`Scheduler` (scheduler.py) with the buggy version, on the one scheduler
built for it (`Scheduler(SchedulerConfig(mutant=NAME))`); the correct
policy never asks whether a mutant is on. mutants.py names each mutant and
gives its history.

Every replacement records a fingerprint of the correct step as it was when
the mutant was written (`@replaces(mutant, step, fingerprint)`). When the
step changes, `drifted_steps()` names the mutant and the step, and
tests/test_reference_mutant_steps.py fails: the mutant may no longer
re-introduce its bug, or may bring back an old version of the step, and must
be re-read against the new step (then its fingerprint updated).
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import textwrap
from collections.abc import Callable
from dataclasses import fields
from typing import Any, TypeVar

from . import mutants as M
from .batch import Batch, new_request_data
from .block_pool import KVCacheBlock
from .completion import Fate
from .outputs import CachedRequestData, RequestData
from .request import Request, RequestStatus
from .scheduler import Scheduler

Step = TypeVar("Step", bound=Callable[..., Any])

# (mutant, step name) -> fingerprint of the correct step the mutant was written against
FINGERPRINTS: dict[tuple[str, str], str] = {}


def replaces(mutant: str, step: str, fingerprint: str) -> Callable[[Step], Step]:
    """Register the decorated function as `mutant`'s version of `Scheduler.<step>`."""
    if mutant not in M.ALL_MUTANTS:
        raise ValueError(f"unknown mutant {mutant!r}")

    def register(function: Step) -> Step:
        Scheduler.mutant_steps.setdefault(mutant, {})[step] = function
        FINGERPRINTS[(mutant, step)] = fingerprint
        return function
    return register


def fingerprint_of(step: str) -> str:
    """A hash of the code of `Scheduler.<step>`: its syntax tree without the
    docstring, so a comment or docstring edit does not count as a change."""
    source = textwrap.dedent(inspect.getsource(getattr(Scheduler, step)))
    function = ast.parse(source).body[0]
    assert isinstance(function, ast.FunctionDef)
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        function.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.dump(function).encode()).hexdigest()[:12]


def drifted_steps() -> list[str]:
    """One line per replaced step whose correct version changed since its mutant was written."""
    return [f"mutant {mutant} no longer applies: Scheduler.{step} changed "
            f"(fingerprint {fingerprint_of(step)}, the mutant was written against {expected}); "
            f"re-read reference/mutant_steps.py against the new step, then update the fingerprint"
            for (mutant, step), expected in FINGERPRINTS.items() if fingerprint_of(step) != expected]


# -- advance_at_completion ----------------------------------------------------

@replaces(M.ADVANCE_AT_COMPLETION, "_update_after_schedule", "8068716a6e94")
def _update_after_schedule_not_at_all(scheduler: Scheduler, batch: Batch) -> None:
    """The bug, half one: nothing advances at schedule time, so the next
    batch schedules the same prefill tokens again."""


@replaces(M.ADVANCE_AT_COMPLETION, "_settle_live", "fa7249e644dc")
def _settle_live_advancing_the_counter(scheduler: Scheduler, request: Request,
                                       entry: RequestData) -> None:
    """The bug, half two: the counter advances when the batch completes."""
    Scheduler._settle_live(scheduler, request, entry)
    request.num_computed_tokens += entry.num_new_tokens


# -- shared_snapshot ------------------------------------------------------------

def _shared_snapshots(scheduler: Scheduler) -> dict[str, CachedRequestData]:
    """The one CachedRequestData per request this mutant keeps (made on first use)."""
    return scheduler.__dict__.setdefault("shared_snapshots", {})


@replaces(M.SHARED_SNAPSHOT, "_cached_entry", "a5de4ca15af6")
def _cached_entry_overwritten_in_place(scheduler: Scheduler, request: Request, start: int,
                                       num_new_tokens: int, num_drafts: int,
                                       new_blocks: list[KVCacheBlock],
                                       resumed: bool) -> CachedRequestData:
    """The bug: the request's earlier snapshot is overwritten with this
    batch's values, so a batch still in flight sees them."""
    fresh = Scheduler._cached_entry(scheduler, request, start, num_new_tokens, num_drafts,
                                    new_blocks, resumed)
    store = _shared_snapshots(scheduler)
    entry = store.get(request.request_id)
    if entry is None:
        store[request.request_id] = fresh
        return fresh
    for field in fields(CachedRequestData):
        setattr(entry, field.name, getattr(fresh, field.name))
    return entry


@replaces(M.SHARED_SNAPSHOT, "_free_request", "c0025cd3c12f")
def _free_request_and_its_shared_snapshot(scheduler: Scheduler, request: Request) -> None:
    Scheduler._free_request(scheduler, request)
    _shared_snapshots(scheduler).pop(request.request_id, None)


# -- final_chunk_from_live_counter ------------------------------------------------

@replaces(M.FINAL_CHUNK_FROM_LIVE_COUNTER, "_samples", "7fdb0f7ef7bc")
def _samples_read_from_the_live_counter(scheduler: Scheduler, entry: RequestData,
                                        request: Request, fate: Fate) -> bool:
    """The bug: a live entry's sampling is decided from the request's counter
    now, which later chunks have already advanced, not from its snapshot."""
    if fate is Fate.LIVE:
        return request.num_computed_tokens >= request.num_tokens
    return entry.samples


# -- snapshot_omits_prefix_hit ------------------------------------------------------

@replaces(M.SNAPSHOT_OMITS_PREFIX_HIT, "_admit", "12cb1dae9583")
def _admit_with_a_snapshot_from_zero(scheduler: Scheduler, request: Request, num_hit_tokens: int,
                                     num_new_tokens: int,
                                     new_blocks: list[KVCacheBlock]) -> RequestData:
    """The correct `_admit`, but the snapshot starts at 0 instead of after
    the prefix-cache hit: the final chunk looks partial."""
    was_preempted = request.status == RequestStatus.PREEMPTED
    scheduler.running.append(request)
    request.status = RequestStatus.RUNNING
    request.num_computed_tokens = num_hit_tokens
    request.num_cached_tokens = num_hit_tokens
    request.orphaned_incarnation = None
    start = 0                                 # the bug: num_hit_tokens left out
    if was_preempted:
        return scheduler._cached_entry(request, start, num_new_tokens, 0, new_blocks,
                                       resumed=True)
    return new_request_data(request, start, num_hit_tokens, num_new_tokens, new_blocks)


# -- rejections_not_subtracted / rejections_subtracted_after_reset ---------------------

@replaces(M.REJECTIONS_NOT_SUBTRACTED, "_subtract_rejections", "555ba2d7cc81")
def _subtract_no_rejections(scheduler: Scheduler, request: Request, fate: Fate,
                            num_rejected: int) -> None:
    """The bug: rejected drafts stay counted as computed."""


@replaces(M.REJECTIONS_SUBTRACTED_AFTER_RESET, "_subtract_rejections", "555ba2d7cc81")
def _subtract_rejections_of_orphans_too(scheduler: Scheduler, request: Request, fate: Fate,
                                        num_rejected: int) -> None:
    """The bug: an orphaned entry's rejections are subtracted from the
    counter that preemption reset to 0."""
    request.num_computed_tokens -= num_rejected


# -- decode_while_token_in_flight ------------------------------------------------------

@replaces(M.DECODE_WHILE_TOKEN_IN_FLIGHT, "_num_new_tokens_running", "b4285e4c452e")
def _num_new_tokens_running_without_the_skip(scheduler: Scheduler, request: Request,
                                             token_budget: int) -> int:
    """The correct step without the `num_new_tokens == 0` skip for decodes."""
    if scheduler._one_batch_per_request and request.request_id in scheduler.scheduled_req_ids:
        return 0
    num_computed = request.num_computed_tokens
    num_new_tokens = (request.num_tokens_with_spec + request.num_output_placeholders
                      - num_computed)
    if num_new_tokens > 0:
        return scheduler._clip(num_new_tokens, num_computed, token_budget)
    if request.num_tokens <= num_computed < scheduler.config.max_model_len:
        return 1                              # the bug: its sampled token is still in flight
    return 0


# -- stale_output_applied_to_resumed / output_bound_by_name ------------------------------

@replaces(M.STALE_OUTPUT_APPLIED_TO_RESUMED, "_fate", "395f43e65b72")
def _fate_live_for_any_running_request(scheduler: Scheduler, entry: RequestData,
                                       request: Request | None) -> Fate:
    """The bug: an old incarnation's output is applied to the request of its
    name whenever that request is running again."""
    fate = Scheduler._fate(scheduler, entry, request)
    if fate is Fate.SUPERSEDED and request is not None and request.status == RequestStatus.RUNNING:
        return Fate.LIVE
    return fate


@replaces(M.OUTPUT_BOUND_BY_NAME, "_fate", "395f43e65b72")
def _fate_bound_by_name(scheduler: Scheduler, entry: RequestData,
                        request: Request | None) -> Fate:
    """The bug: an output of an older request of the same name (aborted,
    the name re-added) is applied to the new one."""
    fate = Scheduler._fate(scheduler, entry, request)
    if (fate is Fate.SUPERSEDED and request is not None
            and entry.incarnation < request.first_incarnation):
        return Fate.LIVE
    return fate


# -- inflight_set_not_cleared_on_preemption -----------------------------------------------

@replaces(M.INFLIGHT_SET_NOT_CLEARED_ON_PREEMPTION, "_preempt", "9364ff331ff9")
def _preempt_keeping_the_inflight_mark(scheduler: Scheduler, request: Request) -> None:
    """The correct `_preempt`, but the request stays in `scheduled_req_ids`."""
    scheduler.kv_cache_manager.free(request)
    request.status = RequestStatus.PREEMPTED
    request.num_computed_tokens = 0
    request.spec_token_ids = request.spec_token_ids if scheduler._drafts_kept_through_preemption else ()
    request.orphaned_incarnation = request.incarnation
    request.incarnation = next(scheduler._incarnations)
    scheduler.waiting.appendleft(request)


# -- vLLM 0.33's rules (fuzzed under the vllm-0.33 profile only) -----------------------------

@replaces(M.RESUMPTION_NOT_DEFERRED, "_is_resumption_deferred", "3c6a718cfbb9")
def _resumption_never_deferred(scheduler: Scheduler, request: Request) -> bool:
    """The bug: the waiting loop never skips a request with deliver-mode stale
    output in flight; it resumes at once, as in vLLM 0.8.5."""
    return False


@replaces(M.DROP_LEAVES_COUNTERS, "_fate_by_counters", "a24f4d353549")
def _fate_by_counters_leaving_dropped(scheduler: Scheduler, entry: RequestData,
                                      request: Request | None) -> Fate:
    """The bug: a stale output discarded in drop mode is dropped before the
    counters are settled, so neither count moves."""
    if (request is not None and entry.incarnation >= request.first_incarnation
            and request.num_stale_output_tokens > 0 and request.drop_stale_output):
        return Fate.SUPERSEDED
    return Scheduler._fate_by_counters(scheduler, entry, request)


@replaces(M.IN_FLIGHT_KEPT_WITHOUT_OUTPUT, "_fate_by_counters", "a24f4d353549")
def _fate_by_counters_only_with_output(scheduler: Scheduler, entry: RequestData,
                                       request: Request | None) -> Fate:
    """The bug: an entry that samples nothing is judged by the counters but
    leaves them as they were."""
    if request is None or entry.incarnation < request.first_incarnation or entry.samples:
        return Scheduler._fate_by_counters(scheduler, entry, request)
    if request.num_stale_output_tokens > 0:
        return Fate.SUPERSEDED if request.drop_stale_output else Fate.ORPHANED
    return Fate.LIVE


@replaces(M.OUTPUT_BOUND_BY_ID_ALONE, "_fate_by_counters", "a24f4d353549")
def _fate_by_counters_by_id_alone(scheduler: Scheduler, entry: RequestData,
                                  request: Request | None) -> Fate:
    """The bug (vLLM 0.33 as released): the output is looked up by id with no
    incarnation check, so an older request's batch under a reused id settles
    the new request's counters and, if it sampled, gives it its token."""
    if request is None:
        return Fate.SUPERSEDED
    request.num_in_flight_tokens -= entry.num_new_tokens
    if request.num_stale_output_tokens > 0:
        request.num_stale_output_tokens -= entry.num_new_tokens
        assert request.num_stale_output_tokens >= 0, (
            f"{request.request_id}: stale share below 0 ({request.num_stale_output_tokens})")
        return Fate.SUPERSEDED if request.drop_stale_output else Fate.ORPHANED
    return Fate.LIVE


# -- vLLM 0.33's asynchronous scheduling (fuzzed under vllm-0.33-async only) -------------------

@replaces(M.ASYNC_REJECTIONS_NOT_SETTLED, "_settle_rejected_placeholders", "a23cb5ce7b57")
def _rejected_placeholders_kept(scheduler: Scheduler, request: Request, num_rejected: int) -> None:
    """The bug: rejected drafts stay counted as placeholders."""


@replaces(M.ASYNC_PLACEHOLDERS_KEPT_ON_PREEMPTION, "_reset_placeholders", "225203e9a742")
def _placeholders_never_reset(scheduler: Scheduler, request: Request) -> None:
    """The bug: preemption leaves the placeholders as they were."""


@replaces(M.ASYNC_STAGGER_IGNORED, "_is_async_skipped", "cdd16d0ea26c")
def _is_async_skipped_without_the_stagger(scheduler: Scheduler, request: Request) -> bool:
    """The correct skip without `current_step < next_decode_eligible_step`."""
    placeholders = request.num_output_placeholders
    return placeholders > 0 and (request.num_computed_tokens + 2 - placeholders
                                 >= request.num_prompt_tokens + request.max_tokens)


@replaces(M.ASYNC_MAX_TOKENS_GUARD_OFF_BY_ONE, "_is_async_skipped", "cdd16d0ea26c")
def _is_async_skipped_one_token_late(scheduler: Scheduler, request: Request) -> bool:
    """The correct skip with `+ 1` for `+ 2` in the max_tokens guard."""
    placeholders = request.num_output_placeholders
    if placeholders > 0 and (request.num_computed_tokens + 1 - placeholders
                             >= request.num_prompt_tokens + request.max_tokens):
        return True
    return scheduler.current_step < request.next_decode_eligible_step


def _placeholders_at_preemption(scheduler: Scheduler) -> dict[str, int]:
    """Request id -> the placeholders it had when last preempted (this mutant's memory)."""
    return scheduler.__dict__.setdefault("placeholders_at_preemption", {})


@replaces(M.ASYNC_DECODE_ON_STALE_PLACEHOLDER, "_reset_placeholders", "225203e9a742")
def _reset_placeholders_remembering_them(scheduler: Scheduler, request: Request) -> None:
    """The correct reset, but the count is kept for `_admit` below."""
    _placeholders_at_preemption(scheduler)[request.request_id] = request.num_output_placeholders
    Scheduler._reset_placeholders(scheduler, request)


@replaces(M.ASYNC_DECODE_ON_STALE_PLACEHOLDER, "_admit", "12cb1dae9583")
def _admit_taking_stale_placeholders(scheduler: Scheduler, request: Request, num_hit_tokens: int,
                                     num_new_tokens: int,
                                     new_blocks: list[KVCacheBlock]) -> RequestData:
    """The correct `_admit`, but a request resumed while its stale output is
    still in flight (drop mode: no deferral) takes the placeholders it had at
    preemption back as its own."""
    was_preempted = request.status == RequestStatus.PREEMPTED
    remembered = _placeholders_at_preemption(scheduler).pop(request.request_id, 0)
    data = Scheduler._admit(scheduler, request, num_hit_tokens, num_new_tokens, new_blocks)
    if was_preempted and request.num_stale_output_tokens > 0:
        request.num_output_placeholders = remembered
    return data
