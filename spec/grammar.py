"""Structured output: a request's grammar and its FSM, with batches in flight
(docs/request-states.md, "Structured output").

vLLM 0.33 and 0.34 (`vllm/v1/core/sched/scheduler.py`,
`vllm/v1/structured_output/`): a request with structured output arrives in
`WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR` while its grammar compiles in the
background; the waiting loop skips it until the grammar is there
(`_handle_blocked_waiting_request`), a grammar that failed to compile is
recorded (`grammar_compile_error_reqs`) and the request finished with
FINISHED_ERROR at the end of the next `update_from_output`. Each sampling
entry of a structured request samples under a bitmask built from the FSM
(`get_grammar_bitmask`); the tokens an output brings advance the FSM
(`StructuredOutputManager.accept_tokens` in `update_from_output`), and a
token the FSM refuses ("Failed to advance FSM") finishes the request with
FINISHED_ERROR. Under async scheduling an entry of a request whose earlier
output is still in flight (`num_output_placeholders > 0`) cannot have its
bitmask built at once: the engine defers the batch's sampling until the
oldest batch's output is processed (`pending_structured_output_tokens`,
`EngineCore.step_with_batch_queue`).

The abstraction:
* the FSM is a counter, `Request.fsm`: the tokens it has accepted. A bitmask
  is the FSM position it was built at (`Entry.mask`); the token an entry
  samples is legal iff its mask was built at the position the FSM is at when
  the output is applied (a mask built from a stale FSM allows tokens the FSM
  then refuses: vLLM #29379).
* a draft's legality is the environment's choice, made when the output
  returns (`Sample.illegal_from`: the first draft the grammar refuses); the
  verifier never accepts it (0.33: the scheduler pads it to -1 in
  `update_draft_token_ids_in_output`; 0.34: the sampler's grammar bitmask
  over the draft positions rejects it). Where no illegal draft reaches a
  batch (`illegal_drafts_scheduled`: 0.33 sync, whose
  `update_draft_token_ids` cuts the drafts to their grammar-valid prefix,
  `Profile.scheduler_validates_drafts`) there is nothing to choose.
* compile time is the environment's: `compile_grammar` and `fail_grammar`
  may happen between any two actions.

Abstracted away: token ids and the grammar itself (only positions matter),
reasoning parsers (`should_advance`), jump-forward decoding, the bitmask's
rows past the first illegal draft, and the backends.
"""

from __future__ import annotations

from dataclasses import replace

from .config import Config
from .state import Entry, Grammar, Request, State, Status, evolve


# The mask of an entry whose bitmask is deferred until the oldest batch's
# output is processed (`pending_structured_output_tokens`).
DEFERRED = -1


def arrive_structured(state: State, cfg: Config, r: int, structured: bool) -> State:
    """`EngineCore.add_request` -> `grammar_init`: a structured request waits
    for its grammar (`WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR`) in `waiting`.
    Without `Config.structured_output` the prompt's flag is ignored."""
    if not (cfg.structured_output and structured):
        return state
    return state.with_request(r, status=Status.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR, grammar=Grammar.COMPILING)


def compile_grammar(state: State, cfg: Config, r: int) -> State | None:
    """The environment: r's grammar compiled (the background future's result set)."""
    if not cfg.structured_output or not (0 <= r < len(state.requests)):
        return None
    q = state.requests[r]
    if q.grammar is not Grammar.COMPILING or not q.status.is_active:
        return None
    return state.with_request(r, grammar=Grammar.READY)


def fail_grammar(state: State, cfg: Config, r: int) -> State | None:
    """The environment: r's grammar failed to compile (the future raised)."""
    if not cfg.structured_output or not (0 <= r < len(state.requests)):
        return None
    q = state.requests[r]
    if q.grammar is not Grammar.COMPILING or not q.status.is_active:
        return None
    return state.with_request(r, grammar=Grammar.FAILED)


def blocked_on_grammar(state: State, r: int) -> tuple[State, bool]:
    """`_handle_blocked_waiting_request` for a request waiting for its
    grammar: compiled, it becomes WAITING and the loop goes on with it
    (False); still compiling, it is skipped (True); failed, it is recorded
    in `grammar_errors` (finished by the next completion) and skipped."""
    q = state.requests[r]
    if q.status is not Status.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR:
        return state, False
    if q.grammar is Grammar.READY:
        return state.with_request(r, status=Status.WAITING), False
    if q.grammar is Grammar.FAILED:
        return replace(state, grammar_errors=state.grammar_errors | {r}), True
    return state, True


def mask_of(state: State, cfg: Config, r: int, samples: bool, drafts: int) -> int | None:
    """The bitmask r's new entry (`drafts` drafts, already counted in r's
    placeholders under async scheduling) samples under: None where nothing
    is masked (no structured output, or a prefill chunk: `get_grammar_bitmask`
    skips `is_prefill_chunk`); DEFERRED while an earlier output of r is still
    in flight (`AsyncScheduler._update_after_schedule`:
    `pending_structured_output_tokens`, placeholders beyond this entry's own);
    else the FSM's position now."""
    q = state.requests[r]
    if not samples or q.grammar is not Grammar.READY:
        return None
    own = 1 + drafts if cfg.rules.output_placeholders else 0
    if q.placeholders - own > 0:
        return DEFERRED
    return q.fsm


def mask_pending(state: State) -> bool:
    """A batch's sampling waits for its bitmask: the engine processes the
    oldest output before it schedules again (`step_with_batch_queue`)."""
    return any(e.mask == DEFERRED for batch in state.in_flight for e in batch)


def build_deferred_masks(state: State) -> State:
    """After the oldest batch's output is processed, the deferred batch's
    bitmask is built from the FSM as it now stands (`get_grammar_bitmask` on
    the deferred scheduler output)."""
    if not mask_pending(state):
        return state
    def built(e: Entry) -> Entry:
        return replace(e, mask=state.requests[e.req].fsm) if e.mask == DEFERRED else e
    return replace(state, in_flight=tuple(tuple(built(e) for e in b) for b in state.in_flight))


def verifier_accepts(cfg: Config, e: Entry, num_accepted: int, illegal_from: int | None) -> bool:
    """The environment's verifier never accepts an illegal draft (a -1 slot,
    or one the sampler's bitmask rejects); and where the profile never
    schedules one there is no illegal draft to report."""
    if illegal_from is None:
        return True
    if not illegal_drafts_scheduled(cfg) or not 0 <= illegal_from < e.drafts:
        return False
    return num_accepted <= illegal_from


def illegal_drafts_scheduled(cfg: Config) -> bool:
    """Whether a grammar-illegal draft may reach a batch
    (`Profile.scheduler_validates_drafts`): 0.34 always; 0.33 only under async
    scheduling, as a -1 slot."""
    return cfg.structured_output and (not cfg.rules.scheduler_validates_drafts or cfg.rules.output_placeholders)


def fsm_accepts(e: Entry, fsm: int, num_accepted: int, illegal_from: int | None) -> bool:
    """`accept_tokens` on the tokens e's output brings: the sampled token is
    legal iff e's mask was built at the FSM's position now; accepted drafts
    iff none of them is illegal."""
    if e.mask != fsm:
        return False
    return illegal_from is None or num_accepted <= illegal_from


def advance_fsm(before: Request, after: Request, e: Entry, num_accepted: int,
                illegal_from: int | None) -> Request:
    """`update_from_output`: the tokens appended to the request (`after`
    less `before`, after a stop's trim) advance its FSM; a token the FSM
    refuses leaves it REJECTED (the caller finishes it with FINISHED_ERROR)."""
    appended = after.num_output - before.num_output
    if after.grammar is not Grammar.READY or appended == 0:
        return after
    if not fsm_accepts(e, after.fsm, num_accepted, illegal_from):
        return evolve(after, grammar=Grammar.REJECTED)
    return evolve(after, fsm=after.fsm + appended)


def grammar_compiling(state: State) -> bool:
    """An unfinished request's grammar still compiles."""
    return any(q.grammar is Grammar.COMPILING and q.status.is_active for q in state.requests)


def errored_requests(state: State) -> list[int]:
    """Requests `update_from_output` finishes with FINISHED_ERROR at its end:
    the failed grammars the waiting loop recorded, still unfinished."""
    return [r for r in sorted(state.grammar_errors) if state.requests[r].status.is_active]


def g1_no_run_while_compiling(s: State, cfg: Config) -> bool:
    """G1: a request never runs while its grammar is compiling or failed: it has no live entry in flight, no table, no computed token, and is not RUNNING."""
    for r, q in enumerate(s.requests):
        if q.grammar in (Grammar.COMPILING, Grammar.FAILED) and q.status.is_active:
            if q.status is Status.RUNNING or q.num_computed or q.block_table or s.entries_of(r):
                return False
        if q.status is Status.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR and r not in s.waiting_set:
            return False
    return True


def g2_fsm_tracks_output(s: State, cfg: Config) -> bool:
    """G2: a structured request's FSM has advanced by exactly its accepted output tokens (never by a dropped or stale-and-discarded output, never past a rejected draft), and not at all before its grammar compiled (a streaming session's: since its turn began)."""
    for q in s.requests:
        if q.grammar is Grammar.READY and q.fsm != q.num_output:
            return False
        if q.grammar in (Grammar.COMPILING, Grammar.FAILED) and (q.fsm or q.num_output):
            return False
    return True


def g3_fsm_never_refuses(s: State, cfg: Config) -> bool:
    """G3: the FSM never refuses a token ("Failed to advance FSM"): every sampled token was masked at the FSM's position and no grammar-illegal draft is ever accepted."""
    return all(q.grammar is not Grammar.REJECTED for q in s.requests)
