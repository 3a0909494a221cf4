"""Spacer on the parameterised model, instantiated: an unbounded proof with no
hand-written invariant for a fixed number of requests.

Spacer on the full encoding (verification/z3/induction/spacer.py) proves only the properties that
rest on no accounting invariant (S11, L3, S4, S7); the others do not come
even on the smallest model: the KV pool by identity, its LRU free queue, the
in-flight entries addressed by request index and the unrolled schedule make
every transition a large formula over integers. The parameterised model of
verification/z3/param/model.py drops exactly that part (the pool, and the policy's choices,
over-approximated), so here Spacer gets
its micro-steps over N explicit requests, with the model's configuration and
prompts, and is asked for the spec properties the parameterised model states
(`S1..S11`, `L1` conjuncts of verification/z3/param/invariant.py — never the `aux.*` ones, which
are the hand-written strengthening Spacer has to find for itself):

    Inv_0(init)
    Inv_d'(post_s(x, p))  <=  Inv_d(x) AND guard_s(x, p)     for every micro-step s,
                                                              depth d, request r
    Bad                   <=  Inv_d(x) AND NOT P(x)          for every depth d

One predicate per pipeline depth d (launched batches): Inv_d keeps the
request fields and slots 0..min(d, K-1) (the launched batches and the one
under construction); the slots past them are empty in every reachable state
(`aux.nothing_beyond_open_batch`, kept true here by construction: no
micro-step writes past the open slot, and `pop` shifts an empty slot in).
Smaller predicates give Spacer smaller lemmas to find; on N = 2, K = 2 this
is 2-3x faster than one predicate over the whole state.

`unsat` proves P in every state the micro-steps reach from Init, hence (the
link of verification/z3/param/link.py: every spec step is a sequence of micro-steps,
checked exhaustively on the models of models.py) in every reachable state of
the spec model with the same configuration and prompts. What it does not
cover is what the parameterised model does not state: S9, the queue and pool
parts of S10, L2, L3, the transition properties.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import z3
from flightcheck.verification.models import Model
from flightcheck.verification.z3.param.invariant import (
    global_conjuncts,
    local_conjuncts,
)
from flightcheck.verification.z3.param.model import (
    FATE_SORT,
    STATUS_SORT,
    ParamConfig,
    ParamState,
    Slot,
    Symbolic,
    finite_req_sort,
    initial,
)
from flightcheck.verification.z3.param.steps import MICRO_STEPS

REQUEST_FIELDS = ("prompt_len", "max_tokens", "num_output", "num_computed", "num_drafts")
SLOT_FIELDS = ("fate", "start", "n", "drafts", "samples")


@dataclass
class SpacerParamResult:
    model: str
    num_requests: int
    K: int
    status: str              # proved | violated | unknown
    seconds: float
    num_rules: int
    message: str = ""


class _Instance:
    """The parameterised vocabulary over N explicit requests: scalar variables
    for Spacer's predicates, and the arrays z3.param.model's steps read, built from
    them as lambdas (so a post-state's fields simplify back to scalars)."""

    def __init__(self, model: Model) -> None:
        cfg = model.cfg
        self.N, self.K = model.num_requests, cfg.num_stages
        self.sort, self.domain = finite_req_sort(self.N)
        self.ops = Symbolic(self.sort, self.domain)
        self.cfg = ParamConfig(self.K, cfg.max_num_batched_tokens, cfg.max_num_seqs, cfg.max_model_len,
                               cfg.num_spec_tokens, cfg.long_prefill_token_threshold, self.domain[0],
                               model.mutant, cfg.rules.held_drafts_left_uncached)
        self.prompts = model.prompts
        self.variables = self._scalars()

    def _scalars(self) -> dict[str, Any]:
        N, K = self.N, self.K
        variables: dict[str, Any] = {f: [z3.Int(f"{f}{i}") for i in range(N)] for f in REQUEST_FIELDS}
        variables["status"] = [z3.Const(f"status{i}", STATUS_SORT) for i in range(N)]
        for j in range(K):
            variables[f"fate{j}"] = [z3.Const(f"fate{j}_{i}", FATE_SORT) for i in range(N)]
            for f in ("start", "n", "drafts"):
                variables[f"{f}{j}"] = [z3.Int(f"{f}{j}_{i}") for i in range(N)]
            variables[f"samples{j}"] = [z3.Bool(f"samples{j}_{i}") for i in range(N)]
            variables[f"tokens{j}"] = z3.Int(f"tokens{j}")
            variables[f"first{j}"] = z3.Const(f"first{j}", self.sort)
        variables["num_running"] = z3.Int("num_running")
        return variables

    def kept_slots(self, d: int) -> int:
        """Inv_d's slots: the d launched batches and the open one (K at full depth)."""
        return min(d + 1, self.K)

    def pre(self, d: int) -> dict[str, Any]:
        """The variables of Inv_d, the slots past the kept ones empty."""
        variables = dict(self.variables)
        for j in range(self.kept_slots(d), self.K):
            variables[f"fate{j}"] = [self.ops.fate("absent")] * self.N
            for f in ("start", "n", "drafts"):
                variables[f"{f}{j}"] = [z3.IntVal(0)] * self.N
            variables[f"samples{j}"] = [z3.BoolVal(False)] * self.N
            variables[f"tokens{j}"], variables[f"first{j}"] = z3.IntVal(0), self.cfg.nobody
        return variables

    def _array(self, xs: list[Any]) -> Any:
        q = z3.Const("q", self.sort)
        body = xs[-1]
        for i in range(self.N - 2, -1, -1):
            body = z3.If(q == self.domain[i], xs[i], body)
        return z3.Lambda([q], body)

    def state(self, variables: dict[str, Any], d: int) -> ParamState:
        slots = tuple(Slot(*[self._array(variables[f"{f}{j}"]) for f in SLOT_FIELDS],
                           variables[f"tokens{j}"], variables[f"first{j}"])
                      for j in range(self.K))
        return ParamState(self._array(variables["status"]), *[self._array(variables[f]) for f in REQUEST_FIELDS],
                      slots=slots, depth=z3.IntVal(d), num_running=variables["num_running"])

    def args(self, x: ParamState, d: int) -> list[Any]:
        """Inv_d's arguments from a state's terms (slot fields simplified to scalars)."""
        def at(array: Any) -> list[Any]:
            return [z3.simplify(array[c]) for c in self.domain]

        out = [t for f in ("status", *REQUEST_FIELDS) for t in at(getattr(x, f))]
        for s in x.slots[:self.kept_slots(d)]:
            for f in SLOT_FIELDS:
                out += at(getattr(s, f))
            out += [_int_term(s.tokens), s.first]
        return out + [_int_term(x.num_running)]

    def properties(self, x: ParamState) -> Any:
        """P(x): the spec's properties as z3.param.invariant states them, without the aux.* strengthening."""
        conj = {**global_conjuncts(self.ops, x, self.cfg)}
        for r in self.domain:
            conj.update({f"{n}@{r}": f for n, f in local_conjuncts(self.ops, x, self.cfg, r).items()})
        return z3.simplify(z3.And([f for n, f in conj.items() if not n.startswith("aux.")]))


def _int_term(x: int | Any) -> Any:
    """A count the steps leave as a Python int or as a term, as a simplified term."""
    return z3.simplify(z3.IntVal(x) if isinstance(x, int) else x)


def horn_clauses(model: Model) -> tuple[z3.Fixedpoint, Any, int]:
    """(fixedpoint, Bad, number of transition rules) for `model`."""
    instance = _Instance(model)
    K = instance.K
    states = {d: instance.state(instance.pre(d), d) for d in range(K + 1)}       # Inv_d's state
    predicates = {d: z3.Function(f"Inv{d}", *[a.sort() for a in instance.args(x, d)], z3.BoolSort())
             for d, x in states.items()}
    bad = z3.Function("Bad", z3.BoolSort())
    fixedpoint = z3.Fixedpoint()
    fixedpoint.set(engine="spacer")
    fixedpoint.register_relation(bad, *predicates.values())
    scalars = [t for xs in instance.variables.values() for t in (xs if isinstance(xs, list) else [xs])]
    fixedpoint.declare_var(*scalars)
    fixedpoint.rule(predicates[0](*instance.args(initial(instance.ops, instance.cfg), 0)))
    num_rules = 0
    for kind in MICRO_STEPS:
        for d in kind.depths(K):
            x = states[d]
            body_pre = predicates[d](*instance.args(x, d))
            for r in (instance.domain if "r" in kind.params else [None]):
                params = [r if p == "r" else z3.Int(f"param_{p}") for p in kind.params]
                free = [p for p in params if p is not r]
                if free:
                    fixedpoint.declare_var(*free)
                guard, post = kind.update(instance.ops, x, instance.cfg, d, *params)
                if kind.name == "arrive":          # the model's prompt for this request slot
                    prompt = instance.prompts[instance.domain.index(r)]
                    guard = z3.And(guard, params[1] == prompt.prompt_len, params[2] == prompt.max_tokens)
                after = {"launch": d + 1, "pop": d - 1}.get(kind.name, d)
                fixedpoint.rule(predicates[after](*instance.args(post, after)), [body_pre, z3.simplify(guard)])
                num_rules += 1
    for d, x in states.items():
        fixedpoint.rule(bad(), [predicates[d](*instance.args(x, d)), z3.Not(instance.properties(x))])
    return fixedpoint, bad, num_rules


def spacer_param(model: Model, time_budget: float | None = None) -> SpacerParamResult:
    """Prove the parameterised model's spec properties for `model`'s requests,
    configuration and prompts with Spacer, no invariant given."""
    t0 = time.perf_counter()
    fixedpoint, bad, num_rules = horn_clauses(model)
    if time_budget is not None:
        fixedpoint.set("timeout", max(1, int(time_budget * 1000)))
    try:
        answer = fixedpoint.query(bad())
        reason = fixedpoint.reason_unknown() if answer == z3.unknown else ""
    except z3.Z3Exception as e:              # a timeout surfaces as "canceled"
        answer, reason = z3.unknown, str(e)
    seconds = time.perf_counter() - t0
    status = "proved" if answer == z3.unsat else "violated" if answer == z3.sat else "unknown"
    message = f"Spacer gave up: {reason}" if status == "unknown" else ""
    if status == "proved":
        message = f"synthesised invariant: {len(str(fixedpoint.get_answer()))} characters"
    return SpacerParamResult(model.name, model.num_requests, model.cfg.num_stages, status, seconds,
                             num_rules, message)
