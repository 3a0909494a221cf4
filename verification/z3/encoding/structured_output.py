"""spec/grammar.py in Z3: structured output's actions and its hooks into
arrive, schedule and complete_oldest, on the frame part of
structured_output_state.py (docs/request-states.md, "Structured output").

* `arrive_structured`: a structured prompt arrives in
  WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR (G_WAIT) with its grammar COMPILING;
* `grammar_transitions`: the environment's `compile_grammar` and
  `fail_grammar` (action codes 4 and 5: a model with structured output has
  no connector, whose reports take the same codes);
* `blocked_on_grammar`: the waiting loop's `_handle_blocked_waiting_request`
  for the request at its position: compiled, it becomes WAITING and the loop
  goes on with it; compiling, skipped; failed, recorded and skipped;
* `launch_masks`: each entry of the new batch records the FSM position its
  bitmask is built at (`grammar.mask_of`, sync: the FSM now, or no mask);
* `advance_fsm`: an applied output advances the FSM by the tokens appended,
  or, masked at another position, is refused: the request finishes with
  FINISHED_ERROR, its grammar REJECTED;
* `after_output`: the end of `update_from_output` finishes the failed
  grammars the waiting loop recorded (`grammar_compile_error_reqs`).

Every hook is called only for a frame with structured output (`s.grammar`),
so no other model's relation changes.
"""

from __future__ import annotations

from typing import Any, Callable

import z3
from flightcheck.spec import Action
from flightcheck.spec.transitions import CompileGrammar, FailGrammar
from flightcheck.verification.z3.encoding.requests import req_at, with_req
from flightcheck.verification.z3.encoding.state import F_ERROR, G_WAIT, PREEMPTED, RUNNING, WAITING
from flightcheck.verification.z3.encoding.structured_output_state import (
    G_COMPILING,
    G_FAILED,
    G_NONE,
    G_READY,
    G_REJECTED,
    NO_MASK,
    SGrammar,
    structured,
)
from flightcheck.verification.z3.encoding.terms import V, clone, conj, disj, eq, ite, le, lt, neg, pick, put

# The action codes of the grammar backend's events (after spec actions 0-3).
COMPILE, FAIL = 4, 5


def _with(g: SGrammar, **fields: Any) -> SGrammar:
    return SGrammar(**{**{f: getattr(g, f) for f in ("grammar", "fsm", "errors", "masks")}, **fields})


def _set_grammar(st, g: SGrammar):
    out = clone(st)
    out.grammar = [g]
    return out


def arrive_structured(layout, st, r: Any) -> Any:
    """grammar.arrive_structured on `arrive`'s effect: request r (a term)
    waits for its grammar if its prompt asks for structured output."""
    asks = pick([z3.BoolVal(structured(layout, k)) for k in range(layout.N)], r)
    st = with_req(st, r, asks, status=V(G_WAIT))
    g = st.grammar[0]
    return _set_grammar(st, _with(g, grammar=put(g.grammar, r, V(G_COMPILING), asks)))


def _active(layout, status: Any) -> Any:
    """spec Status.is_active in a frame with structured output (actions.is_active(grammar=True))."""
    return disj(eq(status, WAITING), eq(status, RUNNING), eq(status, PREEMPTED), eq(status, G_WAIT))


def grammar_transitions(layout, s, ch) -> tuple[list, list, list]:
    """compile_grammar and fail_grammar of request `ch.req`: guards, effects,
    and the choices' legality (none beyond the request's range)."""
    g = s.grammar[0]
    r = ch.req
    in_range = conj(le(0, r), lt(r, layout.N))
    compiling = conj(in_range, eq(pick(g.grammar, r, V(G_NONE)), G_COMPILING),
                     _active(layout, pick([q.status for q in s.reqs], r)))
    effects = [_set_grammar(s, _with(g, grammar=put(g.grammar, r, V(to)))) for to in (G_READY, G_FAILED)]
    return [compiling, compiling], effects, []


def grammar_action(act: int, r: int) -> Action:
    """The spec action of a grammar event's code."""
    if act == COMPILE:
        return CompileGrammar(r)
    if act == FAIL:
        return FailGrammar(r)
    raise ValueError(f"action code {act} is no grammar event")


def blocked_on_grammar(layout, st, r: Any, active: Any) -> tuple[Any, Any]:
    """grammar.blocked_on_grammar for the request r at the waiting loop's
    position (when the loop is `active`): the state after it, and whether r
    is skipped."""
    g = st.grammar[0]
    waits = conj(active, eq(req_at(st, r).status, G_WAIT))
    code = pick(g.grammar, r, V(G_NONE))
    ready = eq(code, G_READY)
    if layout.is_mutant("compiling_grammar_scheduled"):
        ready = disj(ready, eq(code, G_COMPILING))
    out = with_req(st, r, conj(waits, ready), status=V(WAITING))
    failed = conj(waits, neg(ready), eq(code, G_FAILED))
    out = _set_grammar(out, _with(g, errors=put(g.errors, r, z3.BoolVal(True), failed)))
    return out, conj(waits, neg(ready))


def launch_masks(layout, st, acc, put_batch: Any) -> Any:
    """The masks of the batch `_launch` puts at slot `st.num_batches`
    (grammar.mask_of under sync scheduling: the FSM's position now for a
    sampling entry of a request whose grammar is READY, else no mask)."""
    g = st.grammar[0]
    row = []
    for j, e in enumerate(acc.entries):
        masked = conj(lt(j, acc.count), e.samples, eq(pick(g.grammar, e.req, V(G_NONE)), G_READY))
        row.append(ite(masked, pick(g.fsm, e.req, V(0)), V(NO_MASK)))
    masks = [[ite(conj(put_batch, eq(st.num_batches, k)), m, old) for m, old in zip(row, slot)]
             for k, slot in enumerate(g.masks)]
    return _set_grammar(st, _with(g, masks=masks))


def shift_masks(layout, st) -> Any:
    """complete_oldest drops the oldest batch: its masks go with it."""
    g = st.grammar[0]
    return _set_grammar(st, _with(g, masks=[list(m) for m in g.masks[1:]] + [[V(NO_MASK)] * layout.E]))


def advance_fsm(st, applied, r: Any, appended: Any, mask: Any) -> tuple[Any, Any]:
    """grammar.advance_fsm on the output applied to r (`appended` tokens,
    under `mask`), as `_apply_sample` calls it: the state with r's grammar
    and FSM updated, and whether the FSM refused (r is then finished with
    FINISHED_ERROR)."""
    g = st.grammar[0]
    code, fsm = pick(g.grammar, r, V(G_NONE)), pick(g.fsm, r, V(0))
    advances = conj(eq(code, G_READY), lt(0, appended))
    refused = conj(advances, neg(eq(mask, fsm)))
    new = _with(applied.grammar[0], grammar=put(g.grammar, r, V(G_REJECTED), refused),
                fsm=put(g.fsm, r, fsm + appended, conj(advances, neg(refused))))
    return _set_grammar(applied, new), refused


def after_output(layout, st, finish: Callable[..., Any]) -> Any:
    """actions.after_output (sync): each recorded failed grammar whose
    request is unfinished finishes with FINISHED_ERROR (by `finish`,
    actions.finish), in request order, and the record is cleared."""
    for r in range(layout.N):
        errored = conj(st.grammar[0].errors[r], _active(layout, st.reqs[r].status))
        st = finish(layout, st, V(r), V(F_ERROR), errored)
    return _set_grammar(st, _with(st.grammar[0], errors=[z3.BoolVal(False)] * layout.N))
