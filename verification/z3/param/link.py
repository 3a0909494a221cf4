"""The soundness link between the parameterised model and the concrete spec.

`abstract_state` maps a concrete `State` with N requests to an
interpretation of the parameterised vocabulary with |Req| = N (requests are
their slot numbers, the ghosts get their intended values: `tokens` = Σ n,
`first` = the batch's first entry, `num_running` = how many are RUNNING).
`check_link` then walks every reachable state of a model (breadth-first)
and checks:

* map(initial) is the parameterised Init;
* Inv(map(s)) holds for every reachable s;
* every concrete edge s → s' is a sequence of micro-steps from map(s) to
  exactly map(s'): the sequence is built from the action (a schedule is its
  preemptions, then its entries in order, then the launch; a completion is
  the oldest batch's live and orphaned entries in order, then the pop), each
  micro-step's guard must hold, Inv must hold after each (so the
  intermediate states are covered too), and the last state must equal
  map(s'). The parameters the sequence needs (tokens appended, how it ended,
  drafts proposed) are read off s'; any legal choice is a witness.

It evaluates the very definitions the proof hands to Z3, in their `Concrete`
interpretation. `edge_exists_in_z3` asks Z3 the same question in the
`Symbolic` interpretation over an enumerated Req of size N, with the
numeric parameters free: sat means some choice works; unsat (for a mutant's
edge) means no choice of parameters lets that sequence of micro-steps make
the step.

Finally `restatement_report` checks the other half of the bridge: the
parameterised statement of each property, on map(s), implies the spec's own
predicate on s (met on mutants' states, where the spec's predicates fail).
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Iterator

import z3
from flightcheck.spec import (
    INVARIANTS,
    Abort,
    Action,
    Arrive,
    CompleteOldest,
    Config,
    Fate,
    Schedule,
    State,
    Status,
    schedule,
)
from flightcheck.verification.explicit import search as explicit
from flightcheck.verification.models import Model
from flightcheck.verification.mutants import applied
from flightcheck.verification.z3.param.invariant import (
    broken_conjuncts,
    invariant,
    property_holds,
)
from flightcheck.verification.z3.param.model import (
    CONTINUE,
    LENGTH,
    STOPPED,
    Concrete,
    ParamConfig,
    ParamState,
    Slot,
    Symbolic,
    finite_req_sort,
    initial,
)
from flightcheck.verification.z3.param.steps import STEPS_BY_NAME

Call = tuple[str, tuple]          # (micro-step name, its arguments: a request number first, if any)


def abstract_config(cfg: Config, nobody: Any = 0) -> ParamConfig:
    return ParamConfig(cfg.num_stages, cfg.max_num_batched_tokens, cfg.max_num_seqs, cfg.max_model_len,
                       cfg.num_spec_tokens, cfg.long_prefill_token_threshold, nobody,
                       drafts_kept_through_preemption=cfg.rules.held_drafts_left_uncached)


class OutsideParamModel(ValueError):
    """A concrete state outside the vocabulary (a batch holding a request twice)."""


def abstract_state(s: State, cfg: Config) -> ParamState:
    """map(s): the parameterised interpretation of a concrete state."""
    num = len(s.requests)
    slots = []
    for i in range(cfg.num_stages):
        batch = s.in_flight[i] if i < len(s.in_flight) else ()
        if len({e.req for e in batch}) != len(batch):
            raise OutsideParamModel(f"batch {i} holds a request twice")
        fate, start, n, drafts, samples = (["absent"] * num, [0] * num, [0] * num, [0] * num, [False] * num)
        for e in batch:
            fate[e.req], start[e.req], n[e.req] = e.fate.value, e.start, e.n
            drafts[e.req], samples[e.req] = e.drafts, e.samples
        slots.append(Slot(tuple(fate), tuple(start), tuple(n), tuple(drafts), tuple(samples),
                          sum(e.n for e in batch), batch[0].req if batch else 0))
    reqs = s.requests
    return ParamState(tuple(q.status.name for q in reqs), tuple(q.prompt_len for q in reqs),
                  tuple(q.max_tokens for q in reqs), tuple(q.num_output for q in reqs),
                  tuple(q.num_computed for q in reqs), tuple(q.num_drafts for q in reqs),
                  tuple(slots), len(s.in_flight), sum(q.status is Status.RUNNING for q in reqs))


def micro_calls(s: State, cfg: Config, action: Action, after: State) -> list[Call]:
    """The micro-steps that make the concrete step s -[action]-> after."""
    if isinstance(action, Arrive):
        return [("arrive", (action.req, action.prompt.prompt_len, action.prompt.max_tokens))]
    if isinstance(action, Abort):
        return [("abort", (action.req,))]
    if isinstance(action, Schedule):
        formed = schedule(s, cfg)
        calls: list[Call] = [("preempt", (v,)) for v in formed.preempted]
        for e in formed.entries:
            was_running = s.requests[e.req].status is Status.RUNNING and e.req not in formed.preempted
            calls.append(("schedule_running", (e.req, e.n)) if was_running
                         else ("admit", (e.req, e.cached, e.n)))
        return calls + ([("launch", ())] if formed.entries else [])
    if isinstance(action, CompleteOldest):
        samples = iter(action.samples)
        calls = []
        for e in s.in_flight[0]:
            if e.fate is Fate.SUPERSEDED:
                continue
            if not e.samples:
                calls.append(("complete_entry", (e.req, 0, 0, CONTINUE, 0)))
                continue
            sample, now = next(samples), after.requests[e.req]
            outcome = {Status.FINISHED_LENGTH: LENGTH, Status.FINISHED_STOPPED: STOPPED}.get(now.status, CONTINUE)
            appended = now.num_output - s.requests[e.req].num_output
            calls.append(("complete_entry", (e.req, sample.num_accepted, appended, outcome, now.num_drafts)))
        return calls + [("pop", ())]
    raise TypeError(f"not an action: {action!r}")


@dataclass
class LinkReport:
    model: str
    states: int = 0
    edges: int = 0
    micro_steps: int = 0
    fired: Counter = field(default_factory=Counter)   # (micro-step, depth) -> times fired from an Inv-state
    enabled: set = field(default_factory=set)         # (micro-step, depth) enabled at some map(s), unfired
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def witnessed(self) -> set[tuple[str, int]]:
        """Micro-steps (at a depth) whose consecution hypothesis Inv(x) ∧ depth = d ∧ guard
        has a concrete model here: that proof query is not vacuous."""
        return set(self.fired) | self.enabled


def replay(s: State, cfg: Config, action: Action, after: State, report: LinkReport | None = None) -> str | None:
    """None if map(s) reaches map(after) by the action's micro-steps; else why not."""
    ops, param_config = Concrete(len(s.requests)), abstract_config(cfg)
    x = abstract_state(s, cfg)
    for name, args in micro_calls(s, cfg, action, after):
        depth = x.depth
        guard, x = STEPS_BY_NAME[name].update(ops, x, param_config, depth, *args)
        if not guard:
            return f"{name}{args} is disabled"
        if not invariant(ops, x, param_config):
            return f"Inv broken after {name}{args}: {broken_conjuncts(ops, x, param_config)[:4]}"
        if report is not None:
            report.fired[(name, depth)] += 1
            report.micro_steps += 1
    if x != abstract_state(after, cfg):
        return "the micro-steps end elsewhere than map(s')"
    return None


def check_link(model: Model, max_states: int | None = None, stop_at_first: bool = False) -> LinkReport:
    """Every reachable state and edge of `model` (the first `max_states` states, if given)."""
    cfg, report = model.cfg, LinkReport(model.name)
    root = explicit.initial(model)
    ops, param_config = Concrete(model.num_requests), abstract_config(cfg)
    if abstract_state(root, cfg) != initial(ops, param_config):
        report.problems.append("map(initial state) is not Init")
    seen, frontier = {root}, deque([root])
    while frontier and not (stop_at_first and report.problems):
        s = frontier.popleft()
        report.states += 1
        x = abstract_state(s, cfg)
        if not invariant(ops, x, param_config):
            report.problems.append(f"Inv fails on map(s): {broken_conjuncts(ops, x, param_config)[:4]}")
        _note_enabled(ops, x, param_config, report)
        for action, nxt in explicit.successors(model, s):
            report.edges += 1
            with applied(model.mutant):     # replay re-runs the spec's schedule
                why = replay(s, cfg, action, nxt, report)
            if why is not None:
                report.problems.append(f"{action}: {why}")
            if nxt not in seen and (max_states is None or len(seen) < max_states):
                seen.add(nxt)
                frontier.append(nxt)
    return report


def _note_enabled(ops: Concrete, x: ParamState, param_config: ParamConfig, report: LinkReport) -> None:
    """Single-request micro-steps the spec never takes at some depth (a
    preemption with the pipeline full) still have concrete models of their
    hypothesis: any reachable state where the guard holds."""
    for name in ("abort", "preempt"):
        if any(STEPS_BY_NAME[name].update(ops, x, param_config, x.depth, r)[0] for r in range(ops.num_requests)):
            report.enabled.add((name, x.depth))


def rejected_edges(model: Model, max_states: int = 20_000) -> Iterator[tuple[State, Action, State, str]]:
    """Concrete edges (of a mutant model, say) that the parameterised relation does not allow."""
    for s in _reachable(model, max_states):
        for action, nxt in explicit.successors(model, s):
            try:
                with applied(model.mutant):     # replay re-runs the spec's schedule
                    why = replay(s, model.cfg, action, nxt)
            except OutsideParamModel as err:
                why = str(err)
            if why is not None:
                yield s, action, nxt, why


def _reachable(model: Model, max_states: int) -> Iterator[State]:
    root = explicit.initial(model)
    seen, frontier = {root}, deque([root])
    while frontier:
        s = frontier.popleft()
        yield s
        for _, nxt in explicit.successors(model, s):
            if nxt not in seen and len(seen) < max_states:
                seen.add(nxt)
                frontier.append(nxt)


def lift(ops: Symbolic, x: ParamState) -> ParamState:
    """A concrete interpretation as Z3 terms over the finite Req sort."""
    def array_of(values: tuple, convert: Any) -> Any:
        a = z3.K(ops.req_sort, convert(values[0]))
        for i, v in enumerate(values):
            a = z3.Store(a, ops.domain[i], convert(v))
        return a

    ints, bools = z3.IntVal, z3.BoolVal
    slots = tuple(Slot(array_of(s.fate, ops.fate), array_of(s.start, ints), array_of(s.n, ints),
                       array_of(s.drafts, ints), array_of(s.samples, bools), ints(s.tokens), ops.domain[s.first])
                  for s in x.slots)
    return ParamState(array_of(x.status, ops.status), array_of(x.prompt_len, ints), array_of(x.max_tokens, ints),
                  array_of(x.num_output, ints), array_of(x.num_computed, ints), array_of(x.num_drafts, ints),
                  slots, ints(x.depth), ints(x.num_running))


def _same(ops: Symbolic, a: ParamState, b: ParamState) -> list[Any]:
    """a = b on the finite domain, field by field."""
    eqs = [a.depth == b.depth, a.num_running == b.num_running]
    pairs = [(getattr(a, f), getattr(b, f)) for f in
             ("status", "prompt_len", "max_tokens", "num_output", "num_computed", "num_drafts")]
    for sa, sb in zip(a.slots, b.slots):
        eqs += [sa.tokens == sb.tokens, sa.first == sb.first]
        pairs += [(sa.fate, sb.fate), (sa.start, sb.start), (sa.n, sb.n), (sa.drafts, sb.drafts),
                  (sa.samples, sb.samples)]
    return eqs + [p[c] == q[c] for p, q in pairs for c in ops.domain]


def edge_exists_in_z3(s: State, cfg: Config, action: Action, after: State) -> z3.CheckSatResult:
    """∃ numeric parameters p₁..p_m: guard₁ ∧ … ∧ guard_m ∧ post_m ∘ … ∘ post₁(map(s)) = map(after),
    for the action's sequence of micro-steps (which requests, which kinds),
    in Z3 over the enumerated Req sort of size N."""
    sort, domain = finite_req_sort(len(s.requests))
    ops = Symbolic(sort, domain)
    param_config = abstract_config(cfg, nobody=domain[0])
    x = lift(ops, abstract_state(s, cfg))
    solver, depth = z3.Solver(), len(s.in_flight)
    for j, (name, args) in enumerate(micro_calls(s, cfg, action, after)):
        kind = STEPS_BY_NAME[name]
        free = [domain[args[0]] if p == "r" else z3.Int(f"{p}#{j}") for p, _ in zip(kind.params, args)]
        guard, x = kind.update(ops, x, param_config, depth, *free)
        solver.add(guard)
        depth += {"launch": 1, "pop": -1}.get(name, 0)
    solver.add(*_same(ops, x, lift(ops, abstract_state(after, cfg))))
    return solver.check()


def invariant_in_z3(s: State, cfg: Config) -> bool:
    """Inv(map(s)) decided by Z3 over the enumerated Req sort (the Symbolic interpretation)."""
    sort, domain = finite_req_sort(len(s.requests))
    ops = Symbolic(sort, domain)
    solver = z3.Solver()
    solver.add(z3.Not(invariant(ops, lift(ops, abstract_state(s, cfg)), abstract_config(cfg, domain[0]))))
    return solver.check() == z3.unsat


# The spec's properties whose parameterised restatement (z3.param.invariant) is
# meant to be at least as strong: Inv's S<n> conjuncts on map(s) imply the
# spec's predicate on s. (S10 and S11 are restated only in part, so they are
# not claimed equivalent.)
RESTATED = ("S1", "S2", "S3", "S5", "S6", "S7", "S8", "L1")


def restatement_report(model: Model, max_states: int = 5_000) -> tuple[Counter, list[str]]:
    """On the reachable states of `model` (a mutant's, to meet violations):
    how often each spec property fails, and every state where the spec's
    predicate fails while the parameterised restatement holds (must be none)."""
    spec_pred = {p: next(inv for inv in INVARIANTS if inv.name.startswith(p + "_")) for p in RESTATED}
    cfg, param_config = model.cfg, abstract_config(model.cfg)
    ops = Concrete(model.num_requests)
    violations, weaker = Counter(), []
    for s in _reachable(model, max_states):
        try:
            x = abstract_state(s, cfg)
        except OutsideParamModel:
            continue
        for p in RESTATED:
            with applied(model.mutant):
                if spec_pred[p].holds(s, cfg):
                    continue
            violations[p] += 1
            if property_holds(ops, x, param_config, p):
                weaker.append(f"{p} holds on map(s) but not on s: {s}")
    return violations, weaker
