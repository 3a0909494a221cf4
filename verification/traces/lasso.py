"""L4_no_livelock, the trace checker's progress rule: a scheduler that goes
round a lasso of its own work with nothing from the environment loops for
ever, and the trace is rejected where the lasso closes.

The rule. At a `schedule` event that preempted a request (the anchor), the
checker notes the spec's whole state after it (`State`, with the checker's
own pending notes of empty schedule() calls). If a later anchor finds the
same state, and every event between was the scheduler's own -- `schedule`
events, and `complete` events that applied no token (`quiet_completion`:
none returned, or only tokens the scheduler dropped) -- and nothing waits on the environment
(spec/deadlock.py `waits_on_environment`: a KV load or send to be reported,
a grammar compiling, a failed grammar to be finished), the run is on a
lasso: rejected as L4_no_livelock at the second anchor, naming the requests
preempted on the cycle, the lines of the two anchors and the cycle's length.
Any other event (an arrival, an abort, a finish, a session's input, a reset
or pause, a KV report, a grammar settled, a stage) is the environment's, or
progress, and forgets every state noted; so does a completion that applied
a token (progress, or the environment's choice of tokens).

What a quiet completion may carry. A token the scheduler dropped (`dropped`:
its request preempted, finished or aborted since the batch) is applied to
nothing, so its value cannot steer what follows. Drafts proposed
(`next_drafts`) are held in the spec's state (`Request.num_drafts`), and a
drafter proposes as a function of the request's tokens and position (vLLM
0.34.0 v1/worker/gpu/spec_decode/ngram/speculator.py `propose`: an n-gram
match over the request's token ids; the campaign's fabricated proposer,
flightcheck/vllm/workload.py `draft_outcome`, a function of request and
position), which the lasso brings back: the same drafts come round again.
Counting either as the environment's let a loop go by (seed 403 index 48
of the hunt over seeds 403-409, 0.34.0 async, three stages: r4, 23
tokens, is admitted beside a parked session whose client never ends, samples,
is proposed 2 drafts, and the next `schedule()` finds no block for 1 + 2
slots past its placeholder and preempts r4 itself; its token comes back
dropped, and round again to the step limit).

Why the loop is for ever (once suffices). Between the two anchors the
spec's run is a function of its state: `schedule` is deterministic in
(State, Config) (spec/schedule.py), a quiet completion applies no token
(one that samples a live entry must return one, S5, and is no quiet event;
a stale entry's token is dropped whatever it is) and its drafts are the
drafter's function of the state (below), and the reorders and empty batches
of empty schedule() calls are the spec's own steps from the state. So from the
second anchor the spec's run, the environment quiet, repeats the cycle for
ever. The checker compared every decision of the writer with the spec's on
the way, so the writer took the same cycle; it leaves it only by deciding
otherwise than the spec, where check-trace rejects it anyway. What vLLM
keeps and the spec's state leaves out cannot break the cycle, because it
does not decide: block ids are the spec's up to the checker's renaming,
and which block is taken next is the spec's free queue in eviction order
(vLLM 0.33.0 index 84 of the hunt of seeds 364-395 alternates two blocks,
so its lasso is two rounds long, 30 lines, not one); the prefill cadence
reads only `(num_executed_steps + 1) - last_prefill_step < interval`,
which the spec keeps exactly as `prefill_hold` floored at 0 (cadence.py),
and the PP decode throttle's `current_step` as each request's
`decode_countdown` floored at 0; `Request.num_preemptions` is read for
statistics only (0.34.0 scheduler.py `prefill_stats`,
`connector_prefix_cache_stats`); arrival times, priorities and prompt
content are fixed at arrival. Where the spec missed a deciding part, it
would already reject correct runs there (campaigns check that). So one
recurrence is a lasso, as for the ground truth's (flightcheck/vllm/
ground_truth.py `_fc_check_livelock`: two preemptions in a row from one
state of the requests, the batches in flight, the queues and the free
blocks).

Why a correct run never trips it. Every anchor's state has a request
preempted: the cycle does work and throws it away. A scheduler that cannot
run what it holds waits (L2, spec/deadlock.py, whose waits on a session's
client are no stall); one that admits, computes and preempts the same work
from the same state for ever is the thrash vLLM's admission gate
(`KVCacheManager.allocate_slots(..., full_sequence_must_fit=True)`) is
there to prevent. Only the environment could end it, and the rule speaks
only while the environment is quiet and nothing waits on it (a transfer,
a grammar: their reports come, and a fair run ends the spin, as the
explicit search's `_fair_system_edges`). A cycle without a preemption
cannot come back to its state: each non-empty batch advances the computed
tokens, and only a preemption (or the environment: a reset, a failed load)
takes them back; an idle cycle (empty batches) is L2's to judge. A lasso
the environment breaks later was still closed while it was quiet, and is
named (seed 388 index 43 of the hunt, tests/test_vllm_hunt395_livelock.py:
two rounds of the lookahead gate's loop, then the parked sessions' clients
end them; the ground truth names it at the same preemption).

Beside the explicit search. Its L4_every_run_terminates (explicit/search.py
`_check_liveness`) finds the same loop on a model of one request whose
prompt fits the pool and whose lookahead slots do not (vLLM 0.33 and 0.34
profiles; a pool below max_model_len, which vLLM refuses at start-up, and
which the model's own size check, counting no lookahead slot, lets by),
but not beside a parked session: a model's client always has
its next input (the session's end at least) to send, and a spin while it
waits is unfair there (`_fair_system_edges`). A trace's client may never
send it (index 84's session is never ended), so here the spin is judged
on what the trace shows: a lasso closed while the environment was quiet.

Cost: one tuple of the live requests' counters per preempting schedule
event in a quiet stretch (`_sketch`), the whole state compared only where
a sketch recurs. Both checkers (full and incremental, whose reused slots
change only at arrivals, which forget every note) and the fast path (which
takes no preempting schedule event; its events pass here too) give the
same verdict: the drivers (check.py `check_events`, stream.py) call
`watch_lasso` after every event a checker took.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, Callable

from flightcheck.spec import State
from flightcheck.spec.deadlock import waits_on_environment

from .named_state import quoted

LIVELOCK = "L4_no_livelock"


class _Anchor:
    """A preempting schedule event of the current quiet stretch."""

    __slots__ = ("state", "line", "schedules", "preempted")

    def __init__(self, state: Any, line: int, schedules: int, preempted: list[str]) -> None:
        self.state, self.line, self.schedules, self.preempted = state, line, schedules, preempted


class LassoWatch:
    """A mixin of replay.py's TraceChecker: the progress rule of the module
    docstring, fed every event the checker took (`watch_lasso`)."""

    state: State
    pending_empty_calls: int
    pending_empty_completions: int
    finished_unflushed: bool
    _violation: Callable[[str, str], Exception]

    # the quiet stretch's anchors by sketch (None: no anchor since the last loud event)
    _lasso_anchors: dict[tuple, list[_Anchor]] | None = None
    _lasso_schedules = 0            # schedule events of the quiet stretch
    _lasso_reported = False         # a lasso of this stretch was reported (keep-going: once)

    def watch_lasso(self, event: dict[str, Any], line: int) -> None:
        """After the checker took `event` (on line `line`): note an anchor,
        or forget the notes at a loud event; raise L4_no_livelock where an
        anchor's state recurs."""
        kind = event["ev"]
        if kind == "schedule":
            self._lasso_schedules += 1
            if event.get("preempted") and not self._lasso_reported:
                self._anchor(list(event["preempted"]), line)
        elif kind != "complete" or not quiet_completion(event):
            self.forget_lasso()

    def forget_lasso(self) -> None:
        """A loud event (or, keep going, a violation): no state noted before it counts."""
        self._lasso_anchors, self._lasso_schedules, self._lasso_reported = None, 0, False

    def _anchor(self, preempted: list[str], line: int) -> None:
        state = self.state
        key = (_sketch(state), self.pending_empty_calls, self.pending_empty_completions, self.finished_unflushed)
        if self._lasso_anchors is None:
            self._lasso_anchors = {}
        earlier = self._lasso_anchors.setdefault(key, [])
        for anchor in earlier:
            if _recurs(anchor.state, state) and not waits_on_environment(state):
                self._lasso_reported = True
                raise self._violation(LIVELOCK, self._lasso_message(anchor, preempted, line))
        earlier.append(_Anchor(state, line, self._lasso_schedules, preempted))

    def _lasso_message(self, first: _Anchor, preempted: list[str], line: int) -> str:
        anchors = self._lasso_anchors or {}
        names: dict[str, None] = {}
        for anchor in sorted((a for row in anchors.values() for a in row), key=lambda a: a.line):
            if anchor.line > first.line:
                names.update(dict.fromkeys(anchor.preempted))
        names.update(dict.fromkeys(preempted))
        who = ", ".join(quoted(n) for n in names)
        calls = self._lasso_schedules - first.schedules
        return (f"a livelock: the spec's state after line {first.line}'s preemption comes back at line {line} "
                f"({line - first.line} lines, {calls} schedule events later), with no token applied and "
                f"nothing from the environment between and nothing waiting on it: {who} "
                f"{'is' if len(names) == 1 else 'are'} scheduled and preempted round this lasso for ever")


def quiet_completion(complete: dict[str, Any]) -> bool:
    """A completion that applies nothing the environment chose: every token
    it returned was dropped (or none was returned); drafts it proposed are
    state, a function of the request's tokens (the module docstring). (The
    vLLM recorder's `stale`, an entry of a preempted request counted
    against its stale share, is vLLM's own bookkeeping: quiet.)"""
    dropped = set(complete.get("dropped") or ())
    return all(req in dropped for req, tokens in complete.get("tokens", {}).items() if tokens)


def _recurs(earlier: State, now: State) -> bool:
    """`now` is `earlier` again, but for the `is_prefill_chunk` of requests
    that do not run and have nothing in flight: vLLM keeps the flag through
    a preemption (0.33.0/0.34.0 `Scheduler._preempt_request` leaves it) and
    reads it of running requests (the cadence's `any(not
    r.is_prefill_chunk for r in self.running)`, the running loop's deferral
    and `prefill_scheduled`) and of those whose batch returns drafts
    (`update_draft_token_ids`: none without an entry in flight), and
    `_update_after_schedule` sets it anew for every scheduled request, so
    such a request's flag never decides (the spec's reads: cadence.py,
    drafts.py `padded_admission`, kv_loads.py, all of running requests).
    Compared whole, a loop whose first round preempted a request
    that had sampled and whose next rounds preempt it mid-prefill closed a
    round late (seed 422 index 122 of the hunt over seeds 417-423, 0.33.0
    sync: the second preemption's state came back but for r0's flag, and a
    session's input then broke the loop; the ground truth named it)."""
    if earlier == now:
        return True
    if earlier.running != now.running or len(earlier.requests) != len(now.requests):
        return False
    if any(getattr(earlier, f.name) != getattr(now, f.name) for f in fields(now) if f.name != "requests"):
        return False
    running = set(now.running)
    return all(a == b or (r not in running and not now.entries_of(r, fate=None)
                          and replace(a, is_prefill_chunk=b.is_prefill_chunk) == b)
               for r, (a, b) in enumerate(zip(earlier.requests, now.requests)))


def _sketch(state: State) -> tuple:
    """What a recurring state must repeat, cheap to read: the queues, the
    batches in flight and the live requests' counters (the whole state is
    compared only where this recurs)."""
    live = state.waiting + state.running
    return (state.waiting, state.running, tuple(len(batch) for batch in state.in_flight),
            tuple((state.requests[r].num_computed, state.requests[r].num_output) for r in live))
