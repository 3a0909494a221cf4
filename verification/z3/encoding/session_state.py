"""Streaming sessions' part of a Z3 frame (docs/request-states.md,
"Streaming sessions"; spec/sessions.py): each request's prompt length,
max_tokens, turn and what its client still sends or has queued, the queue
`kv_holding` (sessions between turns that hold blocks) and each in-flight
entry's turn, with `encode`/`decode` for them and their well-formedness.

A frame has this part only when the model has sessions
(`sessions.has_sessions(cfg)`); every other frame is as it was, so no
state count, proof or cross-check of a model without sessions changes.

A session's inputs are its model prompt's (`Prompt.session`), fixed, so
what the client still sends (`Request.inputs_to_send`) is the last
`to_send` of them and what it queued (`queued_inputs`) the `queued` just
before those: two numbers instead of two tuples. Whether a request is
resumable is its prompt's once it has arrived, so it needs no variable.
A prompt's length and max_tokens are variables here (a session's next
input changes both); without sessions they stay the model's constants.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import z3
from flightcheck.spec import State, Status
from flightcheck.spec.sessions import has_sessions as spec_has_sessions
from flightcheck.verification.z3.encoding.kv_state import NotRepresentable
from flightcheck.verification.z3.encoding.terms import V, conj, disj, eq, ite, le, lt, var

PAD = -1


def has_sessions(layout) -> bool:
    """Whether the model has streaming sessions (the frame has an `SSessions`)."""
    return spec_has_sessions(layout.cfg)


def session_inputs(layout, k: int) -> tuple[tuple[int, int], ...]:
    """Request k's inputs after its prompt (its model prompt's `session`)."""
    return layout.model.prompts[k].session if has_sessions(layout) else ()


def is_resumable_slot(layout, k: int) -> bool:
    """Request k is a session once it arrives (spec sessions.open_session)."""
    return bool(session_inputs(layout, k))


def refuse_unencoded_sessions(model) -> None:
    """What the encoding of sessions leaves to the explicit search: a model
    that needs it is refused, never checked by a partial relation."""
    cfg = model.cfg
    if not spec_has_sessions(cfg):
        return
    why = []
    if cfg.kv_connector is not None:
        why.append("a KV connector beside sessions")
    if cfg.num_spec_tokens:
        why.append("drafts (a session's next turn admitted with padded drafts)")
    if cfg.prefix_caching:
        why.append("prefix caching beside sessions (a turn's kept outputs become prompt blocks)")
    if cfg.structured_output or cfg.reset_and_pause:
        why.append("structured output or reset and pause beside sessions")
    # the priority policy beside sessions: only where every session's priority
    # is its own (priority_state.refuse_unencoded_priority says why)
    if why:
        raise ValueError(f"model {model.name}: the Z3 encoding of streaming sessions leaves out "
                         f"{'; '.join(why)}; the explicit search covers them")


@dataclass
class SSessionReq:
    """One request's session fields (on every request of a session frame)."""

    prompt_len: Any
    max_tokens: Any
    turn: Any
    to_send: Any          # len(inputs_to_send): the last `to_send` inputs are still to come
    queued: Any           # len(queued_inputs): the `queued` inputs just before those


@dataclass
class SSessions:
    holding: list             # kv_holding, N slots
    holding_len: Any
    entry_turn: list          # [K][E] each in-flight entry's turn, parallel to the frame's batches


def session_req_frame(layout, r: int, tag: str) -> list:
    """[SSessionReq of fresh variables] for request r, or [] without sessions."""
    if not has_sessions(layout):
        return []
    return [SSessionReq(*(var(f"{f}[{r}]@{tag}") for f in ("prompt_len", "max_tokens", "turn", "to_send",
                                                           "queued")))]


def session_frame(layout, tag: str) -> list:
    """[SSessions of fresh variables], or [] without sessions."""
    if not has_sessions(layout):
        return []
    return [SSessions([var(f"holding[{i}]@{tag}") for i in range(layout.N)], var(f"holding_len@{tag}"),
                      [[var(f"b{k}.e{j}.turn@{tag}") for j in range(layout.E)] for k in range(layout.K)])]


def session_req_constant(layout, r: int, q) -> list:
    """Request r's session fields as literals ([] without sessions)."""
    inputs = session_inputs(layout, r)
    if not has_sessions(layout):
        return []
    resumable = is_resumable_slot(layout, r) and q.status is not Status.NEW
    if q.resumable != resumable:
        raise NotRepresentable(f"request {r} is {'' if q.resumable else 'not '}resumable, its model prompt says otherwise")
    to_send, queued = len(q.inputs_to_send), len(q.queued_inputs)
    end = len(inputs) - to_send
    if to_send + queued > len(inputs) or inputs[end:] != q.inputs_to_send or inputs[end - queued:end] != q.queued_inputs:
        raise NotRepresentable(f"request {r}'s inputs are not its model prompt's session")
    return [SSessionReq(V(q.prompt_len), V(q.max_tokens), V(q.turn), V(to_send), V(queued))]


def session_constant(layout, state: State) -> list:
    """The session part of a concrete state, as literals ([] without sessions)."""
    if not has_sessions(layout):
        if state.kv_holding and layout.cfg.kv_connector is None:
            raise NotRepresentable("kv_holding without a connector or sessions")
        if any(e.turn for b in state.in_flight for e in b):
            raise NotRepresentable("an entry of a later turn without sessions")
        return []
    if len(state.kv_holding) > layout.N:
        raise NotRepresentable("kv_holding too long")
    turns = []
    for k in range(layout.K):
        batch = state.in_flight[k] if k < len(state.in_flight) else ()
        turns.append([V(e.turn) for e in batch] + [V(0)] * (layout.E - len(batch)))
    holding = [V(x) for x in state.kv_holding] + [V(PAD)] * (layout.N - len(state.kv_holding))
    return [SSessions(holding, V(len(state.kv_holding)), turns)]


def session_request_fields(layout, q: list, r: int, iv) -> dict:
    """Request r's session fields decoded from a model ({} without sessions)."""
    if not q:
        return {}
    s, inputs = q[0], session_inputs(layout, r)
    to_send, queued = iv(s.to_send), iv(s.queued)
    if not (0 <= to_send and 0 <= queued and to_send + queued <= len(inputs)):
        raise NotRepresentable(f"r{r} sends {to_send} and queues {queued} of {len(inputs)} inputs")
    end = len(inputs) - to_send
    return dict(prompt_len=iv(s.prompt_len), max_tokens=iv(s.max_tokens), turn=iv(s.turn),
                inputs_to_send=inputs[end:], queued_inputs=inputs[end - queued:end])


def session_entry_fields(sess: list, k: int, j: int, iv) -> dict:
    return {} if not sess else dict(turn=iv(sess[0].entry_turn[k][j]))


def session_state_fields(sess: list, iv) -> dict:
    if not sess:
        return {}
    s = sess[0]
    return dict(kv_holding=tuple(iv(x) for x in s.holding[:iv(s.holding_len)]))


def session_well_formed(layout, s, parked: int) -> Any:
    """Every session index and length in range, every unused slot padded;
    the statuses a session frame holds (the connector's are not among them)."""
    if not s.sess:
        return z3.BoolVal(True)
    ss, P, out = s.sess[0], V(PAD), []
    for r, q in enumerate(s.reqs):
        x, n = q.session[0], len(session_inputs(layout, r))
        out += [disj(lt(q.status, 7), eq(q.status, parked)), le(0, x.prompt_len), le(0, x.max_tokens),
                le(0, x.turn), le(0, x.to_send), le(x.to_send, n), le(0, x.queued), le(x.queued, n - x.to_send)]
    out += [le(0, ss.holding_len), le(ss.holding_len, layout.N)]
    out += [ite(lt(j, ss.holding_len), conj(le(0, x), lt(x, layout.N)), eq(x, P)) for j, x in enumerate(ss.holding)]
    for k, (b, row) in enumerate(zip(s.batches, ss.entry_turn)):
        for j, t in enumerate(row):
            out.append(ite(conj(lt(k, s.num_batches), lt(j, b.length)), le(0, t), eq(t, 0)))
    return conj(out)
