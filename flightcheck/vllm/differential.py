"""The differential against vLLM: the same workload through vLLM's real
scheduler (the replay, in the vLLM venv) and through our reference scheduler
under the same version profile, compared batch by batch.

Both sides run the same engine loop and the same fabricated model (the
reference's side: reference_run.py). Both write the trace format, so the
comparison reads the two traces:

* `schedule`: each entry's request, start, n, samples, cached and block ids
  (the reference's pool has no null block: its ids are vLLM's minus one),
  and the preempted requests;
* `complete`: which tokens were applied to which request, and which entries
  were dropped;
* `finish` (stop, length) and `abort`.

Every difference is either a bug of the reference (fixed there) or one of
the deliberate deviations in `DEVIATIONS` (deviations.py; reference/README.md lists them):
`compare` finds the first difference and names the deviation that explains
it, and checks that it is the only one by a second reference run with those
deviations switched to vLLM's behaviour (`vllm_outputs=True`: the version's
released profile, `SchedulerConfig(as_released=True)`, whose constants
reference/profiles.py `RELEASED` names), which must then equal vLLM event
for event.

Standard library and flightcheck.reference only: the vLLM side's results
come from the replay worker (replay.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The named deviations (deviations.py) and the reference side (reference_run.py),
# named here too for the callers.
from .deviations import DEVIATIONS, VERSION_DEVIATIONS
from .decision_rules import (_concerns, _drafts_handed_over_early, _drifted, _drifted_blocks_moved,
                             _first_negative_schedule, _preempted_since)
from .negative_count import cached_through_a_negative_count
from .kv_differential import KV_REPORTS, ErrorFinishes, kv_decision
from .run_coverage import coverage_of
from .reference_run import (ASYNC_VERSION_PROFILES, VERSION_PROFILES, ReferenceRun, _model_output,
                            profile_for, reference_config, run_reference)
from .versions import BATCH_QUEUE_V033_LOOPS, Release, UnknownRelease, nearest_release

__all__ = ["ASYNC_VERSION_PROFILES", "DEVIATIONS", "VERSION_DEVIATIONS", "VERSION_PROFILES", "Comparison",
           "ReferenceRun", "_model_output", "classify", "compare", "coverage_of", "decisions",
           "first_difference", "profile_for", "read_trace", "reference_config", "run_reference"]


def _release_of(vllm_result: dict[str, Any]) -> Release | None:
    """The release (versions.py) whose rules a replayed vLLM follows: its own,
    or for a developer's build its nearest; None if unknown."""
    try:
        return nearest_release(str(vllm_result.get("vllm_version")))
    except UnknownRelease:
        return None


def _binds_by_id(vllm_result: dict[str, Any]) -> bool:
    """Whether the replayed vLLM binds outputs by id alone with per-request
    counters (0.33's scheduler, kept by 0.34), rather than walking `running`."""
    row = _release_of(vllm_result)
    return row is not None and row.engine_loop in BATCH_QUEUE_V033_LOOPS


# ---------------------------------------------------------------------------
# The comparison
# ---------------------------------------------------------------------------

def decisions(events: list[dict[str, Any]], block_offset: int = 0) -> list[tuple[Any, ...]]:
    """A trace's decisions in order, in a form both writers agree on:
    arrivals, configuration, times and steps left out; completions as the
    tokens applied and the tokens dropped, per request; vLLM's `finish` with
    reason `abort` after an `abort` left out (the reference writes the abort
    only); the finishes one completion causes in sorted order (vLLM reports
    them in `running` order, the reference in placement order)."""
    out: list[tuple[Any, ...]] = []
    finishes: list[tuple[Any, ...]] = []
    # With a KV connector (config.kv_connector), its decisions too (kv_decision).
    kv = any(event.get("ev") == "config" and event.get("kv_connector") is not None for event in events)

    errors = ErrorFinishes()
    # The KV reports of one update (vLLM takes each kind as a set), in sorted order.
    reports: list[tuple[Any, ...]] = []

    def flush() -> None:
        out.extend(sorted(finishes))
        finishes.clear()

    for event in events:
        kind = event.get("ev")
        if kind in ("grammar_compiled", "grammar_failed"):
            continue                # the backend's events (vLLM's recorder writes them; the reference, none)
        if kind in KV_REPORTS:
            reports.append(kv_decision(event))
            # (a failure opens an update: its finishes by error come before its completion)
            errors.after_complete &= kind != "kv_failed"
            continue
        out.extend(sorted(reports))
        reports.clear()
        if kind == "arrive":
            errors.seen.discard(event["req"])
        if kind == "finish" and event["reason"] == "error":
            errors.take(event, finishes)
            continue
        if kind != "complete":
            errors.release(finishes)
        if kind == "finish":
            if event["reason"] != "abort":
                finishes.append(("finish", event["req"], event["reason"])
                                + ((bool(event.get("held")),) if kv else ()))
            continue
        if kind == "complete":
            errors.settle_before(event, finishes)
        flush()
        errors.after_complete = kind == "complete" or (errors.after_complete and kind == "arrive")
        if kind == "schedule":
            if not event.get("entries") and not event.get("preempted") and not (kv and event.get("kv_loads")):
                continue
            out.append(_schedule_decision(event, block_offset, kv))
        elif kind == "complete":
            out.append(_complete_decision(event))
            errors.release(finishes)
        elif kind in ("abort", "reset", "pause"):
            out.append(_input_decision(event))
    out.extend(sorted(reports))
    errors.release(finishes)
    flush()
    return out


def _input_decision(event: dict[str, Any]) -> tuple[Any, ...]:
    """An abort, or a reset or a pause (reset_pause_workload.py), as a decision."""
    if event["ev"] == "abort":
        return ("abort", event["req"])
    if event["ev"] == "reset":
        return ("reset", event["running"], tuple(event.get("preempted", ())), event.get("ok"))
    return ("pause", event["state"])


def _schedule_decision(event: dict[str, Any], block_offset: int, kv: bool) -> tuple[Any, ...]:
    """A `schedule` event's entries and preemptions (with a KV connector,
    each entry's `external` and the call's parked loads)."""
    entries = tuple((e["req"], e["start"], e["n"], e.get("samples"), e.get("cached", 0),
                     tuple(b + block_offset for b in e.get("block_ids", ())),
                     e.get("placeholders"), e.get("drafts", 0))
                    + ((e.get("external", 0),) if kv else ())
                    for e in event.get("entries", ()))
    decision = ("schedule", entries, tuple(event.get("preempted", ())))
    if not kv:
        return decision
    return decision + (tuple((load["req"], load["start"]) for load in event.get("kv_loads", ())),)


def _complete_decision(event: dict[str, Any]) -> tuple[Any, ...]:
    """A `complete` event: the tokens applied and dropped, per request."""
    # Only an entry with tokens has something to apply or drop (an entry
    # without any is "dropped" for vLLM's recorder when its request is not
    # running, never for the reference's writer).
    with_tokens = {req: tuple(tokens) for req, tokens in event["tokens"].items() if tokens}
    dropped = tuple(sorted(set(event.get("dropped", ())) & set(with_tokens)))
    applied = tuple(sorted((req, tokens) for req, tokens in with_tokens.items() if req not in dropped))
    # The drafts each request holds for its next step (spec decode).
    next_drafts = tuple(sorted(event.get("next_drafts", {}).items()))
    return ("complete", applied, dropped) + ((next_drafts,) if next_drafts else ())


@dataclass
class Comparison:
    """How the reference compared with vLLM on one workload."""
    name: str
    equal: bool                                  # identical, event for event
    deviation: str | None = None                 # the named deviation behind the first difference
    first_difference: str | None = None          # what differed first (None when equal)
    explained: bool = True                       # equal, or a named deviation and nothing else
    coverage: dict[str, bool] = field(default_factory=dict)

    def describe(self) -> str:
        if self.equal:
            return f"{self.name}: identical"
        what = f"deviation {self.deviation}" if self.deviation else "UNEXPLAINED"
        return f"{self.name}: {what}: {self.first_difference}"


def first_difference(vllm: list[tuple[Any, ...]], reference: list[tuple[Any, ...]]) -> int | None:
    for index, (theirs, ours) in enumerate(zip(vllm, reference)):
        if theirs != ours:
            return index
    return None if len(vllm) == len(reference) else min(len(vllm), len(reference))


def _at(events: list[tuple[Any, ...]], index: int) -> str:
    return repr(events[index]) if index < len(events) else "(nothing: the run ended)"


def classify(vllm_result: dict[str, Any], vllm: list[tuple[Any, ...]],
             reference: list[tuple[Any, ...]], index: int) -> str | None:
    """The named deviation that explains the first difference, at `index`, or None."""
    if index >= len(vllm) and vllm_result.get("ending") == "exception" \
            and _raised_padding_assertion(vllm_result.get("exception")):
        # vLLM raised in schedule() where the threshold cut a padded admission;
        # the reference schedules it with the drafts that fit.
        return "padded_admission_cut_by_threshold"
    truth = vllm_result.get("ground_truth") or {}
    theirs = vllm[index] if index < len(vllm) else None
    ours = reference[index] if index < len(reference) else None
    if cached_through_a_negative_count(truth, vllm[:index], theirs, ours):
        return "negative_count_caches_blocks"      # before the mark drift: 0.8.4's crash follows it
    named = _classify(vllm_result, vllm, reference, index)
    if named is not None and _version_may_name(vllm_result, named):
        return named
    # requests admitted holding drafts kept through a preemption, or given
    # slots holding more drafts than their entry scheduled (a threshold or
    # budget clip): 0.8.x's allocate_slots left the held drafts uncached
    held = {item["req"] for item in (*truth.get("drafts_held_at_admission", ()),
                                     *truth.get("drafts_held_at_allocation", ()))}
    errored = {event[1] for event in vllm + reference if event[0] == "finish" and event[2] == "error"}
    if errored and (_concerns(theirs, ours) & errored or any(
            event[0] == "finish" and event[2] == "error" for event in vllm[:index])):
        # A KV load failed under the fail policy: the reference finished the
        # request at once, vLLM after the batch's outputs: the blocks it frees
        # return in another order, or at once under the step fence (the reference
        # waits for that batch: it completes where vLLM schedules).
        return "kv_error_finished_at_once"
    if any(event[0] == "kv_failed" for event in vllm[:index]):
        # A KV load failed under the recompute policy: vLLM rolled the request
        # back in place (its other work in flight kept, #49250's placeholders
        # under async scheduling); the reference drops what reaches past it.
        return ("kv_rollback_keeps_placeholders_pr49250" if vllm_result.get("async_scheduling")
                else "kv_rollback_base_assumes_one_batch")
    if held and _concerns(theirs, ours) & held:
        # Nothing else explains it, and it concerns a request admitted or
        # given slots holding drafts its entry did not schedule: 0.8.x's
        # allocate_slots cached fewer of its blocks, so a later prefix hit is
        # smaller (or none, and the request fits where the reference's does not).
        return "unscheduled_drafts_dropped"
    return named


# vLLM 0.33 and 0.34's assertion that a padded admission kept its 1 + k
# tokens (`Scheduler.schedule`, waiting loop), as the replay reports it.
PADDING_ASSERTION = "assert num_new_tokens == 1 + self.num_spec_tokens"


def _raised_padding_assertion(run_exception: object) -> bool:
    """Whether an exception (vLLM's, or the released reference's: profiles.py
    `padding_asserted_whole`) is the padded admission's assertion."""
    return PADDING_ASSERTION in str(run_exception or "")


def _padding_not_reproduced(deviation: str | None, conforming_run: ReferenceRun, elsewhere: bool) -> bool:
    """For `padded_admission_cut_by_threshold`: whether the released reference
    failed to raise the padding's assertion, or raised it `elsewhere` than
    vLLM (after another number of decisions)."""
    return deviation == "padded_admission_cut_by_threshold" and (
        elsewhere or not _raised_padding_assertion(conforming_run.exception))


def _version_may_name(vllm_result: dict[str, Any], deviation: str) -> bool:
    """Whether the replayed vLLM's release has `deviation` (another's, e.g.
    0.8.x's engine_blocked_in_flight on 0.33, gives way to classify's later rules)."""
    row = _release_of(vllm_result)
    return row is None or deviation in VERSION_DEVIATIONS.get(row.version, tuple(DEVIATIONS))


def _classify(vllm_result: dict[str, Any], vllm: list[tuple[Any, ...]],
              reference: list[tuple[Any, ...]], index: int) -> str | None:
    truth = vllm_result.get("ground_truth") or {}
    theirs = vllm[index] if index < len(vllm) else None
    ours = reference[index] if index < len(reference) else None
    crashed, drifted = theirs is None and vllm_result.get("ending") == "exception", _drifted(truth)
    if _binds_by_id(vllm_result) and (crashed and drifted or _concerns(theirs, ours) & drifted
                                      or _drifted_blocks_moved(vllm[:index], theirs, ours, drifted)):
        # An older request's batch, looked up by a reused id, moved the new request's counters
        # without (or before) applying a token: vLLM defers its resumption on a negative stale
        # count (the hang), trips its assertion (its run ends) or frees its blocks elsewhere.
        return "reused_id_output_dropped"
    if _binds_by_id(vllm_result) and _preempted_since(vllm[:index]) & drifted \
            and any(event is not None and event[0] == "schedule" for event in (theirs, ours)):
        # The same deferral seen from behind, either way round: a preempted request
        # whose counters drifted waits, its stale count (`_preempt_request` copies
        # num_in_flight_tokens) not the reference's. Gone negative, vLLM skips it and
        # admits one queued after it, where the reference's queue waits for it. Short
        # by the older batch's tokens, it runs out while the request's own batches
        # are in flight: `Scheduler.schedule`'s waiting loop no longer defers the
        # resumption, the request heads the queue and, not fitting, stops the loop,
        # where the reference still skips it and admits the one behind (seed 46
        # index 58, async; tests/test_vllm_reuse_async_034.py keeps it).
        return "reused_id_output_dropped"
    if _drafts_handed_over_early(vllm_result, vllm[:index], theirs, ours):
        return "drafts_handed_over_at_submission"
    beyond = {item["req"] for item in truth.get("beyond_max_model_len", ())}
    if beyond and _concerns(theirs, ours) & beyond:
        return "drafts_clipped_to_max_model_len"
    if theirs is None and vllm_result.get("ending") == "exception" and (
            truth.get("drafts_held_at_admission") or truth.get("drafts_held_at_allocation")):
        # vLLM 0.8.x crashed caching a block twice after admitting a request
        # with drafts kept through its preemption (the ground truth's
        # drafts_held_at_admission); the reference, which drops them, runs on.
        return "unscheduled_drafts_dropped"
    leftover = {item["req"] for item in truth.get("leftover_drafts", ())}
    if leftover and _concerns(theirs, ours) & leftover:
        # vLLM 0.8.x scheduled drafts it kept (or preempted trying to) where the
        # reference had dropped them.
        return "unscheduled_drafts_dropped"
    if ours is not None and ours[0] == "complete" and not ours[1] and (theirs is None or theirs[0] != "complete"):
        # The reference completes a batch that applies nothing (its requests
        # were aborted) where vLLM's engine waits for input instead.
        return "engine_blocked_in_flight"
    # 0.8.4's mark drift ends a run stuck (the livelock) or crashed; 0.33 has
    # no mark (its stuck and crashed runs are the id-reuse bug's).
    drift = truth.get("in_flight_set_mismatches") or (
        vllm_result.get("ending") in ("stuck", "exception") and not _binds_by_id(vllm_result))
    if drift and ours is not None and ours[0] == "schedule" and (theirs is None or theirs[0] != "schedule"
                                                               or theirs[1] != ours[1]):
        return "inflight_mark_cleared_on_preemption"
    missing = {req for item in truth.get("in_flight_set_mismatches", ()) for req in item.get("missing", ())}
    if missing and theirs is not None and theirs[0] == "schedule" and _concerns(theirs) & missing:
        # vLLM 0.8.4 schedules again (or, out of room, preempts: seed 314 index 42) a request
        # whose mark a stale completion cleared while its newer batch is in flight; the reference waits.
        return "inflight_mark_cleared_on_preemption"
    if theirs is None and vllm_result.get("ending") == "exception" and truth.get("in_flight_set_mismatches"):
        # vLLM 0.8.4 crashed on the mark a stale completion cleared; the reference runs on.
        return "inflight_mark_cleared_on_preemption"
    return _classify_tokens(vllm_result, theirs, ours)


def _classify_tokens(vllm_result: dict[str, Any], theirs: tuple[Any, ...] | None,
                     ours: tuple[Any, ...] | None) -> str | None:
    """The deviation behind two completions that applied different tokens:
    a stale token (vLLM applied it by name), a partial chunk's token (vLLM's
    runner sampled it) or an orphan's token (the reference kept it)."""
    truth = vllm_result.get("ground_truth") or {}
    if theirs is None or ours is None or theirs[0] != "complete" or ours[0] != "complete":
        return None
    theirs_applied, ours_applied = dict(theirs[1]), dict(ours[1])
    differing = {req for req in set(theirs_applied) | set(ours_applied)
                 if theirs_applied.get(req) != ours_applied.get(req)}
    stale = {item["req"] for item in truth.get("stale_tokens", ())}
    partial = {item["req"] for item in truth.get("partial_chunk_tokens", ())}
    if differing and differing <= stale and all(req in theirs_applied for req in differing):
        # vLLM 0.33 defers a preempted request's resumption while its stale
        # output is in flight, so its only stale token is an older request's
        # output bound by a reused id.
        if _binds_by_id(vllm_result):
            return "reused_id_output_dropped"
        return "stale_token_dropped"
    if differing and differing <= partial and all(req not in ours_applied for req in differing):
        return "partial_chunk_token_dropped"
    if not differing and _dropped_a_token_the_reference_never_sampled(theirs, ours):
        return "partial_chunk_token_dropped"
    if differing and all(req in ours_applied and req in theirs[2] for req in differing):
        return "orphaned_token_kept"
    return None


def _dropped_a_token_the_reference_never_sampled(theirs: tuple[Any, ...], ours: tuple[Any, ...]) -> bool:
    """Two completions that apply the same tokens, where vLLM also dropped a
    token of a request for which the reference had none: the schedules agree
    up to here, so the reference's snapshot of that entry did not sample (a
    partial chunk) and the token is the model runner's own (it samples when
    the entry reaches the tokens it was told of, 0.8.5
    `GPUModelRunner._update_states` and `execute_model`: engine.py); vLLM
    dropped it because the request was preempted before the batch came back
    (0.8.5 `Scheduler.update_from_output` walks `self.running`). Applied, the
    same token is the ground truth's `partial_chunk_tokens` (seed 410 index
    74, 0.8.5 sync, two stages: r1's resumed chunk 18-24 of 25 tokens, then
    a preemption with no batch)."""
    theirs_dropped, ours_dropped = set(theirs[2]), set(ours[2])
    return theirs[3:] == ours[3:] and ours_dropped < theirs_dropped


def compare(name: str, vllm_result: dict[str, Any], vllm_events: list[dict[str, Any]],
            reference_run: ReferenceRun, conforming_run: ReferenceRun | None = None,
            rerun: Callable[[tuple[str, ...]], ReferenceRun] | None = None) -> Comparison:
    """Compare vLLM's trace with the reference's. `conforming_run` is the
    reference with the deviations switched to vLLM's behaviour: when the
    first difference is a named deviation it must equal vLLM exactly.
    `rerun(order)`: that run with the fail policy's errors finished in
    `order` (vLLM iterates a set of ids: `_in_vllms_error_order`)."""
    theirs = decisions(vllm_events)
    ours = decisions(reference_run.events, block_offset=1)
    index = first_difference(theirs, ours)
    coverage = coverage_of(vllm_events)
    # The reference's pool is vLLM's (block ids included) up to the first difference.
    coverage["duplicate_cached_block"] = reference_run.duplicate_cached_block
    if index is None and reference_run.ending == vllm_result["ending"]:
        return Comparison(name, True, coverage=coverage)
    if index is None:
        index = len(theirs)
    deviation = classify(vllm_result, theirs, ours, index)
    where = f"event {index}: vLLM {_at(theirs, index)}, reference {_at(ours, index)}"
    if deviation is None and index == len(theirs) == len(ours):
        where = f"the runs ended {vllm_result['ending']} (vLLM) and {reference_run.ending} (reference)"
    # A deviation of another version's (0.8.4's mark on a 0.33 run, say) explains nothing.
    explained = deviation is not None and _version_may_name(vllm_result, deviation)
    if explained and conforming_run is not None:
        conforming = decisions(conforming_run.events, block_offset=1)
        if _padding_not_reproduced(deviation, conforming_run, len(conforming) != len(theirs)):
            explained, where = False, where + "; the reference as released did not fail the padding's assertion there"
        if vllm_result["ending"] == "exception":
            # vLLM's run stops at its crash (0.8.4's `assert num_new_tokens >
            # 0` after a stale completion cleared a newer batch's mark); the
            # reference has no such assert: it must agree up to the crash.
            conforming = conforming[:len(theirs)]
            raised_in = _update_raised_in(theirs)
            if conforming_run.ending == "exception" and raised_in and len(conforming) == len(theirs) - raised_in:
                # Both raised in the same update (0.34: a reused id's older batch
                # bound to the new request, placeholders below 0; 0.33: its stale
                # count below 0, in an update that also reported a failed KV load):
                # vLLM's recorder writes the completion it raised in and the load
                # failures written before it, the reference's tracer none.
                theirs = theirs[:-raised_in]
        negative = _first_negative_schedule(theirs)
        if negative is not None:
            # vLLM 0.8.x scheduled a negative number of tokens (its
            # num_computed_tokens ran past the known tokens and drafts: a
            # partial chunk's completion cleared drafts a later batch in flight
            # had scheduled); its state is corrupt from there, as after a crash.
            theirs, conforming = theirs[:negative], conforming[:negative]
        rest = first_difference(theirs, conforming)
        # vLLM's order of the fail policy's errors is a set's, whatever
        # deviation came first (drafts handed over at submission, say).
        if rest is not None and rerun is not None and _in_vllms_error_order(vllm_events, theirs, rerun):
            rest = None
        if rest is not None:
            explained = False
            where += (f"; with the deviations switched to vLLM's behaviour it still differs at event "
                      f"{rest}: vLLM {_at(theirs, rest)}, reference {_at(conforming, rest)}")
    return Comparison(name, False, deviation, where, explained, coverage)


def _update_raised_in(vllm: list[tuple[Any, ...]]) -> int:
    """How many of vLLM's last decisions are the update it raised in: its
    completion and the `kv_failed` reports written before it; 0 if the last is
    no completion (update_from_output takes the failed loads first)."""
    if not vllm or vllm[-1][0] != "complete":
        return 0
    return 1 + next((i for i, event in enumerate(reversed(vllm[:-1])) if event[0] != "kv_failed"), len(vllm) - 1)


def _in_vllms_error_order(events: list[dict[str, Any]], vllm: list[tuple[Any, ...]],
                          rerun: Callable[[tuple[str, ...]], ReferenceRun]) -> bool:
    """Whether the conforming run equals vLLM with the fail policy's errors
    finished in the order vLLM's trace finished them. vLLM 0.33/0.34
    `update_from_output` finishes them with `finish_requests(error_req_ids,
    ...)`, iterating a set whose order would follow the process's hash seed;
    the recorder hands them to vLLM one by one in its scan order
    (recording.py `_fc_scan_order`: one of the orders the set may take, the
    same under every PYTHONHASHSEED), and its trace says which. The
    reference takes them in id order unless told (`kv_error_order`): it is
    rerun once, in the trace's order (its events': `vllm`, the decisions
    compared, need not keep it), never searched over other orders."""
    order = errors_in_trace_order(events)
    if len(order) < 2 or list(order) == sorted(order):
        return False
    return first_difference(vllm, decisions(rerun(order).events, block_offset=1)) is None


def errors_in_trace_order(events: list[dict[str, Any]]) -> tuple[str, ...]:
    """The requests a trace finishes by error, in the order it finished them
    (each id once: vLLM's recorder may write an error's finish twice, and
    `kv_error_order` ranks ids, so a reused id that errors twice takes its
    first rank both times)."""
    return tuple(dict.fromkeys(event["req"] for event in events
                               if event.get("ev") == "finish" and event.get("reason") == "error"))


def read_trace(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
