"""LoRA's `max_loras` cap and the prompt-logprobs limit on the prefix cache
(spec/lora.py) in the Z3 encoding.

Neither needs a variable: a request's LoRA and its prompt-logprobs flag are
constants of its prompt (`Prompt.lora`, `Prompt.prompt_logprobs`), given at
arrival like its prompt length (spec.lora.arrive_with_lora keeps the LoRA
only with a cap, the flag only with `Config.prompt_logprobs` and prefix
caching), so the frame is the frame without them and only the waiting loop
changes (encoding/schedule.py's `_waiting_step`, two hooks):

* `passed_over`: spec.lora.held_by_lora_cap on the loop's request, the
  running requests of the batch in progress being the holders (`running`
  grows with each admission, as vLLM's `scheduled_loras.add` does). The
  request is skipped: it keeps its place, the loop goes on (the skip of a
  deferred resumption);
* `cache_read_limit`: a prompt-logprobs request's hit may hold no block,
  so it is empty (spec.schedule._prefix_hit).

The LoRA's part of the block hash is the model's labels (spec/lora.py):
nothing to encode. A model without a cap and without prompt logprobs gets
the same formulas as before: every hook is the identity there.

What is left out is refused (`refuse_unencoded_lora`): the cap or the limit
beside a KV connector (the spec models neither with one), streaming
sessions, structured output, the priority policy, reset and pause and the
prefill cadence (none cross-checked with them; the explicit search has no
model of them together either).
"""

from __future__ import annotations

from typing import Any

import z3
from flightcheck.spec import Status
from flightcheck.verification.z3.encoding.kv_state import NotRepresentable
from flightcheck.verification.z3.encoding.terms import V, conj, count, disj, eq, ite, lt, neg

NEW = 0         # state.NEW (state.py imports this module)


def has_lora_cap(layout) -> bool:
    """Whether the model has a `LoRAConfig` (`Config.max_loras` > 0)."""
    return layout.cfg.max_loras > 0


def refuse_unencoded_lora(model) -> None:
    """The combinations the encoding of the cap and the limit leaves to the
    explicit search (or that no model has): a model that needs one is refused."""
    cfg = model.cfg
    if not (cfg.max_loras > 0 or cfg.prompt_logprobs):
        return
    why = [name for name, on in (("a KV connector", cfg.kv_connector is not None),
                                 ("streaming sessions", cfg.streaming_sessions),
                                 ("structured output", cfg.structured_output),
                                 ("the priority policy", cfg.scheduling_policy == "priority"),
                                 ("reset and pause", cfg.reset_and_pause),
                                 ("the prefill cadence", cfg.prefill_schedule_interval > 1)) if on]
    if why:
        raise ValueError(f"model {model.name}: the Z3 encoding of the LoRA cap and of prompt logprobs leaves "
                         f"out {'; '.join(why)}; the explicit search covers what the spec models of them")


# --- each request's constants


def lora_of(layout, r: int, arrived: bool) -> int:
    """Request r's `Request.lora`: its prompt's once arrived under a cap, else 0."""
    return layout.model.prompts[r].lora if arrived and has_lora_cap(layout) else 0


def asks_prompt_logprobs(layout, r: int, arrived: bool) -> bool:
    """Request r's `Request.prompt_logprobs` (spec.lora.arrive_with_lora)."""
    cfg = layout.cfg
    return arrived and layout.model.prompts[r].prompt_logprobs and cfg.prompt_logprobs and cfg.prefix_caching


def lora_request_fields(layout, r: int, arrived: bool) -> dict:
    """Request r's LoRA and prompt-logprobs flag as decoded."""
    return dict(lora=lora_of(layout, r, arrived), prompt_logprobs=asks_prompt_logprobs(layout, r, arrived))


def refuse_other_lora(layout, r: int, q) -> None:
    """A concrete request whose LoRA or flag is not its model prompt's cannot be held."""
    if lora_request_fields(layout, r, q.status is not Status.NEW) != dict(lora=q.lora,
                                                                          prompt_logprobs=q.prompt_logprobs):
        raise NotRepresentable(f"request {r} has a LoRA or prompt-logprobs flag other than its model prompt's")


def loras(layout) -> tuple[int, ...]:
    """The model's LoRAs (ids > 0), in order."""
    return tuple(sorted({p.lora for p in layout.model.prompts if p.lora > 0}))


def _of_lora(layout, lora: int) -> list[int]:
    return [r for r, p in enumerate(layout.model.prompts) if p.lora == lora]


def holds_lora(layout, s, lora: int, holder: Any) -> Any:
    """Request `holder` (a term) holds `lora` in frame s (it has arrived: a
    NEW request's `Request.lora` is 0)."""
    return disj(*[conj(eq(holder, r), neg(eq(s.reqs[r].status, NEW))) for r in _of_lora(layout, lora)])


def among(layout, s, lora: int, holders: list, length: Any) -> Any:
    """One of the first `length` of `holders` holds `lora` (it is in spec.lora.loras_of)."""
    return disj(*[conj(lt(j, length), holds_lora(layout, s, lora, h)) for j, h in enumerate(holders)])


def lora_count(layout, s, holders: list, length: Any) -> Any:
    """How many distinct LoRAs the first `length` of `holders` hold (len(spec.lora.loras_of))."""
    return count(among(layout, s, lora, holders, length) for lora in loras(layout))


def held_by_cap(layout, s, r: Any, holders: list, length: Any) -> Any:
    """spec.lora.held_by_lora_cap: r needs a LoRA the holders lack while they
    already hold `max_loras` (False without a cap)."""
    if not has_lora_cap(layout):
        return z3.BoolVal(False)
    full = eq(lora_count(layout, s, holders, length), layout.cfg.max_loras)
    return conj(full, disj(*[conj(holds_lora(layout, s, lora, r), neg(among(layout, s, lora, holders, length)))
                             for lora in loras(layout)]))


# --- the waiting loop's hooks (encoding/schedule.py)


def _held(layout, acc, r: Any) -> Any:
    st = acc.state
    if layout.is_mutant("lora_no_admission_cap_issue14495"):            # no test at admission
        return z3.BoolVal(False)
    if layout.is_mutant("lora_cap_counts_scheduled_running_v0_8_5"):   # the step's entries hold the LoRAs
        return held_by_cap(layout, st, r, [e.req for e in acc.entries], acc.count)
    return held_by_cap(layout, st, r, st.running, st.running_len)


def passed_over(layout, acc, r: Any) -> Any:
    """The waiting loop passes r over for the cap (a skip: r keeps its place)."""
    if layout.is_mutant("lora_cap_stops_admission_pr15422"):
        return z3.BoolVal(False)
    return _held(layout, acc, r)


def stops_admission(layout, acc, r: Any) -> Any:
    """Under lora_cap_stops_admission_pr15422 the cap stops the loop instead (else False)."""
    if not layout.is_mutant("lora_cap_stops_admission_pr15422"):
        return z3.BoolVal(False)
    return _held(layout, acc, r)


def reads_prefix_cache(layout, s, r: Any) -> Any:
    """spec.lora.reads_prefix_cache: r does not ask for prompt logprobs."""
    asking = [x for x in range(layout.N) if asks_prompt_logprobs(layout, x, True)]
    return neg(disj(*[conj(eq(r, x), neg(eq(s.reqs[x].status, NEW))) for x in asking]))


def cache_read_limit(layout, s, r: Any, max_blocks: Any) -> Any:
    """The most blocks r's prefix hit may hold: none for a prompt-logprobs
    request (`max_blocks` itself without prompt logprobs, or under the mutant)."""
    if not layout.cfg.prompt_logprobs or layout.is_mutant("prompt_logprobs_read_prefix_cache_issue3251"):
        return max_blocks
    return ite(reads_prefix_cache(layout, s, r), max_blocks, V(0))
