"""Bounded model checking of a `Model` with Z3, incremental and shortest-first.

    unrolling(k) = Init(s0) AND T(s0, s1) AND ... AND T(s_{k-1}, s_k)
    bmc(k)       = unrolling(k) AND OR_P not P(s_k)        (state properties)
                                AND OR_Q not Q(s_{k-1}, s_k) (transition properties)
    cover(k)     = unrolling(k) AND OR_S target_S(s_k)       ("sometimes")

One solver holds the unrolling; each depth adds one frame and one step, and
each query is asked under a fresh assumption literal, so a property is first
violated (or a target first reached) at the smallest depth, and every
counterexample is a shortest one. Each trace is decoded into spec actions and
replayed on the concrete spec, which must agree state for state and must
itself find the property broken.

`bmc_split` shares the paths among processes: each runs this BMC on the
paths of one `Cube` (the label of one early step), and the parts' results
merge into one (a property holds to the depth every part reached; a
violation or target is reported at the smallest depth any part found it).
"""

from __future__ import annotations

import multiprocessing
import queue
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Iterable

import z3
from flightcheck.spec import SOMETIMES
from flightcheck.verification.models import Model
from flightcheck.verification.results import kind_of
from flightcheck.verification.z3.bmc.reduction import (
    check_reducible,
    peephole,
    twin_order,
)
from flightcheck.verification.z3.encoding.actions import (
    ABORT,
    ARRIVE,
    COMPLETE,
    SCHEDULE,
)
from flightcheck.verification.z3.encoding.invariants import (
    INVARIANT_FORMULAS,
    SOMETIMES_FORMULAS,
    TRANSITION_FORMULAS,
    well_formed,
)
from flightcheck.verification.z3.encoding.system import Step, System
from flightcheck.verification.z3.encoding.terms import arithmetic, conj, disj, eq, neg
from flightcheck.verification.z3.induction.strengthening import AUXILIARY
from flightcheck.verification.z3.results import (
    EngineResult,
    EngineVerdict,
    ReplayMismatch,
    concrete_check,
    replay,
)


def unrolling(system: System, k: int) -> list[z3.BoolRef]:
    """Init(s0) AND T(s0,s1) AND ... AND T(s_{k-1},s_k) (with schedule's definitions of s_k)."""
    out = system.init(0)
    for t in range(k):
        out += system.step(t, t + 1).constraints
    return out + system.sched(k)[1]


def default_properties() -> list[str]:
    return list(INVARIANT_FORMULAS) + list(TRANSITION_FORMULAS)


def applicable_sometimes(model: Model) -> list[str]:
    return [s.name for s in SOMETIMES if s.is_applicable(model.cfg)]


@dataclass(frozen=True)
class Cube:
    """The paths whose step `at` carries one of `labels` ((action code,
    request) pairs; request 0 for schedule and complete), or, with `negate`,
    none of them. The set is prefix-closed, so a part's lemmas on the prefix
    stay sound; paths of at most `at` steps belong to every part."""

    at: int
    labels: frozenset[tuple[int, int]]
    negate: bool = False

    def __str__(self) -> str:
        names = {ARRIVE: "arrive r{}", SCHEDULE: "schedule", COMPLETE: "complete", ABORT: "abort r{}"}
        labels = ", ".join(names[a].format(r) for a, r in sorted(self.labels))
        return f"step {self.at + 1} is {'none' if self.negate else 'one'} of {{{labels}}}"

    def formula(self, st: Step) -> z3.BoolRef:
        inside = disj(*[conj(eq(st.choices.act, a), eq(st.choices.req, r)) for a, r in sorted(self.labels)])
        return neg(inside) if self.negate else inside


def split(model: Model, parts: int) -> list[Cube | None]:
    """`parts` cubes that together hold every path, on the label of the
    second step (the first is an arrival). For two parts the cut is the one
    measured to balance on shared-k3: a schedule against everything else
    (114 s and 130 s to depth 8, `benchmarks/bmc_depth.py --jobs 2`); more
    parts deal the other labels out in turn, the last taking whatever the
    others do not name."""
    if parts <= 1:
        return [None]
    n = model.num_requests
    rest = [(ARRIVE, n - 1), *[(ARRIVE, r) for r in range(n - 1)], (COMPLETE, 0), *[(ABORT, r) for r in range(n)]]
    if parts > max_parts(model):
        raise ValueError(f"{model.name}: at most {max_parts(model)} parts (one per label of the second step), "
                         f"not {parts}")
    named = [[(SCHEDULE, 0)], *[rest[i::parts - 1] for i in range(parts - 2)]]
    covered = frozenset(x for group in named for x in group)
    return [Cube(1, frozenset(group)) for group in named] + [Cube(1, covered, negate=True)]


def max_parts(model: Model) -> int:
    """One part per label a step can carry: schedule, complete, and an arrival and an abort per request."""
    return 2 + 2 * model.num_requests


class _Unrolling:
    """The incremental solver: frames 0..depth, steps between them.

    Each open property P has a literal `held[P]`; once BMC has shown that P
    holds at every state within d steps, `held[P] -> P(s_t)` is added for
    t <= d. Queries assume the literals of the properties still open, so the
    solver gets every invariant not yet refuted as a lemma on the prefix
    (sound: a path violating an open P earlier would have refuted P at a
    smaller depth), and dropping a refuted P's literal releases it."""

    def __init__(self, model: Model, seed: int = 0, reduce: bool = False, cube: Cube | None = None) -> None:
        if reduce:
            check_reducible(model)
        self.reduce = reduce
        self.cube = cube
        self.system = System(model)
        # Bit-vectors go to Z3's incremental SAT solver (bit-blasted once, then
        # CDCL with assumptions), far faster here than integer arithmetic.
        self.solver = z3.SolverFor("QF_BV")
        self.solver.set("random_seed", seed)
        self.steps: list[Step] = []
        self.depth = 0
        self.held: dict[str, z3.BoolRef] = {}
        self._lits = 0
        self.solver.add(self.system.init(0))
        self.solver.add(self.system.sched(0)[1])

    def extend(self) -> None:
        st = self.system.step(self.depth, self.depth + 1, with_sched_defs=False)
        self.solver.add(st.constraints)
        self.steps.append(st)
        self.depth += 1
        self.solver.add(self.system.sched(self.depth)[1])
        if self.reduce:
            self.solver.add(twin_order(self.system, self.depth))
            if self.depth >= 3:     # pair (d-3, d-2): never the last step (z3.bmc.reduction)
                self.solver.add(peephole(self.system, self.steps[-3], self.steps[-2]))
        if self.cube is not None and self.depth == self.cube.at + 1:
            with arithmetic(self.system.lay.width):
                self.solver.add(self.cube.formula(self.steps[self.cube.at]))

    def holds(self, name: str, formula: z3.BoolRef) -> None:
        """Record that `name` holds at the current depth (as a lemma)."""
        lit = self.held.setdefault(name, z3.Bool(f"held:{name}"))
        self.solver.add(z3.Implies(lit, formula))

    def query(self, goal: z3.BoolRef, timeout_ms: int | None, open_names) -> z3.CheckSatResult:
        """Is `goal` satisfiable at the current depth, with the open properties as lemmas?"""
        self._lits += 1
        lit = z3.Bool(f"query#{self._lits}")
        self.solver.add(z3.Implies(lit, goal))
        if timeout_ms is not None:
            self.solver.set("timeout", max(1, timeout_ms))
        return self.solver.check(lit, *[self.held[n] for n in open_names if n in self.held])

    def counts(self) -> dict[str, int]:
        """The SAT solver's conflicts and propagations so far."""
        st = self.solver.statistics()
        value = {k: st.get_key_value(k) for k in st.keys()}
        return {"conflicts": int(value.get("sat conflicts", 0)),
                "propagations": int(value.get("sat propagations 2ary", 0) + value.get("sat propagations nary", 0))}

    def trace(self, m: z3.ModelRef):
        sysm = self.system
        actions = [sysm.decode_action(m, st) for st in self.steps]
        states = [sysm.decode(m, t) for t in range(self.depth + 1)]
        return actions, states


def bmc(model: Model, max_depth: int, properties: Iterable[str] | None = None,
        sometimes: Iterable[str] | None = None, time_budget: float | None = None,
        stop_at_first: bool = False, seed: int = 0, lemmas: bool = False, reduce: bool = False,
        progress: Callable[[int, float, dict[str, int]], None] | None = None,
        cube: Cube | None = None) -> EngineResult:
    """BMC of `properties` (invariant and transition-property names; default:
    all of them) and cover queries for `sometimes` targets (default: every one
    applicable to the model) up to `max_depth` steps or `time_budget` seconds.

    With `lemmas`, the auxiliary invariants of z3.induction.strengthening and the
    encoding's well-formedness are checked too (rows of kind "auxiliary"):
    like every open property they then serve as lemmas on the prefix, and
    since together they are inductive, each depth's query is about one step.
    With stop_at_first, it returns at the first violation of a spec property
    (mutant hunting). `progress(depth, seconds, solver_counts)` is called
    after each depth, with the SAT solver's conflicts and propagations so far.
    With `reduce`, the unrolling keeps fewer paths (z3.bmc.reduction); with
    `cube`, only the paths of that part (see `bmc_split`)."""
    t0 = time.perf_counter()
    props = list(default_properties() if properties is None else properties)
    spec_props = set(props)
    if lemmas:
        props += ["WF_encoding", *AUXILIARY]
    targets = list(applicable_sometimes(model) if sometimes is None else sometimes)
    u = _Unrolling(model, seed, reduce, cube)
    results: dict[str, EngineVerdict] = {}
    open_props, open_targets = list(props), list(targets)
    completed, timed_out = -1, False

    def remaining_ms() -> int | None:
        if time_budget is None:
            return None
        return int((time_budget - (time.perf_counter() - t0)) * 1000)

    for d in range(max_depth + 1):
        if d > 0:
            u.extend()
        frame, sched = u.system.frame(d), u.system.sched(d)[0]
        formulas = {}
        for n in open_props:
            if n in TRANSITION_FORMULAS:
                if d > 0:
                    formulas[n] = u.system.build(TRANSITION_FORMULAS[n], u.steps[-1])
            elif n == "WF_encoding":
                formulas[n] = u.system.build(well_formed, frame)
            elif n in AUXILIARY:
                formulas[n] = u.system.build(AUXILIARY[n], frame)
            else:
                formulas[n] = u.system.build(INVARIANT_FORMULAS[n], frame, sched)
        while not timed_out:
            bad = {n: z3.Not(f) for n, f in formulas.items() if n in open_props}
            if not bad:
                break
            r = u.query(z3.Or(list(bad.values())), remaining_ms(), open_props)
            if r != z3.sat:
                timed_out = r == z3.unknown
                break
            m = u.solver.model()
            actions, states = u.trace(m)
            replay(model, actions, states)
            for n, f in bad.items():
                if z3.is_true(m.eval(f, model_completion=True)):
                    if n in spec_props and not concrete_check(model, n, states, actions):
                        raise ReplayMismatch(f"{n}: Z3 says violated at depth {d}, the spec's predicate holds")
                    results[n] = EngineVerdict(n, kind_of(n), "violated", "bmc", d,
                                                time.perf_counter() - t0, actions, states)
                    open_props.remove(n)
            if stop_at_first and any(n in spec_props for n in results):
                break       # the shortest counterexample is found; the rest of this depth is not asked
        if timed_out:
            break
        for n in open_props:
            if n in formulas:
                u.holds(n, formulas[n])
        if stop_at_first and any(p.status == "violated" and p.name in spec_props for p in results.values()):
            completed = d
            break
        while open_targets and not timed_out:
            goals = {n: u.system.build(SOMETIMES_FORMULAS[n], frame) for n in open_targets}
            r = u.query(z3.Or(list(goals.values())), remaining_ms(), open_props)
            if r != z3.sat:
                timed_out = r == z3.unknown
                break
            m = u.solver.model()
            actions, states = u.trace(m)
            replay(model, actions, states)
            for n, g in goals.items():
                if z3.is_true(m.eval(g, model_completion=True)):
                    _confirm_reached(model, n, states)
                    results[n] = EngineVerdict(n, "sometimes", "reached", "bmc", d,
                                                time.perf_counter() - t0, actions, states)
                    open_targets.remove(n)
        if timed_out:
            break
        completed = d
        if progress is not None:
            progress(d, time.perf_counter() - t0, u.counts())
        ms = remaining_ms()
        if ms is not None and ms <= 0:
            break
    seconds = time.perf_counter() - t0
    for n in open_props:
        results[n] = EngineVerdict(n, kind_of(n), "bounded" if completed >= 0 else "unknown", "bmc",
                                    max(completed, 0), seconds)
    for n in open_targets:
        results[n] = EngineVerdict(n, "sometimes", "unknown", "bmc", max(completed, 0), seconds,
                                    message=f"not reached within depth {completed}")
    order = props + targets
    return EngineResult(model.name, "bmc", seconds, completed,
                        sorted(results.values(), key=lambda p: order.index(p.name)))


def bmc_split(model: Model, max_depth: int, jobs: int = 2,
              progress: Callable[[int, float, dict[str, int]], None] | None = None, **options) -> EngineResult:
    """`bmc` with the paths shared among `jobs` processes (one `Cube` each),
    merged: a property holds to the depth every part completed; a violation
    or a reached target is the shallowest any part found. `progress` is called
    once every part has completed a depth, with their solver counts summed."""
    cubes = split(model, jobs)
    if len(cubes) == 1:
        return bmc(model, max_depth, progress=progress, **options)
    t0 = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")      # Z3 contexts do not survive a fork
    events = ctx.Queue()
    workers = [ctx.Process(target=_part, args=(i, model, max_depth, cube, options, events), daemon=True)
               for i, cube in enumerate(cubes)]
    for w in workers:
        w.start()
    done: dict[int, dict[int, dict[str, int]]] = {i: {} for i in range(len(cubes))}
    finished_at: dict[int, dict[int, float]] = {i: {} for i in range(len(cubes))}
    results: dict[int, EngineResult] = {}
    reported = -1
    try:
        while len(results) < len(cubes):
            try:
                kind, i, payload = events.get(timeout=5)
            except queue.Empty:
                dead = [j for j, w in enumerate(workers) if not w.is_alive() and j not in results]
                if dead and events.empty():
                    raise RuntimeError(f"BMC part {dead[0]} died (exit code {workers[dead[0]].exitcode})")
                continue
            if kind == "error":
                raise RuntimeError(f"BMC part {i} failed:\n{payload}")
            if kind == "result":
                results[i] = payload
                continue
            done[i][payload[0]] = payload[1]
            finished_at[i][payload[0]] = time.perf_counter() - t0
            while progress is not None and all(reported + 1 in d for d in done.values()):
                reported += 1
                counts = [d[reported] for d in done.values()]
                progress(reported, time.perf_counter() - t0,
                         {k: sum(c[k] for c in counts) for k in counts[0]})
    finally:
        for w in workers:
            if w.is_alive():
                w.terminate()
            w.join()
    res = _merge(model, [results[i] for i in range(len(cubes))], time.perf_counter() - t0)
    for i, cube in enumerate(cubes):
        times = ", ".join(f"{d}: {s:.1f}" for d, s in sorted(finished_at[i].items()))
        res.notes.append(f"part {i} ({cube}) completed depths at seconds {{{times}}}")   # depth: seconds
    return res


def _part(i: int, model: Model, max_depth: int, cube: Cube, options: dict, events) -> None:
    """One process of `bmc_split`: its events are ("depth" | "result" | "error", part, payload)."""
    try:
        res = bmc(model, max_depth, cube=cube,
                  progress=lambda d, _s, counts: events.put(("depth", i, (d, counts))), **options)
        events.put(("result", i, res))
    except Exception:       # noqa: BLE001 - the parent re-raises it with the traceback
        events.put(("error", i, traceback.format_exc()))


def _merge(model: Model, parts: list[EngineResult], seconds: float) -> EngineResult:
    """One result from the parts': each row from the part that found it
    shallowest, or else from the part that got least deep (an "unknown"
    there outweighs a "bounded" elsewhere at the same depth)."""
    completed = min(p.depth for p in parts)
    rows = []
    for first in parts[0].properties:
        mine = [p.by_name()[first.name] for p in parts]
        found = [r for r in mine if r.status in ("violated", "reached")]
        if found:
            row = min(found, key=lambda r: (r.depth, r.seconds))
            if completed < row.depth - 1:
                row.message = (f"found at depth {row.depth}; a part stopped at depth {completed}, "
                               "so a shorter one may exist")
        else:
            row = min(mine, key=lambda r: (r.depth, r.status != "unknown"))
        rows.append(row)
    return EngineResult(model.name, "bmc", seconds, completed, rows,
                        notes=[f"paths shared among {len(parts)} processes (z3.bmc.engine.split)"])


def _confirm_reached(model: Model, name: str, states) -> None:
    """The spec's own predicate says the target is reached at the trace's end."""
    sm = next(s for s in SOMETIMES if s.name == name)
    cfg, n = model.cfg, model.num_requests
    for r in range(n):
        if not sm.target(states[-1], cfg, r):
            continue
        if sm.after is None or any(sm.after(s, cfg, r) for s in states):
            return
    raise ReplayMismatch(f"{name}: Z3 says reached, the spec's predicate disagrees")


def first_counterexample(model: Model, max_depth: int = 12, time_budget: float | None = 60.0,
                         properties: Iterable[str] | None = None) -> EngineVerdict | None:
    """The shortest violation of any property (for mutant hunting), or None."""
    res = bmc(model, max_depth, properties, sometimes=[], time_budget=time_budget, stop_at_first=True)
    bad = [p for p in res.properties if p.status == "violated" and p.kind != "auxiliary"]
    return min(bad, key=lambda p: p.depth) if bad else None
