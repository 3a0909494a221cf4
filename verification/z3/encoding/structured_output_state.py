"""Structured output's part of a Z3 frame (spec/grammar.py; docs/request-states.md,
"Structured output"): each request's grammar and FSM position (spec Request
`grammar`, `fsm`), State's `grammar_errors` (vLLM's
`grammar_compile_error_reqs`, one flag per request) and each in-flight
entry's bitmask position (`Entry.mask`), with `encode`/`decode` for them and
their well-formedness.

A frame has this part only when the model's configuration turns structured
output on (`Config.structured_output`); every other frame is as it was, so
no state count, proof or cross-check of a model without it changes.

What the encoding leaves out (refuse_unencoded_grammar): asynchronous
scheduling, whose bitmasks are deferred while an earlier output is in
flight (`grammar.DEFERRED`, `mask_pending`, `build_deferred_masks`), and
drafts, whose legality the environment chooses (`Sample.illegal_from`).
So vLLM #29379 and #49694, which need both, are the explicit search's
(verification/grammar_models.py, GRAMMAR_SPEC_K1); a model with either is
refused, never checked by a partial relation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import z3
from flightcheck.spec import State
from flightcheck.spec.grammar import DEFERRED
from flightcheck.spec.state import Grammar
from flightcheck.verification.z3.encoding.kv_state import NotRepresentable
from flightcheck.verification.z3.encoding.terms import V, conj, eq, ite, le, lt, var

GRAMMAR: tuple[Grammar, ...] = (Grammar.NONE, Grammar.COMPILING, Grammar.READY, Grammar.FAILED, Grammar.REJECTED)
G_NONE, G_COMPILING, G_READY, G_FAILED, G_REJECTED = range(5)
# An entry's mask: the FSM position it was built at, or no mask (spec None).
# DEFERRED (spec grammar.DEFERRED, -1) never occurs: async scheduling is refused.
NO_MASK = -2
assert NO_MASK != DEFERRED


def has_grammar(layout) -> bool:
    """Whether the model turns structured output on (the frame has an `SGrammar`)."""
    return layout.cfg.structured_output


def structured(layout, r: int) -> bool:
    """Request r's prompt asks for structured output (and the model has it)."""
    return has_grammar(layout) and layout.model.prompts[r].structured


def refuse_unencoded_grammar(model) -> None:
    """What the encoding of structured output leaves to the explicit search:
    a model that needs it is refused, never checked by a partial relation."""
    cfg = model.cfg
    if not cfg.structured_output:
        return
    why = []
    if cfg.rules.output_placeholders:
        why.append("asynchronous scheduling (deferred bitmasks: vLLM #29379)")
    if cfg.num_spec_tokens:
        why.append("drafts (grammar-illegal drafts: vLLM #49694)")
    if cfg.reset_and_pause or cfg.kv_connector is not None:
        why.append("reset and pause or a KV connector beside it (their actions take the same codes)")
    if why:
        raise ValueError(f"model {model.name}: the Z3 encoding of structured output leaves out "
                         f"{'; '.join(why)}; the explicit search covers them (verification/grammar_models.py)")


@dataclass
class SGrammar:
    grammar: list             # GRAMMAR code per request
    fsm: list                 # Request.fsm per request
    errors: list              # Bool per request: in State.grammar_errors
    masks: list               # [K][E]: the entry's mask (NO_MASK: none)


def grammar_frame(layout, tag: str) -> list:
    """[SGrammar of fresh variables], or [] without structured output."""
    if not has_grammar(layout):
        return []
    N = layout.N
    return [SGrammar([var(f"grammar[{r}]@{tag}") for r in range(N)], [var(f"fsm[{r}]@{tag}") for r in range(N)],
                     [z3.Bool(f"grammar_error[{r}]@{tag}") for r in range(N)],
                     [[var(f"b{k}.e{j}.mask@{tag}") for j in range(layout.E)] for k in range(layout.K)])]


def _mask_code(mask: int | None) -> int:
    if mask == DEFERRED:
        raise NotRepresentable("a deferred bitmask (asynchronous scheduling is not encoded)")
    return NO_MASK if mask is None else mask


def grammar_constant(layout, state: State) -> list:
    """The structured-output part of a concrete state, as literals ([] without it)."""
    if not has_grammar(layout):
        pristine = all((q.grammar, q.fsm) == (Grammar.NONE, 0) for q in state.requests) and \
            all(e.mask is None for b in state.in_flight for e in b)
        if state.grammar_errors or not pristine:
            raise NotRepresentable("structured-output state in a model without structured output")
        return []
    for r, q in enumerate(state.requests):
        if q.grammar is not Grammar.NONE and not structured(layout, r):
            raise NotRepresentable(f"request {r} has a grammar its prompt does not ask for")
    masks = []
    for k in range(layout.K):
        batch = state.in_flight[k] if k < len(state.in_flight) else ()
        masks.append([V(_mask_code(e.mask)) for e in batch] + [V(NO_MASK)] * (layout.E - len(batch)))
    qs = state.requests
    return [SGrammar([V(GRAMMAR.index(q.grammar)) for q in qs], [V(q.fsm) for q in qs],
                     [z3.BoolVal(r in state.grammar_errors) for r in range(layout.N)], masks)]


def grammar_request_fields(g: list, r: int, iv) -> dict:
    """Request r's grammar fields decoded from a model ({} without structured output)."""
    if not g:
        return {}
    code = iv(g[0].grammar[r])
    if not 0 <= code < len(GRAMMAR):
        raise NotRepresentable(f"r{r} grammar code {code} out of range")
    return dict(grammar=GRAMMAR[code], fsm=iv(g[0].fsm[r]))


def grammar_entry_fields(g: list, k: int, j: int, iv) -> dict:
    """Entry (k, j)'s mask decoded from a model ({} without structured output)."""
    if not g:
        return {}
    mask = iv(g[0].masks[k][j])
    return dict(mask=None if mask == NO_MASK else mask)


def grammar_state_fields(g: list, bv) -> dict:
    """State's `grammar_errors` decoded from a model ({} without structured output)."""
    if not g:
        return {}
    return dict(grammar_errors=frozenset(r for r, x in enumerate(g[0].errors) if bv(x)))


def grammar_well_formed(layout, s) -> Any:
    """Every grammar code in range, the FSM and every mask a position
    (>= 0) or NO_MASK, every unused entry slot NO_MASK, no grammar for a
    request whose prompt asks for none."""
    if not s.grammar:
        return z3.BoolVal(True)
    g, out = s.grammar[0], []
    for r in range(layout.N):
        out += [le(0, g.grammar[r]), lt(g.grammar[r], len(GRAMMAR)), le(0, g.fsm[r])]
        if not structured(layout, r):
            out += [eq(g.grammar[r], G_NONE), eq(g.fsm[r], 0), z3.Not(g.errors[r])]
    for k, (b, row) in enumerate(zip(s.batches, g.masks)):
        for j, m in enumerate(row):
            used = conj(lt(k, s.num_batches), lt(j, b.length))
            out.append(ite(used, z3.Or(eq(m, NO_MASK), le(0, m)), eq(m, NO_MASK)))
    return conj(out)
