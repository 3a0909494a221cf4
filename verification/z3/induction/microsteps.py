"""`schedule`'s inductive step proved one micro-step at a time.

The k-induction step for `schedule` asks: from any state satisfying the
invariants, does the state `schedule` produces satisfy them too? Asked in one
query, the solver must reason through the whole unrolled circuit at once (N
iterations of the running loop, N of the waiting loop, then the launch: for 3
requests and 6 KV blocks, S9 alone takes minutes). But `schedule` is a chain
of micro-steps (z3.encoding.schedule.MicroStep), each a small function of the batch
under construction before it, so the question splits the way a proof by hand
would split it:

    I(s)                 =>  J_0(acc_0)              (acc_0.state is s itself)
    J_m(acc_m)  AND  defs of micro-step m  =>  J_{m+1}(acc_{m+1})
    J_2N(acc_2N) AND defs of the launch    =>  goal(launch state)

Each J_m is found forward, the Houdini way: the candidates are every
conjunct of the invariant applied to the intermediate state `acc.state`, plus
facts about the batch under construction (`batch_facts`); a candidate that
a micro-step does not preserve is dropped from there on. Intermediate states
are not spec states (a victim is PREEMPTED while its entries in flight are
still LIVE until the launch settles their fates), so some conjuncts drop out
on the way; the goals they leave unproved go back to the one-query method.

Each query holds only one micro-step's definitions (the others are left
out, which only admits more models, so unsat still proves the step for the
real ones): soundness is the chain's induction over the micro-steps, and
the goal is only reported proved when the final query is unsatisfiable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import z3
from flightcheck.verification.z3.encoding.invariants import kv_ownership_clauses
from flightcheck.verification.z3.encoding.priority_state import has_priority
from flightcheck.verification.z3.encoding.requests import at, num_tokens
from flightcheck.verification.z3.encoding.schedule import BatchInProgress, threshold_in_force
from flightcheck.verification.z3.encoding.state import (
    LIVE,
    PAD,
    PREEMPTED,
    RUNNING,
    WAITING,
    Layout,
    SState,
)
from flightcheck.verification.z3.encoding.unwritten_formulas import unwritten_batch_facts
from flightcheck.verification.z3.encoding.terms import (
    V,
    conj,
    disj,
    div_const,
    eq,
    ite,
    le,
    leaves,
    lt,
    neg,
    pick,
    sum_terms,
)

# Each chain query's time limit: a micro-step query that needs longer is not
# worth it (the goal falls back to the whole-step query).
QUERY_MS = 60_000

StateFormula = Callable[[SState], Any]

# Conjuncts tracked clause by clause along the chain: a micro-step breaks or
# keeps each clause on its own, and small goals are quicker to prove.
SPLIT = {"S9_kv_ownership": kv_ownership_clauses}


def unchanged(q: Any, was: Any) -> Any:
    """Every field of a request equals its value in the frame."""
    return conj([x == y for (_, x), (_, y) in zip(leaves(q), leaves(was))])


def batch_facts(layout: Layout, acc: BatchInProgress, frame: SState) -> dict[str, Any]:
    """Facts about the batch under construction that the launch relies on:
    each entry is for a distinct RUNNING request, starts at its counter
    (which only the launch advances), holds blocks for its tokens, and
    carries the request's drafts; unused slots are padding. And, per request,
    that the loops have not touched it yet: a conjunct of the invariant that
    a visited request breaks on the way still holds, on the frame, for the
    requests not yet visited."""
    return {**_untouched_facts(layout, acc, frame), **_loop_facts(layout, acc), **_marked_facts(acc),
            **_entry_facts(layout, acc, frame), **_retry_facts(layout, acc, frame),
            **unwritten_batch_facts(layout, acc)}


def _retry_facts(layout: Layout, acc: BatchInProgress, frame: SState) -> dict[str, Any]:
    """Under the priority policy (z3.encoding.priority: a preemption that is
    not of the request itself makes the next micro-step retry the request
    with its first try's num_new): no retry pending, or a retry of a
    RUNNING request in `running` that has no entry and was not preempted,
    for a num_new that fits its tokens, the model length, the threshold
    and the budget left (a hand-back only returns tokens to it). Without
    these the micro-step after a hand-back allocates for a request the
    chain knows nothing of. FCFS: none (no retry)."""
    if not has_priority(layout):
        return {}
    cfg, st = layout.cfg, acc.state
    retrying, r = lt(0, acc.pending), acc.retried
    threshold_on = threshold_in_force(layout, frame)

    def field(fn) -> Any:
        return at(layout, st, r, lambda q, k: fn(q, k))

    bound = [le(acc.pending, acc.budget), le(field(lambda q, k: q.num_computed) + acc.pending,
                                             cfg.max_model_len - cfg.rules.sampled_token_slot),
             le(field(lambda q, k: q.num_computed) + acc.pending,
                field(lambda q, k: num_tokens(layout, q, k) + q.num_drafts))]
    if cfg.long_prefill_token_threshold:
        bound.append(disj(neg(threshold_on), le(acc.pending, cfg.long_prefill_token_threshold)))
    in_running = disj(*[conj(lt(p, st.running_len), eq(x, r)) for p, x in enumerate(st.running)])
    has_entry = disj(*[conj(lt(j, acc.count), eq(e.req, r)) for j, e in enumerate(acc.entries)])
    return {
        "batch.retry.none_or_one": conj(le(0, acc.pending), eq(acc.pending, 0) == eq(r, PAD)),
        "batch.retry.of_a_running_request": z3.Implies(retrying, conj(
            le(0, r), lt(r, layout.N), eq(field(lambda q, k: q.status), RUNNING), in_running, neg(has_entry),
            neg(acc.done), acc.any_preempted, *[z3.Implies(eq(r, v), neg(acc.preempted[v])) for v in range(layout.N)])),
        "batch.retry.fits": z3.Implies(retrying, conj(*bound)),
        # the position still points at it: a victim before it moved it back by one
        "batch.retry.at_the_position": z3.Implies(retrying, conj(lt(acc.position, st.running_len),
                                                                eq(pick(st.running, acc.position, V(PAD)), r))),
    }


def _untouched_facts(layout: Layout, acc: BatchInProgress, frame: SState) -> dict[str, Any]:
    """Per request, against the frame: untouched unless the loops scheduled,
    admitted or preempted it, and how each of those left it."""
    facts: dict[str, Any] = {}
    for r, q in enumerate(acc.state.reqs):
        was = frame.reqs[r]
        scheduled = disj(*[conj(lt(j, acc.count), eq(e.req, r)) for j, e in enumerate(acc.entries)])
        same = unchanged(q, was)
        facts[f"request[{r}].untouched_unless_scheduled_or_preempted"] = z3.Implies(
            neg(disj(acc.preempted[r], acc.admitted[r], scheduled)), same)
        facts[f"request[{r}].running_scheduled_keeps_its_counter"] = z3.Implies(
            conj(scheduled, neg(acc.admitted[r])),
            conj(eq(q.status, was.status), eq(q.num_computed, was.num_computed), eq(q.num_output, was.num_output),
                 eq(was.status, RUNNING), lt(was.num_computed, num_tokens(layout, was, r) + was.num_drafts)))
        facts[f"request[{r}].admitted_from_the_queue"] = z3.Implies(acc.admitted[r], conj(
            neg(acc.preempted[r]), scheduled, disj(eq(was.status, WAITING), eq(was.status, PREEMPTED)),
            acc.admitted_from_preempted[r] == eq(was.status, PREEMPTED), eq(q.num_output, was.num_output)))
        facts[f"request[{r}].no_admission_after_preemption"] = z3.Implies(acc.any_preempted, neg(acc.admitted[r]))
    return facts


def _loop_facts(layout: Layout, acc: BatchInProgress) -> dict[str, Any]:
    """The loops' own counters in range: entries, budget, positions."""
    cfg, st = layout.cfg, acc.state
    facts = {
        "batch.count_in_range": conj(le(0, acc.count), le(acc.count, layout.E)),
        "batch.budget_is_what_is_left": eq(acc.budget, cfg.max_num_batched_tokens - sum_terms(
            [ite(lt(j, acc.count), e.n, V(0)) for j, e in enumerate(acc.entries)])),
        "batch.position_in_range": conj(le(0, acc.position), le(acc.position, st.running_len)),
        "batch.budget_in_range": conj(le(0, acc.budget), le(acc.budget, cfg.max_num_batched_tokens)),
        "batch.any_preemption_is_one": acc.any_preempted == disj(*acc.preempted),
    }
    if cfg.rules.defer_resume_while_stale:
        # the waiting loop's position (vLLM 0.33: requests passed over stay in the queue)
        facts["batch.skipped_in_range"] = conj(le(0, acc.skipped), le(acc.skipped, st.waiting_len))
    return facts


def _marked_facts(acc: BatchInProgress) -> dict[str, Any]:
    """Per request, what the loops' flags say of its state now."""
    facts: dict[str, Any] = {}
    for r, q in enumerate(acc.state.reqs):
        facts[f"request[{r}].preempted_here"] = z3.Implies(acc.preempted[r], conj(
            eq(q.status, PREEMPTED), eq(q.num_computed, 0), eq(q.table_len, 0)))
        facts[f"request[{r}].admitted_here"] = z3.Implies(acc.admitted[r], eq(q.status, RUNNING))
        facts[f"request[{r}].resumed_here"] = z3.Implies(acc.admitted_from_preempted[r], acc.admitted[r])
    return facts


def _entry_facts(layout: Layout, acc: BatchInProgress, frame: SState) -> dict[str, Any]:
    """Per entry slot: padding when unused, else an entry of a distinct
    RUNNING request, at its counter, with its drafts and blocks for it."""
    cfg, st, block_size = layout.cfg, acc.state, layout.cfg.block_size
    threshold_on = threshold_in_force(layout, frame)    # the frame's count (vLLM 0.33: only with company)
    facts: dict[str, Any] = {}
    for j, e in enumerate(acc.entries):
        used = lt(j, acc.count)

        def field(fn) -> Any:
            return at(layout, st, e.req, lambda q, k: fn(q, k))

        pad = conj(eq(e.req, PAD), eq(e.start, 0), eq(e.n, 0), neg(e.samples), eq(e.drafts, 0), eq(e.fate, 0))
        facts[f"batch[{j}].padded_when_unused"] = z3.Implies(neg(used), pad)
        facts[f"batch[{j}].running_request"] = z3.Implies(used, conj(
            le(0, e.req), lt(e.req, layout.N), eq(field(lambda q, k: q.status), RUNNING), eq(e.fate, LIVE)))
        facts[f"batch[{j}].starts_at_counter"] = z3.Implies(
            used, eq(e.start, field(lambda q, k: q.num_computed)))
        facts[f"batch[{j}].blocks_cover_it"] = z3.Implies(used, le(
            div_const(e.start + e.n + (block_size - 1), block_size), field(lambda q, k: q.table_len)))
        facts[f"batch[{j}].shape"] = z3.Implies(used, conj(
            le(1, e.n), le(0, e.drafts), lt(e.drafts, e.n), le(e.drafts, cfg.num_spec_tokens),
            le(e.start + e.n, cfg.max_model_len),
            disj(neg(threshold_on), le(e.n, cfg.long_prefill_token_threshold))   # 0.8.x: the bare bound
            if cfg.long_prefill_token_threshold else True))
        facts[f"batch[{j}].drafts_are_the_requests"] = z3.Implies(
            used, eq(e.drafts, field(lambda q, k: q.num_drafts)))
        facts[f"batch[{j}].samples_iff_reaches_the_end"] = z3.Implies(
            used, e.samples == (e.start + e.n - e.drafts >= field(lambda q, k: num_tokens(layout, q, k))))
        facts[f"batch[{j}].drafts_ride_on_the_sample"] = z3.Implies(conj(used, lt(0, e.drafts)), e.samples)
        facts[f"batch[{j}].within_known_tokens"] = z3.Implies(used, le(
            e.start + e.n, field(lambda q, k: num_tokens(layout, q, k)) + e.drafts))
        facts[f"batch[{j}].already_passed_in_running"] = z3.Implies(used, disj(
            *[conj(lt(p, acc.position), eq(st.running[p], e.req)) for p in range(layout.N)]))
        for j2 in range(j + 1, layout.E):
            facts[f"batch[{j},{j2}].distinct_requests"] = z3.Implies(
                conj(used, lt(j2, acc.count)), neg(eq(e.req, acc.entries[j2].req)))
    return facts


@dataclass
class Chain:
    """An action unrolled into micro-steps, as a proof sees it."""

    start: Any                  # the structure before the first micro-step
    micro: list                 # z3.encoding.terms.MicroStep, in order
    state_of: Callable          # structure -> the SState it holds
    facts: Callable             # (structure, micro-steps taken) -> {name: formula}: extra candidates
    given: list                 # constraints true of every real step (guard, legal choices, ...)
    final_defs: list            # definitions of the effect from the last structure
    name: str = ""


def completion_facts(layout: Layout, st: SState, frame: SState, taken: int) -> dict[str, Any]:
    """While complete_oldest applies the oldest batch's entries in order: a
    request no entry applied so far names is as it was in the frame."""
    oldest, facts = frame.batches[0], {}
    for r, q in enumerate(st.reqs):
        named = disj(*[conj(lt(j, oldest.length), eq(oldest.entries[j].req, r)) for j in range(taken)])
        same = unchanged(q, frame.reqs[r])
        facts[f"request[{r}].untouched_until_applied"] = z3.Implies(neg(named), same)
    return facts


class MicroChain:
    """The forward Houdini chain over one action's micro-steps."""

    def __init__(self, build: Callable, chain: Chain, state_conjuncts: dict[str, StateFormula],
                 frame_hypotheses: Callable[[list[str]], list[Any]], new_solver: Callable[[], z3.Solver]) -> None:
        self.build, self.chain = build, chain       # build(fn, *args): fn(layout, *args) in the system's arithmetic
        self.state_conjuncts = state_conjuncts     # name -> formula of an SState
        self.frame_hypotheses = frame_hypotheses                # alive names -> hypotheses on the frame
        self.new_solver = new_solver
        self._final: dict[tuple[str, ...], tuple[z3.Solver, list[str]]] = {}
        self.queries = 0
        self.dropped: dict[str, str] = {}         # candidate -> the micro-step that broke it

    def _candidates(self, x: Any, alive: list[str], taken: int) -> dict[str, Any]:
        st, out = self.chain.state_of(x), {}
        for n in alive:
            if n in SPLIT:                      # a big conjunct, clause by clause
                out.update((f"state.{n}.{p}", f) for p, f in self.build(SPLIT[n], st).items())
            elif n in self.state_conjuncts:
                out[f"state.{n}"] = self.state_conjuncts[n](st)
        out.update(self.chain.facts(x, taken))
        return out

    def _holds(self, solver: z3.Solver, goal: Any) -> bool:
        self.queries += 1
        solver.set("timeout", QUERY_MS)
        return solver.check(z3.Not(goal)) == z3.unsat

    def _filter(self, solver: z3.Solver, keep: list[str], candidates: dict[str, Any]) -> list[str]:
        """The candidates the solver's assertions imply, one query each (one
        query for the conjunction, Houdini-style, measured slower here)."""
        return [n for n in keep if self._holds(solver, candidates[n])]

    def _survivors(self, alive: list[str]) -> tuple[z3.Solver, list[str]]:
        """J at the end of the chain, and a solver holding it with the effect's definitions."""
        key = tuple(sorted(alive))
        if key in self._final:
            return self._final[key]
        chain = self.chain
        hypotheses = self.frame_hypotheses(alive) + chain.given
        candidates = self._candidates(chain.start, alive, 0)
        base = self.new_solver()
        base.add(hypotheses)
        keep = self._filter(base, list(candidates), candidates)
        prev_after, prev = chain.start, candidates
        for i, micro_step in enumerate(chain.micro):
            if micro_step.before is not prev_after:         # a seam between loops: re-check on the rewrapped structure
                seam = self.new_solver()
                seam.add(hypotheses + [prev[n] for n in keep])
                now = self._candidates(micro_step.before, alive, i)
                keep = self._filter(seam, keep, now)
                prev = now
            solver = self.new_solver()
            solver.add(hypotheses + micro_step.defs + [prev[n] for n in keep])
            after = self._candidates(micro_step.after, alive, i + 1)
            kept = self._filter(solver, keep, after)
            self.dropped.update((n, micro_step.name) for n in keep if n not in kept)
            keep, prev_after, prev = kept, micro_step.after, after
        final = self.new_solver()
        final.add(hypotheses + chain.final_defs + [prev[n] for n in keep])
        self._final[key] = (final, keep)
        return final, keep

    def proves(self, goal: Any, alive: list[str]) -> bool:
        """goal (a formula of the action's effect) follows along the chain."""
        final, _ = self._survivors(alive)
        return self._holds(final, goal)

    def kept(self, alive: list[str]) -> list[str]:
        return self._survivors(alive)[1]
