"""The refinement machine's checks: after every rule, the reference's
abstracted state against the spec's successor, the spec's invariants and
transition properties, and the engine's guards and counters against the
spec's state; after each schedule, what the workers receive; at the end of
a run, the trace the reference wrote, replayed on the spec.

A mixin of `RefinementMachine` (machine.py), which owns the state these
read: the reference (`scheduler`, `engine`, `ledger`), the spec's current
`state` under `spec_cfg`, and the run's bookkeeping."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, replace

from flightcheck.reference import Engine, Scheduler, SchedulerConfig
from flightcheck.reference.outputs import NewRequestData, SchedulerOutput
from flightcheck.spec.schedule import is_schedule_enabled
from flightcheck.spec.state import holder_of
from flightcheck.verification.refinement.abstraction import Ledger, abstract, describe_difference
from flightcheck.verification.refinement.budget import Budget
from flightcheck.verification.traces.check import check_events, read_events

from flightcheck import spec


@dataclass(frozen=True)
class AbortMany:
    """Several aborts in one `finish_requests` call: checked against the
    spec's aborts one after another (no spec action of its own, so the
    transition properties, which are about one action, are not checked on it)."""

    reqs: tuple[int, ...]

    def __str__(self) -> str:
        return f"abort {', '.join(f'r{r}' for r in self.reqs)}"


class RefinementChecks:
    """The checks of `RefinementMachine`; every failure goes through `_fail`,
    which marks the run broken and prints the spec actions taken so far."""

    cfg: SchedulerConfig
    spec_cfg: spec.Config
    scheduler: Scheduler
    engine: Engine
    ledger: Ledger
    state: spec.State
    history: list[tuple[spec.Action, spec.State]]
    budget: Budget | None
    broken: bool
    by_name: bool
    sink: io.StringIO | None
    num_batches: int
    num_reused_id_outputs_dropped: int
    num_padding_stalls: int
    finished_unreported: set[int]

    def _check(self, action: spec.Action | AbortMany, expected: spec.State | None = None) -> None:
        before = self.state
        by_incarnation: spec.State | None = None
        if expected is None and isinstance(action, spec.CompleteOldest):
            expected, by_incarnation = self._expected_after_completion(before, action)
        elif expected is None and not isinstance(action, spec.Schedule):
            expected = spec.step(before, self.spec_cfg, action)
            if expected is None:            # disabled in the spec: the reference must not move
                expected = before
        after = self._abstract()
        self.history.append((action, after))
        if by_incarnation is not None and after == by_incarnation and after != expected:
            self.num_reused_id_outputs_dropped += 1   # the named deviation: checked below
        elif after != expected:
            self._fail(f"refinement: after `{action}` the reference is not where the spec goes\n"
                       f"  before:    {spec.describe(before)}\n"
                       f"  spec:      {spec.describe(expected)}\n"
                       f"  reference: {spec.describe(after)}\n"
                       f"  {describe_difference(expected, after)}")
        cfg = self.spec_cfg
        broken = [inv.name for inv in spec.invariants_for(cfg)
                  if not inv.holds(after, cfg) and inv.name not in self._vllms_own_breaks(after)]
        if not isinstance(action, AbortMany):
            broken += [p.name for p in spec.transition_properties_for(cfg)
                       if not p.holds(before, after, action, cfg)]
        if broken:
            self._fail(f"{', '.join(broken)} broken after `{action}`\n"
                       f"  state: {spec.describe(after)}")
        self.finished_unreported.update(
            slot for slot, (was, now) in enumerate(zip(before.requests, after.requests))
            if now.status.is_finished and not was.status.is_finished)
        self._check_engine_counts(after)
        if self.by_name:
            self._check_predicted_fates(after)
        if self.engine.can_schedule() != is_schedule_enabled(after, cfg):
            self._fail(f"the engine {'can' if self.engine.can_schedule() else 'cannot'} schedule, "
                       f"the spec disagrees, in {spec.describe(after)}")
        self.state = after

    def _vllms_own_breaks(self, after: spec.State) -> frozenset[str]:
        """The invariants `after` breaks the way vLLM itself does, which the
        spec (vLLM's reading) and the correct reference reach alike: not a
        refinement failure. Here L2 in vLLM's stall below the padding budget
        (`stalls_below_padding_budget`), counted; a feature's machine adds
        its own (priority_sessions_machine.py)."""
        if stalls_below_padding_budget(after, self.spec_cfg):
            self.num_padding_stalls += 1
            return frozenset((NO_DEADLOCK,))
        return frozenset()

    def _abstract(self) -> spec.State:
        """The spec state the reference is in (a feature's machine adds
        the fields its abstraction keeps: grammar_machine.py, ...)."""
        return abstract(self.scheduler, self.engine, self.ledger)

    def _check_engine_counts(self, after: spec.State) -> None:
        """The counts the engine loops gate on (drive.py's EngineLoop), from
        the spec's state: whether any request is unfinished, how many are not
        in flight (vLLM 0.8.4's gate), and the batches in flight numbered
        consecutively up to the last one submitted."""
        unfinished = bool(after.waiting or after.running)
        if self.scheduler.has_unfinished_requests() != unfinished:
            self._fail(f"has_unfinished_requests() is {not unfinished} in {spec.describe(after)}")
        unscheduled = len(after.waiting) + len(after.running) - len(after.scheduled_ids)
        if self.scheduler.get_num_unscheduled_requests() != unscheduled:
            self._fail(f"get_num_unscheduled_requests() is "
                       f"{self.scheduler.get_num_unscheduled_requests()}, the spec has "
                       f"{unscheduled} in {spec.describe(after)}")
        if self.scheduler.has_requests() != self._expected_has_requests(after):
            self._fail(f"has_requests() is {self.scheduler.has_requests()} with "
                       f"{'' if unfinished else 'no '}unfinished requests and finished ones "
                       f"{sorted(self.finished_unreported)} not yet carried to the workers, in "
                       f"{spec.describe(after)}")
        ids = [out.batch_id for out, _ in self.engine.batch_queue if out.batch_id is not None]
        if ids != list(range(self.num_batches - len(ids) + 1, self.num_batches + 1)):
            self._fail(f"batch ids in flight {ids}, {self.num_batches} batches submitted")

    def _expected_has_requests(self, after: spec.State) -> bool:
        """`has_requests()` by the spec's state: an unfinished request, or a
        finished one no batch has carried to the workers yet."""
        return bool(after.waiting or after.running) or bool(self.finished_unreported)

    def _check_predicted_fates(self, after: spec.State) -> None:
        """vLLM 0.33: what the reference says becomes of each in-flight
        entry's output if it completed now (`fate_of`; the trace writer lists
        the discarded ones as dropped): a drop-mode request's orphan is
        discarded (the spec's `drop_stale`), any other entry keeps its fate."""
        for (output, _), entries in zip(self.engine.batch_queue, after.in_flight):
            for entry, spec_entry in zip(output.entries, entries):
                expected = spec_entry.fate
                if expected is spec.Fate.ORPHANED and after.requests[spec_entry.req].drop_stale:
                    expected = spec.Fate.SUPERSEDED
                predicted = self.scheduler.fate_of(entry)
                if predicted.value != expected.value:
                    self._fail(f"fate_of({entry.req_id}) is {predicted.value} for an entry of "
                               f"r{spec_entry.req} whose output the spec makes {expected.value}, "
                               f"in {spec.describe(after)}")

    def _check_trace(self) -> None:
        """Finish the run with the engine's own loop, then the trace the
        reference wrote must replay on the spec, with and without block ids."""
        self.outcomes, self.calls, self.stale_names = [], {}, set()
        # vLLM 0.33's loop completes the oldest batch in the step that fills
        # the queue, so its own steps never start with a full queue; the
        # rules may leave one (`schedule` fills it): drain it to the loop's
        # reach first.
        while (self.engine.loop.enqueues_empty_batches
               and self.engine.num_in_flight_batches >= self.engine.max_concurrent_batches):
            self.engine.complete_oldest_step()
        self.engine.run(max_steps=10_000)
        self.scheduler.trace.end()
        text = self.sink.getvalue().splitlines()
        result = check_events(read_events(text), profile=self.cfg.profile)
        if not result.ok:
            self._fail(f"check_trace rejects the reference's trace: {result.to_json()}\n"
                       + "\n".join(text))
        stripped = [json.dumps({k: v for k, v in e.items() if k != "block_ids"} if e["ev"] != "schedule"
                               else {**e, "entries": [{k: v for k, v in x.items() if k != "block_ids"}
                                                      for x in e["entries"]]})
                    for e in read_events(text)]
        result = check_events(read_events(stripped), profile=self.cfg.profile)
        scheduled = any(e["ev"] == "schedule" and e["entries"] for e in read_events(text))
        if not result.ok or (scheduled and not any("block identity" in u for u in result.unchecked)):
            self._fail(f"check_trace on the trace without block_ids: {result.to_json()}")


    def _check_request_data(self, before: spec.State, output: SchedulerOutput) -> None:
        """What the workers receive for each entry, against the spec's states
        around the schedule: a request never run gets new-request data (its
        prompt and whole table), a preempted one resumes with cached data
        marked resumed (its whole table again: preemption freed it), a running
        one cached data with only the blocks new to its table; every entry
        carries exactly the known tokens it computes, and an admitted one its
        prefix hit (where its computation starts) as cached tokens."""
        for entry in output.entries:
            slot = self.ledger.entry_slot(entry.req_id, entry.incarnation)
            status, request = before.requests[slot].status, self.ledger.requests[slot]
            if self.state.requests[slot].status is not spec.Status.RUNNING:
                continue
            old_table = before.requests[slot].block_table
            table = self.state.requests[slot].block_table
            start, n = entry.num_computed_tokens, entry.num_new_tokens
            known = list(request.all_token_ids[start:start + n - len(entry.spec_token_ids)])
            problem = None
            if (status is spec.Status.WAITING) != (type(entry) is NewRequestData):
                problem = f"{type(entry).__name__} for a request that was {status.name}"
            elif (status is spec.Status.PREEMPTED) != entry.resumed_from_preemption:
                problem = f"resumed_from_preemption={entry.resumed_from_preemption} for {status.name}"
            elif type(entry) is NewRequestData and list(entry.prompt_token_ids) != list(
                    request.prompt_token_ids):
                problem = "new-request data with another prompt"
            elif tuple(entry.new_block_ids) != table[len(old_table):]:
                problem = f"block ids {tuple(entry.new_block_ids)}, table grew by {table[len(old_table):]}"
            elif list(entry.new_token_ids) != known:
                problem = f"token ids {list(entry.new_token_ids)}, the known tokens are {known}"
            elif entry.num_cached_tokens != (0 if status is spec.Status.RUNNING else start):
                problem = f"num_cached_tokens {entry.num_cached_tokens}, the prefix hit is " \
                          f"{0 if status is spec.Status.RUNNING else start}"
            if problem is not None:
                self._fail(f"batch {output.batch_id}, entry of r{slot} ({entry.req_id}): {problem}")

    def _expected_after_completion(self, before: spec.State,
                                   action: spec.CompleteOldest) -> tuple[spec.State, spec.State | None]:
        """The spec's successor, and (under name reuse) the successor with
        every entry whose name another request now holds dropped from the
        oldest batch, with its sample: outputs bound by incarnation, the
        reference's named deviation `reused_id_output_dropped` (None when
        the oldest batch holds no such entry)."""
        expected = spec.step(before, self.spec_cfg, action)
        expected = before if expected is None else expected
        if not (self.spec_cfg.allow_name_reuse and before.in_flight):
            return expected, None
        oldest = before.in_flight[0]
        misbound = {e for e in oldest
                    if holder_of(before, e.lookup_name) not in (None, e.req)}
        if not misbound:
            return expected, None
        sampling = spec.sampling_entries(before, self.spec_cfg)
        kept = tuple(s for e, s in zip(sampling, action.samples) if e not in misbound)
        dropped = replace(before, in_flight=(tuple(e for e in oldest if e not in misbound),)
                          + before.in_flight[1:])
        by_incarnation = spec.step(dropped, self.spec_cfg, spec.CompleteOldest(kept))
        return expected, by_incarnation

    def _fail(self, message: str) -> None:
        self.broken = True
        if self.budget is not None:
            self.budget.fail()
        steps = "\n".join(f"  {i:3} {str(a):<40} -> {spec.describe(s)}"
                          for i, (a, s) in enumerate(self.history, start=1))
        raise AssertionError(f"{message}\nspec actions and abstract states:\n{steps}")



NO_DEADLOCK = "L2_no_deadlock"


def stalls_below_padding_budget(s: spec.State, cfg: spec.Config) -> bool:
    """vLLM 0.33's and 0.34's stall below the padding budget
    (docs/request-states.md, "Finding: a one-token admission below the
    padding budget"): with k drafts and a budget of k tokens or fewer (which
    `VllmConfig._set_max_num_scheduled_tokens` takes for the n-gram
    proposer), `Scheduler.schedule`'s waiting loop pads a head with one
    token past its prefix hit to 1 + k tokens and breaks rather than admit
    it un-padded, every call. It is that stall when L2 breaks in `s` and
    holds in `s` under a budget of 1 + k, where the padding fits."""
    if not 0 < cfg.num_spec_tokens >= cfg.max_num_batched_tokens:
        return False
    room = replace(cfg, max_num_batched_tokens=cfg.num_spec_tokens + 1)
    l2 = {inv.name: inv for inv in spec.invariants_for(cfg)}[NO_DEADLOCK]
    return not l2.holds(s, cfg) and l2.holds(s, room)
