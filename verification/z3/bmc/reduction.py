"""Sound reductions of BMC's unrolling: fewer paths, the same shortest violations.

Two kinds, both constraints on the unrolling (the transition relation is untouched):

Twin symmetry. Requests whose prompts are identical are interchangeable: renaming
them (and the labels of the blocks only they write) maps every path to a path and
every property to itself, since the spec orders requests by its queues, never by
their ids. So BMC keeps only the paths on which a twin arrives no sooner than its
lower-numbered twin:

    for twins r < r', at every frame:   status[r'] != NEW  ->  status[r] != NEW

Peephole partial-order reduction. Two adjacent steps that commute (the other
order is enabled too and ends in the same state) need one order only. Each
rule below names a pair of steps i, i+1 that BMC forbids, because the swapped
pair is kept:

    abort ; arrive           arrive first: abort never touches a NEW request
    complete ; arrive        arrive first: completion never touches one either
    abort r ; abort r'       for r' < r when r or r' holds no block: lower id
                             first (with blocks on both sides the free queue's
                             order tells the two apart)
    abort r ; complete       complete first, when the oldest batch holds no
                             entry of r that samples and the completion frees
                             no block: r's entries then change nothing, and
                             the free queue gets no block from either side
    schedule ; arrive r      arrive first, when schedule left a request
                             waiting or max_num_seqs running: FCFS admission
                             stopped before the tail, where r would join
    complete ; schedule      schedule first, when fewer than K batches were in
                             flight and no entry of the oldest batch samples
                             (with continue_prefill): that completion only
                             retires the batch, and schedule reads neither
                             the batch nor, below K, the FIFO's length

Why that keeps every shortest violation: every dropped pair runs against the
order  arrive < schedule < complete < abort 0 < abort 1 < ...  Take a shortest
path to a bad state (or a reached target) and swap any dropped pair at steps
i, i+1 (i + 1 below the last step): the kept order is enabled, passes through
the same state s_{i+2} and carries the same action labels, so the path stays
a path of the same length to the same end, with one inversion of that order
fewer. Swapping until no dropped pair is left ends (the inversions count
down) in a path the constraints keep. Twins first: renaming them puts the
lower twin's arrival first, and swaps never reorder two arrivals. The
constraint on pair (i, i+1) is added only once step i+2 exists, so the last
step is never swapped: a transition property's violating step survives as it
is. A path that BMC keeps has a prefix BMC kept at the smaller depth, so the
properties BMC has shown at the earlier frames stay sound lemmas.

Abstracted away: nothing; but the argument assumes the commutations hold in
the model at hand. They are checked, exhaustively on every reachable state of
the models the tests name (tests/test_z3_reduction.py), and the reductions are
refused for a spec mutant, whose commutations nobody checked.
"""

from __future__ import annotations

from dataclasses import dataclass

import z3
from flightcheck.verification.models import Model
from flightcheck.verification.z3.encoding.actions import (
    ABORT,
    ARRIVE,
    COMPLETE,
    SCHEDULE,
)
from flightcheck.verification.z3.encoding.state import NEW, SUPERSEDED, Layout, SState
from flightcheck.verification.z3.encoding.system import Step, System
from flightcheck.verification.z3.encoding.terms import (
    conj,
    disj,
    eq,
    le,
    leaves,
    lt,
    neg,
)


def twins(model: Model) -> list[tuple[int, int]]:
    """Pairs r < r' of requests with identical prompts, each r' with its nearest lower twin."""
    out = []
    for request, prompt in enumerate(model.prompts):
        lower = [r for r in range(request) if model.prompts[r] == prompt]
        if lower:
            out.append((lower[-1], request))
    return out


def check_reducible(model: Model) -> None:
    """The commutations were checked for the spec, not for its mutants: refuse those."""
    if model.mutant is not None:
        raise ValueError(f"the BMC reductions are checked for the spec, not for the mutant {model.mutant}")


def twin_order(system: System, t: int) -> list[z3.BoolRef]:
    """A twin has arrived at frame t only if its lower twin has."""
    frame = system.frame(t)
    return system.build(lambda layout: [z3.Implies(neg(eq(frame.reqs[higher].status, NEW)),
                                                   neg(eq(frame.reqs[lower].status, NEW)))
                                        for lower, higher in twins(system.model)])


@dataclass(frozen=True)
class StepPair:
    """Two consecutive steps, first: before -> middle and second: middle ->
    after, each an action code on a request (as the step's choices name them)."""

    first_action: z3.ExprRef
    first_request: z3.ExprRef
    second_action: z3.ExprRef
    second_request: z3.ExprRef
    before: SState
    middle: SState
    after: SState


def forbidden(layout: Layout, pair: StepPair) -> z3.BoolRef:
    """The pair's steps are in an order the rules drop."""
    first_action, first_request = pair.first_action, pair.first_request
    second_action, second_request = pair.second_action, pair.second_request
    before, middle, after = pair.before, pair.middle, pair.after

    def holds_no_block(request: z3.ExprRef) -> z3.BoolRef:
        return disj(*[conj(eq(request, k), eq(q.table_len, 0)) for k, q in enumerate(before.reqs)])

    oldest = before.batches[0]

    def samples(e) -> z3.BoolRef:
        return conj(neg(eq(e.fate, SUPERSEDED)), e.samples)

    samples_of_aborted = disj(*[conj(lt(j, oldest.length), eq(e.req, first_request), samples(e))
                                for j, e in enumerate(oldest.entries)])
    oldest_samples = disj(*[conj(lt(j, oldest.length), samples(e)) for j, e in enumerate(oldest.entries)])
    pool_kept = conj(*[x == y for (_, x), (_, y) in zip(leaves(middle.pool), leaves(after.pool))])
    return disj(
        conj(eq(first_action, ABORT), eq(second_action, ARRIVE)),
        conj(eq(first_action, COMPLETE), eq(second_action, ARRIVE)),
        conj(eq(first_action, ABORT), eq(second_action, ABORT), lt(second_request, first_request),
             disj(holds_no_block(first_request), holds_no_block(second_request))),
        conj(eq(first_action, ABORT), eq(second_action, COMPLETE), neg(samples_of_aborted), pool_kept),
        conj(eq(first_action, SCHEDULE), eq(second_action, ARRIVE),
             disj(lt(0, middle.waiting_len), le(layout.cfg.max_num_seqs, middle.running_len))),
        conj(eq(first_action, COMPLETE), eq(second_action, SCHEDULE), layout.cfg.continue_prefill,
             lt(before.num_batches, layout.K), neg(oldest_samples)))


def peephole(system: System, first: Step, second: Step) -> z3.BoolRef:
    """Steps i, i+1 are not in an order the rules drop."""
    chosen_first, chosen_second = first.choices, second.choices
    pair = StepPair(chosen_first.act, chosen_first.req, chosen_second.act, chosen_second.req,
                    first.before, first.after, second.after)
    return system.build(lambda layout: neg(forbidden(layout, pair)))
