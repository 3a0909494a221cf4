"""The transition system of a `Model` in Z3: frames, the schedule function of
each frame, the transition relation between two frames, and the decoding of a
step back into a labelled spec action.

    T(s, s') = OR_a ( act = a  AND  guard_a(s, choices)  AND  s' = effect_a(s, choices) )

for a in arrive, schedule, complete_oldest, abort; the choices are fresh per
step. It is built as one leafwise selection `s'.x = ite(act, effect_a.x ...)`
(the same relation, with the unchanged fields shared), and every variable of
s' is a function of s and the choices, so s' is determined by (s, choices).
The ghost flag `was_preempted` ages with the step:
`was_preempted' = was_preempted OR status' = PREEMPTED`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import z3

from flightcheck.spec import Abort, Action, Arrive, CompleteOldest, Sample, Schedule, State

from .models import Model
from .z3_actions import (ABORT, ARRIVE, COMPLETE, NO_STOP, SCHEDULE, Choices, Completion, abort,
                         abort_guard, arrive, arrive_guard, choices, complete_oldest)
from .z3_schedule import SchedResult, schedule
from .z3_state import PREEMPTED, Layout, SState, decode, equal, frame, initial, leaves
from .z3_terms import Builder, conj, disj, eq, le, lt, pick


@dataclass
class Step:
    """One transition t -> t+1 of an unrolling."""

    before: SState
    after: SState
    choices: Choices
    sched: SchedResult           # schedule's function of `before`
    completion: Completion
    constraints: list[z3.BoolRef] = field(default_factory=list)


class System:
    """Frames and steps of one model; the schedule function is built once per frame."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.lay = Layout.of(model)
        self._frames: dict[str, SState] = {}
        self._sched: dict[str, tuple[SchedResult, list[z3.BoolRef]]] = {}

    def frame(self, tag: Any) -> SState:
        tag = str(tag)
        if tag not in self._frames:
            self._frames[tag] = frame(self.lay, tag)
        return self._frames[tag]

    def sched(self, tag: Any) -> tuple[SchedResult, list[z3.BoolRef]]:
        """schedule(frame(tag)) and the definitions of its auxiliary variables."""
        tag = str(tag)
        if tag not in self._sched:
            bld = Builder(f"sched@{tag}")
            self._sched[tag] = (schedule(self.lay, bld, self.frame(tag)), bld.defs)
        return self._sched[tag]

    def init(self, tag: Any = 0) -> list[z3.BoolRef]:
        """Init(s): nothing arrived, the whole pool free, no ghost flag."""
        return equal(self.frame(tag), initial(self.lay))

    def step(self, t0: Any, t1: Any, with_sched_defs: bool = True) -> Step:
        """T(s@t0, s@t1) with the choices of step t0 (schedule's definitions included if asked)."""
        lay = self.lay
        s, s1 = self.frame(t0), self.frame(t1)
        sched, sdefs = self.sched(t0)
        bld = Builder(f"step@{t0}")
        ch = choices(lay, str(t0))
        comp = complete_oldest(lay, bld, s, ch)
        aborted = bld.snap(abort(lay, s, ch), "abort")
        guards = [arrive_guard(lay, s, ch), sched.result, lt(0, s.num_batches), abort_guard(lay, s, ch)]
        effects = [arrive(lay, s, ch), sched.state, comp.state, aborted]
        cs = list(sdefs) if with_sched_defs else []
        cs += bld.defs
        cs += [le(0, ch.act), le(ch.act, 3), pick(guards, ch.act), comp.choice_ok,
               z3.Implies(disj(eq(ch.act, SCHEDULE), eq(ch.act, COMPLETE)), eq(ch.req, 0))]
        effect_leaves = [list(leaves(e)) for e in effects]
        for i, (name, v1) in enumerate(leaves(s1)):
            if name.startswith("was_preempted"):
                continue
            cs.append(v1 == pick([el[i][1] for el in effect_leaves], ch.act))
        for r in range(lay.N):
            cs.append(s1.was_preempted[r] == z3.Or(s.was_preempted[r], s1.reqs[r].status == PREEMPTED))
        return Step(s, s1, ch, sched, comp, cs)

    # --- decoding ---------------------------------------------------------------

    def decode(self, m: z3.ModelRef, tag: Any) -> State:
        return decode(self.lay, m, self.frame(tag))

    def decode_action(self, m: z3.ModelRef, st: Step) -> Action:
        """The labelled spec action a model chose for a step."""
        def iv(x) -> int:
            return m.eval(x, model_completion=True).as_long()

        act, r = iv(st.choices.act), iv(st.choices.req)
        if act == ARRIVE:
            return Arrive(r, self.model.prompts[r])
        if act == SCHEDULE:
            return Schedule()
        if act == ABORT:
            return Abort(r)
        samples = []
        for j, here in enumerate(st.completion.samples_here):
            if z3.is_true(m.eval(here, model_completion=True)):
                stop = iv(st.choices.stop_at[j])
                samples.append(Sample(iv(st.choices.accepted[j]), None if stop == NO_STOP else stop,
                                      iv(st.choices.next_drafts[j])))
        return CompleteOldest(tuple(samples))


def action_is(st: Step, kind: type) -> Any:
    """The step's action is of this spec class."""
    code = {Arrive: ARRIVE, Schedule: SCHEDULE, CompleteOldest: COMPLETE, Abort: ABORT}[kind]
    return eq(st.choices.act, code)


__all__ = ["System", "Step", "action_is", "conj"]
