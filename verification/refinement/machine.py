"""Refinement: the reference scheduler, driven through its engine with
arbitrary interleavings, takes exactly the steps the spec takes.

A Hypothesis `RuleBasedStateMachine` whose rules are the spec's actions
(arrive, schedule, complete the oldest batch, abort) and whose preconditions
are the engine's guards. The environment's choices are rule arguments: the
configuration (drawn once, in `setup`), each arrival's prompt (lengths and
shared prefixes, so prefix hits happen; small pools, so preemption happens),
whether a name is reused after an abort, and for each completed batch what
the model returned (EOS or not, accepted drafts, drafts proposed next), fed
to the reference through the `ScriptedExecutor` callback. After every rule:

    abstract(after) == spec.step(abstract(before), cfg, action)

with the same environment choices, every spec invariant holds on the
abstracted state, every transition property on the step, and the engine's
guards agree with the spec's. A failure prints as a short replayable
program (Hypothesis shrinks it); the state it broke is in the message.

The version profile is the reference's and the spec's: a run drives every
profile the reference models in turn (fuzz.py `DEFAULT_RUN_PROFILES`,
`profile_steps`), or `flightcheck fuzz --profile` pins one. Under
`vllm-0.33` the reference runs 0.33's rules and counters and the spec its own
reading of them (the abstraction maps the counters, names and drop flag), the
engine is driven through 0.33's loop (`VLLM_0_33_LOOP`: a schedule step queues
its batch even empty, as the spec's `schedule` queues an empty batch), and
each configuration draws deliver or drop mode (`drop_stale_output`, the
spec's `stale_mode`). One step of vLLM's loop is not taken: an empty batch
queued only to carry finished ids to the workers (vLLM's `has_requests()`
with no unfinished request; the spec queues an empty batch only while a
request is unfinished); the engine's own run in `teardown` takes it, and
check-trace reads the trace it leaves.

Under `vllm-0.33-async` (vLLM 0.33's AsyncScheduler) everything of `vllm-0.33`
holds, the loop is 0.33's at depth K + 1 (`loop_for_config`), the abstraction
maps the placeholders and the decode countdown (abstraction.py
`_async_counters`), and the worker keeps the tokens it samples, as the V2
runner does (`ScriptedExecutor(keeps_sampled_tokens=True)`).

Names (`allow_name_reuse`, off by default; `flightcheck fuzz` leaves it off):
under 0.33 a request arrives under a fresh name unless the knob is on; under
0.8.x `reuse` may take a finished request's name (the spec binds by
incarnation there, names are invisible). With the knob on under 0.33 the spec
looks outputs up by name, as vLLM does, and the correct reference does not
(its named deviation `reused_id_output_dropped`: an output of an older
request of the id is dropped). So a completion whose oldest batch holds such
an entry has two images: the spec's step (vLLM's binding: the token and
counters land on the new request) and the spec's step with those entries
dropped (binding by incarnation). The reference must reach one of them; the
second is the named deviation, and the first is flagged by the spec's own
S7' and IF1 on the state reached (a reference that binds by id alone, as vLLM
does, fails there: the reference mutant `output_bound_by_id_alone`).

The environment's draws are in strategies.py, the checks after every rule
in checks.py, the step budget in budget.py; this module is the machine: its
rules, their preconditions, and the model's answers.
"""

from __future__ import annotations
import functools
import io
from collections.abc import Callable
from dataclasses import replace

from flightcheck.reference import (
    Engine,
    Request,
    RequestStatus,
    SamplingParams,
    SchedulerConfig,
    ScriptedExecutor,
    TraceWriter,
    make_scheduler,
)
from flightcheck.reference import Sample as RefSample
from flightcheck.reference.drive import loop_for_policy
from flightcheck.reference.engine import loop_for_config
from flightcheck.reference.outputs import SchedulerOutput
from flightcheck.reference.profiles import get_profile
from flightcheck.verification.mutants.patching import active_reference
from flightcheck.verification.refinement.abstraction import Ledger, output_token, spec_config
from flightcheck.verification.refinement.budget import Budget, BudgetSpent
from flightcheck.verification.refinement.checks import AbortMany, RefinementChecks
from flightcheck.verification.refinement.strategies import (
    EOS,
    FUZZED_PROFILES,
    NEAR_CAP,
    NUM_SLOTS,
    UNKNOWN,
    Outcome,
    configs,
    outcomes,
    prompt_tokens,
)
from hypothesis import currently_in_test_context, note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from flightcheck import spec
from flightcheck.spec.actions import max_next_drafts

# fuzz.py and the tests import these from here (and patch `Budget.tick`)
__all__ = ["FUZZED_PROFILES", "Budget", "BudgetSpent", "Outcome", "RefinementMachine",
           "machine_factory", "pinned_machine"]


def _step(fn, counts: bool = True):
    """A rule body: counts against the budget, and any exception in it marks
    the run as failed (so the budget no longer cuts replays short)."""
    @functools.wraps(fn)
    def run(self, **kwargs):
        if counts and self.budget is not None:
            self.budget.tick()
        try:
            return fn(self, **kwargs)
        except Exception:
            self.broken = True
            if self.budget is not None:
                self.budget.fail()
            raise
    return run


def _guard(fn):
    """setup and teardown: not steps, but their exceptions are failures too."""
    return _step(fn, counts=False)


class RefinementMachine(RefinementChecks, RuleBasedStateMachine):
    """The reference (optionally one of its mutants) against the correct spec.

    A mutant is put in force by whoever runs the machine
    (`reference_applied(mutant)` around the run, as `fuzz` does); the
    machine names it in its failure reports and its trace, and refuses to
    run when a different one (or none) is in force."""

    def __init__(self, mutant: str | None = None, budget: Budget | None = None,
                 check_traces: bool = False, allow_name_reuse: bool = False) -> None:
        super().__init__()
        self.mutant, self.budget, self.check_traces = mutant, budget, check_traces
        self.allow_name_reuse = allow_name_reuse
        self.num_reused_id_outputs_dropped = 0   # the reference's named deviation, seen
        self.num_padding_stalls = 0              # L2 broken as vLLM stalls (checks.py `_vllms_own_breaks`)
        self.engine: Engine | None = None
        self.broken = False           # this program failed: teardown checks nothing more

    # -- configuration --------------------------------------------------------

    @initialize(cfg=configs(), sample_every_chunk=st.booleans())
    @_guard
    def setup(self, cfg: SchedulerConfig, sample_every_chunk: bool) -> None:
        if active_reference() != self.mutant:
            raise ValueError(f"the machine checks reference mutant {self.mutant}, but "
                             f"{active_reference()} is in force (patching.reference_applied)")
        # Names matter only where outputs are looked up by name (vLLM 0.33).
        self.by_name = get_profile(cfg.profile).stale_output_counters
        self.cfg = cfg
        self.spec_cfg = spec_config(cfg, allow_name_reuse=self.by_name and self.allow_name_reuse)
        self.sink = io.StringIO() if self.check_traces else None
        extra = {"mutant": self.mutant} if self.mutant is not None else None
        trace = TraceWriter(self.sink, eos_token_id=EOS, extra=extra) if self.sink is not None else None
        self.scheduler = make_scheduler(cfg, trace)
        # sample_every_chunk: a worker that returns a token for every chunk
        # (vLLM <= 0.8.2) leaves the scheduler to discard partial chunks' tokens.
        # Async scheduling (vllm-0.33-async): the worker keeps the tokens it
        # samples, as the V2 runner does, so a decode scheduled on a
        # placeholder samples the next position, and one scheduled on drafts
        # rejected since samples where the tokens end (not where its stale
        # start says).
        self.executor = ScriptedExecutor(self._sample, sample_every_chunk=sample_every_chunk,
                                         keeps_sampled_tokens=cfg.async_scheduling)
        # 0.8.x: the loop of the config's policy; 0.33: its own (empty batches).
        loop = loop_for_config(cfg) if self.by_name else loop_for_policy(cfg.continue_prefill)
        self.engine = Engine(self.scheduler, self.executor, loop)
        self.ledger = Ledger(NUM_SLOTS, cfg.block_size, cfg.enable_prefix_caching)
        self.state = spec.initial_state(NUM_SLOTS, cfg.num_blocks)
        self.outcomes: list[Outcome] = []
        self.stale_names: set[str] = set()           # names whose entry in the completing batch is stale
        self.calls: dict[str, spec.Sample] = {}      # req id -> what its entry sampled
        self.num_calls = 0
        self.num_aborts = 0
        self.num_completes = 0
        self.num_batches = 0                          # batches submitted: the last batch id
        # Requests finished (by the spec's statuses) since the last batch that
        # carried finished ids to the workers: what keeps `has_requests()` true.
        self.finished_unreported: set[int] = set()
        self._schedule_memo: tuple[spec.State | None, bool] = (None, False)
        self.history: list[tuple[spec.Action, spec.State]] = []   # for the failure report
        if self.mutant is not None and currently_in_test_context():   # not in a replay by hand
            note(f"reference mutant: {self.mutant}")

    # -- rules: the spec's actions ---------------------------------------------

    @precondition(lambda self: self.engine is not None and self._may_arrive())
    @rule(prompt_len=st.integers(1, 4) | st.integers(1, 15 + NEAR_CAP), family=st.integers(0, 1),
          tail=st.integers(0, 4), max_tokens=st.integers(6, 20), reuse=st.integers(0, 3))
    @_step
    def arrive(self, prompt_len: int, family: int, tail: int, max_tokens: int, reuse: int) -> None:
        """A request arrives: all but `tail` of its prompt tokens are its
        `family`'s shared prefix; `reuse` > 0 takes the name of a finished one.
        Prompts fill at most half the model length, so that requests decode
        long enough (max_tokens 6..20, EOS rare) to be preempted mid-decode;
        `prompt_len` past 15 (one arrival in ten) is a prompt a few tokens
        short of max_model_len instead, so that a request runs into the
        length cap with drafts proposed past it (where `_clip` binds)."""
        slot = len(self.ledger.requests)
        name = self._name(slot, reuse)
        if prompt_len > 15:
            length = max(1, self.cfg.max_model_len - 1 - (prompt_len - 16))
        else:
            length = 1 + (prompt_len - 1) % max(1, self.cfg.max_model_len // 2)
        request = Request(name, prompt_tokens(slot, family, max(0, length - tail), length),
                          SamplingParams(max_tokens=max_tokens), eos_token_id=EOS)
        self._before_add(request, slot)
        self.engine.add_request(request)
        _, prompt = self.ledger.arrive(request)
        name = self.ledger.name_of(slot) if self.by_name else None
        self._check(spec.Arrive(slot, prompt) if name is None else spec.ArriveAs(slot, prompt, name))

    def _before_add(self, request: Request, slot: int) -> None:
        """A subclass's hook on a request about to be added: an arrival, or
        (sessions_machine.py) a session's next input under its id
        (priority_machine.py, lora_machine.py, priority_sessions_machine.py)."""

    @precondition(lambda self: self.engine is not None and self.engine.can_schedule()
                  and self._spec_schedules())
    @rule()
    @_step
    def schedule(self) -> None:
        """Form a batch, offered when the spec would form one (a schedule the
        spec refuses is still tried, by `engine_step`, whenever the queue has
        room: that is where a reference that schedules too much is caught)."""
        self._schedule()

    @precondition(lambda self: self.engine is not None and self.engine.can_complete()
                  and self.num_completes * 8 <= len(self.history))
    @rule(returned=outcomes())
    @_step
    def complete(self, returned: list[Outcome]) -> None:
        """The oldest batch returns, whatever the engine would do; `returned[i]`
        is what the model gave the i-th entry it sampled for. At most one per
        eight steps: completing out of the engine's order keeps every request's
        decodes in one batch (lockstep), and the engine's own order
        (`engine_step`), which staggers them, is where a request is preempted
        with its decode in flight."""
        self.num_completes += 1
        self._complete(returned)

    @precondition(lambda self: self.engine is not None and (
        self.engine.can_complete() or self.scheduler.has_unfinished_requests()))
    @rule(returned=outcomes())
    @_step
    def engine_step(self, returned: list[Outcome]) -> None:
        """The engine's own choice (`Engine.step`): schedule while the queue
        has room and something is scheduled, else complete the oldest batch.
        vLLM 0.33's loop: schedule (queueing the batch, empty or not) while a
        request is unfinished and the queue has room; complete the oldest
        when the queue is full or nothing ran and no request is left."""
        if self.engine.loop.enqueues_empty_batches:
            self._step_queueing_empty_batches(returned)
            return
        if self.engine.can_schedule() and self._schedule():
            return
        if self.engine.can_complete():
            self._complete(returned)

    def _step_queueing_empty_batches(self, returned: list[Outcome]) -> None:
        """vLLM 0.33's loop (`EngineCore.step_with_batch_queue`): schedule
        while a request is unfinished and the queue has room, else complete."""
        if self.scheduler.has_unfinished_requests() and self.engine.can_schedule():
            ran = self._schedule()
            if self.engine.can_schedule() and (ran or self.scheduler.has_unfinished_requests()):
                return
        if self.engine.can_complete():
            self._complete(returned)

    @precondition(lambda self: self.engine is not None and (
        self._may_abort() or not self._can_progress()))
    @rule(which=st.lists(st.integers(UNKNOWN, NUM_SLOTS - 1), min_size=1, max_size=3))
    @_step
    def abort(self, which: list[int]) -> None:
        """Abort, in one call, the requests that arrived `which[i]`-th (mod
        arrivals), whatever they are doing; UNKNOWN is an id no request ever
        had, and a repeated one is finished by the time its turn comes, so a
        call mixes live, finished and unknown ids in any order (vLLM's engine
        aborts a list). One id goes through the engine's `abort_request`.
        (Aborts of finished and unknown requests, no-ops, are `abort`'s
        fallback when nothing else is enabled.)

        In a resume window (`_resume_window`) the abort takes one of the
        running requests that hold the blocks, `which[0]`-th of them."""
        holders = self._resume_window()
        if holders:
            names = [self.ledger.requests[holders[which[0] % len(holders)]].request_id]
        else:
            requests = [r for r in self.ledger.requests if not r.is_finished()] or self.ledger.requests
            names = [requests[w % len(requests)].request_id if requests and w != UNKNOWN else "nobody"
                     for w in which]
        slots = [self.ledger.active_slot(name) for name in names]
        self.num_aborts += 1
        if len(names) == 1:
            self.engine.abort_request(names[0])
            self._check(spec.Abort(-1 if slots[0] is None else slots[0]))
            return
        self.scheduler.finish_requests(names, RequestStatus.FINISHED_ABORTED)
        expected = self.state
        for slot in slots:
            after_abort = spec.step(expected, self.spec_cfg, spec.Abort(-1 if slot is None else slot))
            if after_abort is not None:             # None: a no-op in the spec
                expected = after_abort
        self._check(AbortMany(tuple(-1 if s is None else s for s in slots)), expected=expected)

    def _may_arrive(self) -> bool:
        """Arrivals while a slot is left, at most two requests wait, and a
        batch is in flight (or nothing is left to do): a long waiting queue
        refills every freed slot at once, and then the victim of every
        preemption is a request still in its first prefill, never one with
        decodes or drafts in flight."""
        return (len(self.ledger.requests) < NUM_SLOTS and len(self.scheduler.waiting) <= 2
                and (self.engine.can_complete() or not self.scheduler.has_unfinished_requests()))

    def _may_abort(self) -> bool:
        """Aborts are the environment's rare event: while a request runs or
        work is in flight, and at most one per 25 steps. Unthrottled they
        would be a quarter of all steps, and few requests would live long
        enough to be preempted with a batch in flight. (When nothing else is
        enabled, abort is, so that a program can always go on.)"""
        busy = bool(self.scheduler.running) or (bool(self.scheduler.waiting)
                                                and self.engine.can_complete())
        return (busy and self.num_aborts * 25 <= len(self.history)) or bool(self._resume_window())

    def _resume_window(self) -> list[int]:
        """The running requests an abort would take to open a resume window
        (vLLM 0.8.x), else none. A request preempted while a sampling entry of
        its was in flight resumes before that stale output returns (where
        the output must be discarded, not applied to the new incarnation)
        only if blocks free up in between, and the request that took its
        blocks rarely finishes within the two or three steps left: in
        unmutated runs 46 of 571 such entries came back to a resumed
        request. So while such an entry is in flight and a schedule can
        still come before it returns (the queue has room, or the entry is
        not in the oldest batch), an abort is enabled, unthrottled, and
        takes one of the other running requests: 81 of 527
        (`python benchmarks/fuzz_events.py [--without-resume-window]`,
        seeds 0-19; docs/fuzzing.md, "The resume window")."""
        if self.engine is None or self.by_name:
            return []
        state = self.state
        owners = {e.req for batch in state.in_flight for e in batch
                  if e.fate is spec.Fate.ORPHANED and e.samples
                  and state.requests[e.req].status is spec.Status.PREEMPTED}
        if not owners or not (self.engine.can_schedule() or any(
                e.req in owners for batch in state.in_flight[1:] for e in batch)):
            return []
        return [slot for slot, r in enumerate(state.requests)    # (the owners are preempted)
                if r.status is spec.Status.RUNNING]

    def _spec_schedules(self) -> bool:
        """Whether the spec's schedule forms a batch from the current state
        (memoised per state: preconditions are evaluated often)."""
        if self._schedule_memo[0] is not self.state:
            self._schedule_memo = (self.state, spec.schedule(self.state, self.spec_cfg) is not None)
        return self._schedule_memo[1]

    def _can_progress(self) -> bool:
        return (len(self.ledger.requests) < NUM_SLOTS or self.engine.can_complete()
                or self.scheduler.has_unfinished_requests())

    def _schedule(self) -> bool:
        """One schedule call, checked; whether a batch with tokens was
        submitted. Under vLLM 0.33's loop the batch is queued even empty."""
        before = self.state
        if self.engine.loop.enqueues_empty_batches:
            queued: SchedulerOutput | None = self.engine.enqueue_step()
            output = queued if queued.total_num_scheduled_tokens else None
        else:
            queued = output = self.engine.schedule_step()
        scheduled = spec.schedule(before, self.spec_cfg)
        if output is not None or (queued is not None and self.by_name):
            # A batch with tokens carries the finished ids to the workers;
            # under vLLM 0.33 an empty batch queued does too.
            self.finished_unreported.clear()
        if queued is not None:
            self.ledger.record_batch(self.scheduler, queued)
            if scheduled is None:
                self._fail(f"the reference queued a batch, the spec schedules nothing\n"
                           f"  before: {spec.describe(before)}")
        if output is not None:
            self.num_batches += 1
            if output.batch_id != self.num_batches:
                self._fail(f"batch {self.num_batches} was submitted with batch id {output.batch_id}")
        self._check(spec.Schedule(), expected=before if scheduled is None else scheduled.state)
        if output is not None:
            self._check_request_data(before, output)
        return output is not None

    def _complete(self, returned: list[Outcome]) -> None:
        self.outcomes, self.calls, self.num_calls = list(returned), {}, 0
        if not self.by_name:
            # vLLM 0.8.x: an orphaned or superseded entry's output is
            # discarded, so what it samples matters only to a wrong
            # scheduler, and the one thing it could misapply to the live
            # counter is rejected drafts: such an entry rejects every draft
            # (`_sample`). Measured: rejections_subtracted_after_reset, which
            # needs that, killed from all 30 seeds of 0-29 instead of 27
            # (docs/fuzzing.md). Under 0.33 a deliver-mode stale output's
            # acceptance counts, so it is drawn as for any entry.
            oldest = self.state.in_flight[0] if self.state.in_flight else ()
            self.stale_names = {self.ledger.requests[e.req].request_id for e in oldest
                                if e.fate is not spec.Fate.LIVE}
        sampling = spec.sampling_entries(self.state, self.spec_cfg)
        completed = self.engine.batch_queue[0][0]
        # Who receives each entry's output: the request of its slot, or under
        # vLLM 0.33's lookup by name whoever holds the name now.
        slot_of = {e.req_id: self._receiver(e) for e in completed.entries}
        num_output = {slot: self.state.requests[slot].num_output for slot in slot_of.values()}
        outputs = self.engine.complete_oldest_step()
        next_ids = [out.batch_id for out, _ in self.engine.batch_queue if out.batch_id is not None]
        if completed.batch_id is not None and next_ids and next_ids[0] != completed.batch_id + 1:
            self._fail(f"batch {completed.batch_id} completed, then batch "
                       f"{next_ids[0]} is the oldest with tokens in flight")
        for output in outputs:
            # What the engine streams to the client: exactly the tokens this
            # batch appended to the request (none past the one that stopped it).
            slot = slot_of.get(output.request_id)
            if slot is None and output.finish_reason == "error" and not output.new_token_ids:
                continue                      # a KV load's error (kv_machine.py): no batch entry
            self._check_streamed(completed.batch_id, output, slot_of[output.request_id], num_output)
        names = [self.ledger.requests[e.req].request_id for e in sampling]
        samples = tuple(self.calls.get(name, spec.Sample()) for name in names)
        self._check(spec.CompleteOldest(samples))

    def _check_streamed(self, batch_id: int | None, output, slot: int, num_output: dict[int, int]) -> None:
        """What the engine streams to the client for r`slot`: exactly the
        tokens this batch appended to it (`num_output`: its outputs before)."""
        appended = list(self.ledger.requests[slot].output_token_ids[num_output[slot]:])
        if list(output.new_token_ids) != appended:
            self._fail(f"batch {batch_id} returns {list(output.new_token_ids)} for "
                       f"r{slot}, which it appended {appended}")

    def _receiver(self, entry) -> int:
        """The slot an entry's output would be applied to: its own, or
        (vLLM 0.33, by name) the unfinished request of its id, if any."""
        own = self.ledger.entry_slot(entry.req_id, entry.incarnation)
        if not self.by_name:
            return own
        holder = self.ledger.active_slot(entry.req_id)
        return own if holder is None else holder

    @_guard
    def teardown(self) -> None:
        if self.check_traces and self.engine is not None and not self.broken:
            self._check_trace()

    # -- the model's answers (ScriptedExecutor callback) -----------------------

    def _sample(self, req_id: str, position: int, drafts: list[int]) -> RefSample:
        """Tokens are unique to (slot, position), so no two requests share an
        output-containing block; EOS and drafts come from the rule's outcomes."""
        index = self.num_calls
        self.num_calls += 1
        outcome = self.outcomes[index] if index < len(self.outcomes) else Outcome()
        if req_id in self.stale_names:
            outcome = replace(outcome, accepted=0)
        slot = self.ledger.active_slot(req_id)
        slot = len(self.ledger.requests) if slot is None else slot   # stale: any unused range
        accepted = min(outcome.accepted, len(drafts))
        bonus = position + accepted
        token = EOS if outcome.eos else output_token(slot, bonus)
        proposed = tuple(EOS if j == outcome.eos_draft else output_token(slot, bonus + 1 + j)
                         for j in range(outcome.drafts))
        generated = [*drafts[:accepted], token]
        stop_at = next((i for i, t in enumerate(generated) if t == EOS), None)
        # (the spec's completion brings no drafts where they are placeholders: max_next_drafts)
        self.calls[req_id] = spec.Sample(accepted, stop_at,
                                         min(len(proposed), max_next_drafts(self.spec_cfg)))
        return RefSample(token, accepted, proposed)


    # -- bookkeeping ------------------------------------------------------------

    def _name(self, slot: int, reuse: int) -> str:
        """A fresh name, or (reuse > 0) the name of a finished request that no
        active request holds (under vLLM 0.33 only with `allow_name_reuse`);
        under 0.8.x one whose older request has an entry in flight first."""
        if reuse and (self.allow_name_reuse or not self.by_name):
            taken = {r.request_id for r in self.ledger.requests if not r.is_finished()}
            free = sorted({r.request_id for r in self.ledger.requests} - taken)
            if not self.by_name:
                # vLLM 0.8.x: names with an entry of their older request
                # still in flight first, then the rest in order. That older
                # output completing while the name is taken again is where
                # an output bound by name (the mutant output_bound_by_name)
                # shows; before, `reuse` took a name in order, most often
                # one with nothing in flight. The correct reference binds by
                # incarnation, so the name taken changes no step of its run:
                # the same draws give the same run for every mutant that
                # does not look requests up by name (measured: their steps
                # to kill are unchanged, docs/fuzzing.md). Under 0.33 (names
                # visible, reused only with allow_name_reuse) the order
                # stays as it was.
                in_flight = {e.req_id for out, _ in self.engine.batch_queue for e in out.entries}
                free = ([name for name in free if name in in_flight]
                        + [name for name in free if name not in in_flight])
            if free:
                return free[(reuse - 1) % len(free)]
        return f"r{slot}"



@functools.cache
def pinned_machine(profile: str) -> type[RefinementMachine]:
    """The machine with every configuration under one version profile
    (RefinementMachine itself for the default one)."""
    get_profile(profile)                                    # ValueError naming the known ones
    if profile == FUZZED_PROFILES[0]:
        return RefinementMachine

    class PinnedRefinementMachine(RefinementMachine):
        @initialize(cfg=configs(profile), sample_every_chunk=st.booleans())
        def setup(self, cfg: SchedulerConfig, sample_every_chunk: bool) -> None:
            RefinementMachine.setup(self, cfg=cfg, sample_every_chunk=sample_every_chunk)

    PinnedRefinementMachine.__name__ = PinnedRefinementMachine.__qualname__ = \
        f"RefinementMachine[{profile}]"
    return PinnedRefinementMachine


def machine_factory(mutant: str | None = None, budget: Budget | None = None,
                    check_traces: bool = False, profile: str | None = None,
                    allow_name_reuse: bool = False) -> Callable[[], RefinementMachine]:
    """Machines for one run under the version `profile` (None: the default);
    `allow_name_reuse` lets names be reused under vLLM 0.33 (the module doc)."""
    machine = pinned_machine(FUZZED_PROFILES[0] if profile is None else profile)

    def make() -> RefinementMachine:
        return machine(mutant, budget, check_traces, allow_name_reuse)
    return make
