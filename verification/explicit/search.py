"""Explicit-state exhaustive search over a finite `Model`, in the manner of
TLC and stateright: breadth-first from the initial state, every environment
choice expanded, every invariant checked on every state and every transition
property on every edge. Breadth-first order makes each counterexample a
shortest one.

Liveness needs the whole graph: once the search is complete it checks that
from every reachable state the scheduler alone (schedule and complete steps,
no arrivals, no aborts) can bring every request to a finished state with
nothing in flight, and that the scheduler's own steps contain no cycle, so no
run can go on forever without finishing its requests.

A model that names a mutant is searched with the mutant applied
(verification/mutants): every call into the concrete spec runs inside
`applied(model.mutant)`.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator

from flightcheck.spec import (
    Abort,
    Action,
    Arrive,
    ArriveAs,
    CompleteOldest,
    Config,
    Entry,
    FailKvLoad,
    Pause,
    ReceiveKv,
    Reset,
    Sample,
    Schedule,
    SendInput,
    SendKv,
    SetPause,
    Sometimes,
    State,
    describe,
    initial_state,
    invariants_for,
    sampling_entries,
    step,
    transition_properties_for,
)
from flightcheck.spec.sometimes import sometimes_for
from flightcheck.spec.state import name_of
from flightcheck.spec.transitions import CompileGrammar, FailGrammar
from flightcheck.spec.actions import max_next_drafts
from flightcheck.spec.grammar import illegal_drafts_scheduled
from flightcheck.spec.kv_invalid import with_invalid_kv_identity
from flightcheck.spec.kv_unwritten import with_unwritten_kv_identity
from flightcheck.spec.kv_reports import failable_blocks, finished_load_blocks
from flightcheck.verification.models import Model
from flightcheck.verification.mutants import applied


def sample_choices(model: Model, state: State) -> Iterator[tuple[Sample, ...]]:
    """Every environment choice for the oldest batch's sampling entries."""
    cfg = model.cfg
    per_entry: list[list[Sample]] = []
    with applied(model.mutant):
        for e in sampling_entries(state, cfg):
            options = []
            live = e.fate.value == "live"
            for accepted in range(e.drafts + 1):
                stops = [None] + (list(range(accepted + 1)) if model.allow_stop else [])
                for stop_at in stops:
                    drafts = range(max_next_drafts(cfg) + 1) if live and stop_at is None else [0]
                    options.extend(Sample(accepted, stop_at, d, illegal)
                                   for d in drafts for illegal in illegal_draft_choices(cfg, e, accepted))
            per_entry.append(options)
    return itertools.product(*per_entry)


def illegal_draft_choices(cfg: Config, e: Entry, accepted: int) -> list[int | None]:
    """Where the grammar refuses e's drafts (grammar.py: structured output
    only, and only where the profile lets an illegal draft reach a batch):
    none, or any of them; `complete_oldest`'s guard (the verifier accepts no
    draft from the first illegal one on) disables those below `accepted`."""
    if not illegal_drafts_scheduled(cfg) or e.mask is None:
        return [None]
    return [None, *range(e.drafts)]


def grammar_events(model: Model, state: State) -> Iterator[Action]:
    """The grammar backend's events: a compiling grammar compiles, or fails."""
    for r, q in enumerate(state.requests):
        if q.grammar.value == "compiling" and q.status.is_active:
            yield CompileGrammar(r)
            yield FailGrammar(r)


def actions(model: Model, state: State) -> Iterator[Action]:
    """Every labelled action to try from `state` (disabled ones yield None in `step`)."""
    for r, q in enumerate(state.requests):
        if q.status.value == "NEW":
            yield Arrive(r, model.prompts[r])
            if model.cfg.allow_name_reuse:
                # under each finished request's name (arrive_as refuses a name still held)
                for name in sorted({name_of(state, x) for x, other in enumerate(state.requests)
                                    if other.status.is_finished}):
                    yield ArriveAs(r, model.prompts[r], name)
    yield Schedule()
    if state.in_flight:
        for samples in sample_choices(model, state):
            yield CompleteOldest(samples)
    if model.allow_abort:
        for r, q in enumerate(state.requests):
            if q.status.is_active:
                yield Abort(r)
    if model.cfg.kv_connector is not None:
        yield from kv_reports(model, state)
    if model.cfg.structured_output:
        yield from grammar_events(model, state)
    if model.cfg.streaming_sessions:
        yield from (SendInput(r) for r, q in enumerate(state.requests) if q.inputs_to_send and q.status.is_active)
    if model.cfg.reset_and_pause:
        # the connector's cache reset too (`reset_connector`) only beside a connector: without one it is a no-op
        connector = (False, True) if model.cfg.kv_connector is not None else (False,)
        yield from (Reset(running, reset_connector) for running in (True, False) for reset_connector in connector)
        yield from (SetPause(pause) for pause in Pause)


# The connector's reports the scheduler waits for: a fair connector makes
# each in the end, so liveness counts them as the system's steps; so is a
# streaming session's next input (its client sends each, the end included),
# and a grammar backend's event (a grammar compiles or fails in the end).
SYSTEM_STEPS = (Schedule, CompleteOldest, ReceiveKv, SendKv, SendInput, CompileGrammar, FailGrammar)


def is_system_step(action: Action) -> bool:
    """The system's steps, and a resume: liveness asks that every request
    can finish once the environment lifts a pause (reset_pause.py), not
    while it holds it."""
    return isinstance(action, SYSTEM_STEPS) or (isinstance(action, SetPause) and action.pause is Pause.UNPAUSED)


def kv_reports(model: Model, state: State) -> Iterator[Action]:
    """The KV connector's reports from `state`: a load's `finished_recving`,
    a held send's `finished_sending`, and (where the model lets loads fail)
    every failure a load may report (kv_reports.failable_blocks)."""
    for r, q in enumerate(state.requests):
        if q.load.in_transfer:
            yield ReceiveKv(r)
        elif q.held:
            yield SendKv(r)
        if model.kv_failures:
            blocks = set(failable_blocks(state, model.cfg, r)) | ({0} if q.load.value == "in_flight" else set())
            if model.cfg.check_invalid_kv:      # KV7's models: an aborted loader's failure too
                blocks |= set(finished_load_blocks(state, model.cfg, r))
            for block in sorted(blocks):
                yield FailKvLoad(r, block)


def successors(model: Model, state: State) -> Iterator[tuple[Action, State]]:
    """Every enabled action from `state` with the state it leads to (computed
    at once, so that the mutant is applied while the spec runs)."""
    with applied(model.mutant):
        found = [(action, nxt) for action in actions(model, state)
                 if (nxt := step(state, model.cfg, action)) is not None]
    return iter(found)


def initial(model: Model) -> State:
    """The model's initial state; where KV7 (KV8) is checked, with
    `invalid_kv` (`unwritten_kv`) in its identity and its successors'
    (spec/kv_invalid.py, spec/kv_unwritten.py)."""
    root = initial_state(model.num_requests, model.cfg.num_blocks)
    if model.cfg.check_unwritten_kv:
        return with_unwritten_kv_identity(root)
    return with_invalid_kv_identity(root) if model.cfg.check_invalid_kv else root


@dataclass
class Violation:
    property: str
    path: list[tuple[Action, State]]      # from the initial state, last step broke it
    message: str


@dataclass
class SearchResult:
    model: Model
    num_states: int = 0
    num_edges: int = 0
    max_depth: int = 0
    complete: bool = True
    seconds: float = 0.0
    violations: list[Violation] = field(default_factory=list)
    reached: dict[str, int] = field(default_factory=dict)       # sometimes target -> depth
    liveness: dict[str, bool] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations


class _Graph:
    """Parents for shortest paths; every edge for two-stage targets; system edges for liveness."""

    def __init__(self, root: State) -> None:
        self.parent: dict[State, tuple[State, Action] | None] = {root: None}
        self.depth: dict[State, int] = {root: 0}
        self.edges: dict[State, list[State]] = {}
        self.system_edges: dict[State, list[State]] = {}
        self.labelled_system_edges: dict[State, list[tuple[Action, State]]] = {}

    def path_to(self, s: State) -> list[tuple[Action, State]]:
        path = []
        while (p := self.parent[s]) is not None:
            path.append((p[1], s))
            s = p[0]
        return path[::-1]


def search(model: Model, *, max_states: int = 2_000_000, stop_at_first: bool = False,
           check_liveness: bool = True, progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """Breadth-first exhaustive search; stops early only at `max_states` (then
    `complete` is False) or, with `stop_at_first`, at the first violation."""
    with applied(model.mutant):     # the invariants L2 and L3 run the spec's actions too
        return _search(model, max_states, stop_at_first, check_liveness, progress)


def _search(model: Model, max_states: int, stop_at_first: bool, check_liveness: bool,
            progress: Callable[[int, int], None] | None) -> SearchResult:
    t0 = time.perf_counter()
    run = _Search(model)
    graph, result = run.graph, run.result
    run.check_state(run.root)
    run.check_sometimes(run.root)
    frontier = deque([run.root])
    while frontier:
        if stop_at_first and result.violations:
            break
        s = frontier.popleft()
        frontier.extend(run.expand(s, max_states))
        if progress and len(graph.parent) % 20000 == 0:
            progress(len(graph.parent), graph.depth[s])
    result.num_states = len(graph.parent)
    result.max_depth = max(graph.depth.values())
    run.check_two_stage_targets()
    if check_liveness and result.complete and not (stop_at_first and result.violations):
        _check_liveness(graph, result)
    result.seconds = time.perf_counter() - t0
    return result


class _Search:
    """One breadth-first search's state: the graph so far, the result being
    filled, the properties already broken (each reported once, on a
    shortest path) and the "sometimes" targets not yet reached."""

    def __init__(self, model: Model) -> None:
        self.model, self.cfg = model, model.cfg
        self.root = initial(model)
        self.graph = _Graph(self.root)
        self.result = SearchResult(model)
        self.broken: set[str] = set()
        self.pending = {sm.name: sm for sm in sometimes_for(self.cfg)
                        if sm.is_applicable(self.cfg, model.shares_prefix) and sm.name not in model.skip_targets}
        self.invariants = invariants_for(self.cfg)
        self.transition_properties = transition_properties_for(self.cfg)

    def note_violation(self, name: str, path: Callable[[], list[tuple[Action, State]]], message: str) -> None:
        """The first violation of `name` (its path built only then)."""
        if name not in self.broken:
            self.broken.add(name)
            self.result.violations.append(Violation(name, path(), message))

    def check_state(self, s: State) -> None:
        for inv in self.invariants:
            if not inv.holds(s, self.cfg):
                self.note_violation(inv.name, lambda: self.graph.path_to(s), inv.statement)

    def check_sometimes(self, s: State) -> None:
        """One-stage targets; the BFS depth of s is the length of a shortest path to them."""
        for name, sm in list(self.pending.items()):
            if sm.after is None and sm.on_step is None and any(sm.target(s, self.cfg, r)
                                                               for r in range(self.model.num_requests)):
                self.result.reached[name] = self.graph.depth[s]
                del self.pending[name]

    def expand(self, s: State, max_states: int) -> list[State]:
        """Every step from s recorded and checked; the states first seen (to explore)."""
        graph, result = self.graph, self.result
        edges = graph.edges.setdefault(s, [])
        sys_edges = graph.system_edges.setdefault(s, [])
        labelled = graph.labelled_system_edges.setdefault(s, [])
        new: list[State] = []
        for action, nxt in successors(self.model, s):
            result.num_edges += 1
            edges.append(nxt)
            if is_system_step(action):
                sys_edges.append(nxt)
                labelled.append((action, nxt))
            fresh = nxt not in graph.parent
            if fresh:
                if len(graph.parent) >= max_states:
                    result.complete = False
                    continue
                graph.parent[nxt] = (s, action)
                graph.depth[nxt] = graph.depth[s] + 1
            self.check_step(s, action, nxt)
            if fresh:
                self.check_state(nxt)
                self.check_sometimes(nxt)
                new.append(nxt)
        return new

    def check_step(self, s: State, action: Action, nxt: State) -> None:
        """The targets reached on a step, and the transition properties (a
        violation is reported on the path through this very edge)."""
        for name, sm in list(self.pending.items()):
            if sm.on_step is not None and any(sm.on_step(s, nxt, action, self.cfg, r)
                                              for r in range(self.model.num_requests)):
                self.result.reached[name] = self.graph.depth[s] + 1      # breadth-first: a shortest such step
                del self.pending[name]
        for prop in self.transition_properties:
            if not prop.holds(s, nxt, action, self.cfg):
                self.note_violation(prop.name, lambda: self.graph.path_to(s) + [(action, nxt)], prop.statement)

    def check_two_stage_targets(self) -> None:
        """Two-stage targets over the whole graph; any target still pending is reported."""
        for name, sm in list(self.pending.items()):
            if sm.after is not None and (depth := _two_stage_depth(self.graph, self.root, self.model, sm)) is not None:
                self.result.reached[name] = depth
                del self.pending[name]
        for name in self.pending:
            self.result.violations.append(Violation(name, [], "sometimes target never reached"))


def _two_stage_depth(graph: _Graph, root: State, model: Model, sm: Sometimes) -> int | None:
    """The length of a shortest path on which, for some request r, `sm.after`
    holds and then (there or later) `sm.target`: breadth-first over pairs
    (state, whether the path has passed `after` for r). The BFS depth of the
    target state alone can be shorter, when a shorter path reaches that state
    without passing `after`."""
    cfg, best = model.cfg, None
    for r in range(model.num_requests):
        start = (root, sm.after(root, cfg, r))
        seen, frontier, depth = {start}, [start], 0
        while frontier and (best is None or depth < best):
            if any(passed and sm.target(s, cfg, r) for s, passed in frontier):
                best = depth
                break
            nxt = []
            for s, passed in frontier:
                for t in graph.edges.get(s, ()):
                    pair = (t, passed or sm.after(t, cfg, r))
                    if pair not in seen:
                        seen.add(pair)
                        nxt.append(pair)
            frontier, depth = nxt, depth + 1
    return best


def _is_quiescent(s: State) -> bool:
    """Every request finished, nothing in flight (no batch, and with a KV
    connector no load or send to be reported)."""
    return not s.in_flight and not any(q.status.is_active or q.held or q.load.in_transfer for q in s.requests)


def _path_to_dead_end(graph: _Graph, start: State) -> list[tuple[Action, State]]:
    """A shortest run of scheduler steps from `start` to a state where the
    scheduler can do nothing more (or back to a state already on the run)."""
    came: dict[State, tuple[State, Action] | None] = {start: None}
    frontier = deque([start])
    while frontier:
        s = frontier.popleft()
        outs = [(a, t) for a, t in graph.labelled_system_edges.get(s, [])]
        if not outs:
            break
        for a, t in outs:
            if t not in came:
                came[t] = (s, a)
                frontier.append(t)
    else:
        return []
    path = []
    while (p := came[s]) is not None:
        path.append((p[1], s))
        s = p[0]
    return path[::-1]


def _check_liveness(graph: _Graph, result: SearchResult) -> None:
    """AG EF quiescent over scheduler steps, and no cycle of scheduler steps."""
    reverse: dict[State, list[State]] = {}
    for s, outs in graph.system_edges.items():
        for t in outs:
            reverse.setdefault(t, []).append(s)
    good = {s for s in graph.parent if _is_quiescent(s)}
    frontier = deque(good)
    while frontier:
        t = frontier.popleft()
        for s in reverse.get(t, ()):
            if s not in good:
                good.add(s)
                frontier.append(s)
    stuck = [s for s in graph.parent if s not in good]
    result.liveness["L1_L3_every_request_can_finish"] = not stuck
    if stuck:
        worst = min(stuck, key=lambda s: graph.depth[s])
        path = graph.path_to(worst) + _path_to_dead_end(graph, worst)
        result.violations.append(Violation(
            "L1_L3_every_request_can_finish", path,
            f"after step {graph.depth[worst]} no run of the scheduler finishes every request; "
            "the trace goes on to where it gets stuck"))
    # Kahn's algorithm on the scheduler-step subgraph: a leftover node lies on a cycle.
    cfg = result.model.cfg
    fair = (_fair_system_edges(graph) if cfg.kv_connector is not None or cfg.streaming_sessions
            or cfg.structured_output else graph.system_edges)
    indegree = {s: 0 for s in graph.parent}
    for outs in fair.values():
        for t in outs:
            indegree[t] += 1
    queue = deque(s for s, d in indegree.items() if d == 0)
    seen = 0
    while queue:
        s = queue.popleft()
        seen += 1
        for t in fair.get(s, ()):
            indegree[t] -= 1
            if indegree[t] == 0:
                queue.append(t)
    acyclic = seen == len(indegree)
    result.liveness["L4_every_run_terminates"] = acyclic
    if not acyclic:
        left = {s for s, d in indegree.items() if d > 0}
        # the shallowest state on a cycle (ties broken by rendering, so the
        # report is the same from run to run), and its shortest loop: a lasso
        # whose stem is a shortest path
        for entry in sorted(left, key=lambda s: (graph.depth[s], describe(s))):
            loop = _loop_through(graph, left, entry)
            if loop:
                break
        result.violations.append(Violation(
            "L4_every_run_terminates", graph.path_to(entry) + loop,
            f"a lasso: after step {graph.depth[entry]} the scheduler's last {len(loop)} steps "
            "return to the state they started from, and can repeat forever"))


def _transfer_pending(s: State) -> bool:
    """A KV connector's load or send is still to be reported, or a grammar
    is still compiling (its backend's event, like a report, ends the wait)."""
    return any(q.held or q.load.in_transfer or q.grammar.value == "compiling" for q in s.requests)


def _input_pending(s: State) -> bool:
    """A streaming session waits for an input its client has still to send."""
    return any(q.status.awaits_client and q.inputs_to_send for q in s.requests)


def _fair_system_edges(graph: _Graph) -> dict[State, list[State]]:
    """The system edges a fair connector (and a fair session client) leaves:
    while a load or send is pending its report stays enabled (and no
    schedule or completion ends it), so a run that only schedules and
    completes around it -- the engine spinning while it waits for the
    transfer -- is unfair and not a lasso; so is one spinning while a
    session waits for its next input. Without either, every system edge."""
    return {s: [t for a, t in graph.labelled_system_edges.get(s, [])
                if isinstance(a, (ReceiveKv, SendKv, SendInput, CompileGrammar, FailGrammar))
                or not (_transfer_pending(s) or _input_pending(s))]
            for s in graph.system_edges}


def _loop_through(graph: _Graph, left: set[State], start: State) -> list[tuple[Action, State]]:
    """The shortest run of scheduler steps among `left` (the states Kahn's
    algorithm could not order) from `start` back to itself; [] if none."""
    came: dict[State, tuple[State, Action]] = {}
    frontier = deque([start])
    while frontier:
        u = frontier.popleft()
        for a, t in graph.labelled_system_edges.get(u, []):
            if t == start:
                loop = [(a, t)]
                while u != start:
                    p, pa = came[u]
                    loop.append((pa, u))
                    u = p
                return loop[::-1]
            if t not in came and t in left:
                came[t] = (u, a)
                frontier.append(t)
    return []
