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
from flightcheck.spec import (
    Abort,
    Action,
    Arrive,
    CompleteOldest,
    Sample,
    Schedule,
    SendInput,
    State,
)
from flightcheck.verification.models import Model
from flightcheck.verification.z3.encoding.actions import (
    ABORT,
    ARRIVE,
    COMPLETE,
    NO_STOP,
    SCHEDULE,
    Choices,
    Completion,
    abort,
    abort_guard,
    arrive,
    arrive_guard,
    choices,
    complete_guard,
    complete_oldest,
    finish,
)
from flightcheck.verification.z3.encoding.connector import connector_action, connector_transitions
from flightcheck.verification.z3.encoding.reset_pause import first_code, rp_action, rp_transitions
from flightcheck.verification.z3.encoding.schedule import SchedResult, schedule
from flightcheck.verification.z3.encoding.structured_output import grammar_action, grammar_transitions
from flightcheck.verification.z3.encoding.sessions import send_guard, send_input
from flightcheck.verification.z3.encoding.state import (
    PREEMPTED,
    Layout,
    NotRepresentable,
    SState,
    constant_state,
    decode,
    dump,
    encode,
    equal,
    frame,
    initial,
    leaves,
)
from flightcheck.verification.z3.encoding.terms import (
    Builder,
    arithmetic,
    conj,
    disj,
    eq,
    le,
    pick,
    value_of,
)


@dataclass
class Step:
    """One transition t -> t+1 of an unrolling."""

    before: SState
    after: SState
    choices: Choices
    sched: SchedResult           # schedule's function of `before`
    completion: Completion
    constraints: list[z3.BoolRef] = field(default_factory=list)


@dataclass
class Transitions:
    """The four actions from one frame: guard_a and effect_a as terms."""

    before: SState
    choices: Choices
    sched: SchedResult
    completion: Completion
    guards: list
    effects: list                # SState of terms, per action code
    sched_defs: list[z3.BoolRef]
    defs: list[z3.BoolRef]       # the step's auxiliary definitions
    legal: list[z3.BoolRef]      # the choices are in range (and canonical when unused)


class System:
    """Frames and steps of one model; the schedule function is built once per frame."""

    def __init__(self, model: Model, bitvectors: bool = True) -> None:
        self.model = model
        self.layout = Layout.of(model, bitvectors)
        self._frames: dict[str, SState] = {}
        self._sched: dict[str, tuple[SchedResult, list[z3.BoolRef]]] = {}
        self._trans: dict[str, Transitions] = {}

    def frame(self, tag: Any) -> SState:
        tag = str(tag)
        if tag not in self._frames:
            with arithmetic(self.layout.width):
                self._frames[tag] = frame(self.layout, tag)
        return self._frames[tag]

    def sched(self, tag: Any) -> tuple[SchedResult, list[z3.BoolRef]]:
        """schedule(frame(tag)) and the definitions of its auxiliary variables."""
        tag = str(tag)
        if tag not in self._sched:
            builder = Builder(f"sched@{tag}")
            f = self.frame(tag)
            with arithmetic(self.layout.width):
                self._sched[tag] = (schedule(self.layout, builder, f), builder.defs)
        return self._sched[tag]

    def init(self, tag: Any = 0) -> list[z3.BoolRef]:
        """Init(s): nothing arrived, the whole pool free, no ghost flag."""
        f = self.frame(tag)
        with arithmetic(self.layout.width):
            return equal(f, initial(self.layout))

    def encode(self, state: State, tag: Any, was_preempted: tuple[bool, ...] | None = None) -> list[z3.BoolRef]:
        """A concrete state as equalities on frame `tag`."""
        f = self.frame(tag)
        with arithmetic(self.layout.width):
            return encode(self.layout, state, f, was_preempted)

    def constant(self, state: State) -> SState:
        with arithmetic(self.layout.width):
            return constant_state(self.layout, state)

    def build(self, fn, *args):
        """fn(layout, *args), with terms in this system's arithmetic."""
        with arithmetic(self.layout.width):
            return fn(self.layout, *args)

    def step(self, t0: Any, t1: Any, with_sched_defs: bool = True) -> Step:
        """T(s@t0, s@t1) with the choices of step t0 (schedule's definitions included if asked)."""
        s, s1 = self.frame(t0), self.frame(t1)
        sched, schedule_definitions = self.sched(t0)
        with arithmetic(self.layout.width):
            return self._step(t0, s, s1, sched, schedule_definitions, with_sched_defs)

    def transitions(self, t0: Any) -> "Transitions":
        """Every action's guard and effect from frame t0, as terms over it and
        the step's choices (no next-frame variables)."""
        t0 = str(t0)
        if t0 in self._trans:
            return self._trans[t0]
        s = self.frame(t0)
        sched, schedule_definitions = self.sched(t0)
        with arithmetic(self.layout.width):
            layout = self.layout
            builder = Builder(f"step@{t0}")
            ch = choices(layout, str(t0))
            comp = complete_oldest(layout, builder, s, ch)
            aborted = builder.snap(abort(layout, s, ch), "abort")
            guards = [arrive_guard(layout, s, ch), sched.result, complete_guard(layout, s), abort_guard(layout, s, ch)]
            effects = [arrive(layout, s, ch), sched.state, comp.state, aborted]
            legal = [comp.choice_ok, z3.Implies(disj(eq(ch.act, SCHEDULE), eq(ch.act, COMPLETE)), eq(ch.req, 0))]
            if s.kv:        # the connector's reports (connector.py): actions 4, 5, 6
                kv_guards, kv_effects, kv_legal = connector_transitions(layout, builder, s, ch)
                guards, effects, legal = guards + kv_guards, effects + kv_effects, legal + kv_legal
            if s.sess:      # the client's next input (sessions.py): action 4
                guards.append(send_guard(layout, s, ch.req))
                effects.append(builder.snap(send_input(layout, s, ch.req, finish), "send"))
            if s.rp:        # reset and pause (reset_pause.py): actions 4 to 8 (7 to 13 after a connector's)
                rp_guards, rp_effects, rp_legal = rp_transitions(layout, builder, s, ch)
                guards, effects, legal = guards + rp_guards, effects + rp_effects, legal + rp_legal
            if s.grammar:   # the grammar backend's events (structured_output.py): actions 4, 5
                g_guards, g_effects, g_legal = grammar_transitions(layout, s, ch)
                guards, effects, legal = guards + g_guards, effects + g_effects, legal + g_legal
            legal = [le(0, ch.act), le(ch.act, len(guards) - 1)] + legal
        self._trans[t0] = Transitions(s, ch, sched, comp, guards, effects, list(schedule_definitions), builder.defs, legal)
        return self._trans[t0]

    def schedule_of(self, s: SState, name: str) -> tuple[SchedResult, list[z3.BoolRef]]:
        """schedule() of a symbolic state that is not a frame (an action's effect)."""
        builder = Builder(f"sched@{name}")
        with arithmetic(self.layout.width):
            return schedule(self.layout, builder, s), builder.defs

    def _step(self, t0, s: SState, s1: SState, sched: SchedResult, schedule_definitions, with_sched_defs: bool) -> Step:
        layout = self.layout
        tr = self.transitions(t0)
        ch, comp, guards, effects = tr.choices, tr.completion, tr.guards, tr.effects
        cs = list(schedule_definitions) if with_sched_defs else []
        cs += tr.defs + tr.legal + [pick(guards, ch.act)]
        effect_leaves = [list(leaves(e)) for e in effects]
        for i, (name, v1) in enumerate(leaves(s1)):
            if name.startswith("was_preempted"):
                continue
            cs.append(v1 == pick([el[i][1] for el in effect_leaves], ch.act))
        for r in range(layout.N):
            cs.append(s1.was_preempted[r] == z3.Or(s.was_preempted[r], s1.reqs[r].status == PREEMPTED))
        return Step(s, s1, ch, sched, comp, cs)

    # --- decoding ---------------------------------------------------------------

    def decode(self, m: z3.ModelRef, tag: Any) -> State:
        return decode(self.layout, m, self.frame(tag))

    def decode_or_dump(self, m: z3.ModelRef, tag: Any) -> State | str:
        """The frame as a spec State, or as raw values if it is not one."""
        try:
            return self.decode(m, tag)
        except (NotRepresentable, IndexError, KeyError) as e:
            return f"<not a spec state: {e}> " + dump(m, self.frame(tag))

    def decode_action(self, m: z3.ModelRef, st: Step) -> Action:
        """The labelled spec action a model chose for a step."""
        def iv(x) -> int:
            return value_of(m.eval(x, model_completion=True))

        act, r = iv(st.choices.act), iv(st.choices.req)
        if act == ARRIVE:
            return Arrive(r, self.model.prompts[r])
        if act == SCHEDULE:
            return Schedule()
        if act == ABORT:
            return Abort(r)
        if act == SEND_INPUT and st.before.sess:
            return SendInput(r)
        if st.before.rp and act >= first_code(self.layout):
            return rp_action(act, self.layout)
        if act >= len(ACTION_CODE) and st.before.grammar:
            return grammar_action(act, r)
        if act >= len(ACTION_CODE):
            return connector_action(act, r, iv(st.choices.from_block))
        samples = []
        for j, here in enumerate(st.completion.samples_here):
            if z3.is_true(m.eval(here, model_completion=True)):
                stop = iv(st.choices.stop_at[j])
                samples.append(Sample(iv(st.choices.accepted[j]), None if stop == NO_STOP else stop,
                                      iv(st.choices.next_drafts[j])))
        return CompleteOldest(tuple(samples))


# The action code of `SendInput` in a frame with sessions (which has no connector's reports).
SEND_INPUT = 4

# The encoding's action code of each spec action class (`Choices.act`).
ACTION_CODE: dict[type, int] = {Arrive: ARRIVE, Schedule: SCHEDULE, CompleteOldest: COMPLETE, Abort: ABORT}


def action_is(st: Step, kind: type) -> Any:
    """The step's action is of this spec class."""
    return eq(st.choices.act, ACTION_CODE[kind])


__all__ = ["System", "Step", "ACTION_CODE", "action_is", "conj"]
