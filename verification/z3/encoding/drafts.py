"""spec/drafts.py in Z3: where a request's drafts come from under the
profile (`Profile.draft_source`) and vLLM 0.33's padded admissions
(`Profile.pads_admitted_decodes`), for the schedule and completion encodings.

* "placeholders" (async): a sampling entry leaves its request k drafts
  (`placeholder_drafts`, read by schedule._launch) and a completion brings
  none (`next_drafts_cap` 0, actions.py);
* padded admissions: `pad_context` reads, once the running loop is done,
  whether it scheduled anything and whether one of those requests' previous
  schedule left it a prefill chunk (its `is_prefill_chunk` on the frame
  before the call, which the frame keeps under such a profile:
  cadence_state.has_chunk_flags, set by cadence.after_launch); `padded`
  decides an admission's padding from it;
* held drafts (vLLM 0.8.x, `Profile.held_drafts_left_uncached`): an
  allocation leaves every draft its request holds out of the blocks it
  caches (`uncached_drafts`, read by allocation.cache_full_blocks) and a
  preemption keeps them (`drafts_after_preemption`, read by schedule's
  preemption).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import z3
from flightcheck.spec.drafts import drafts_come_with_output, placeholder_drafts
from flightcheck.verification.z3.encoding.state import Layout, SState
from flightcheck.verification.z3.encoding.terms import V, conj, disj, eq, imax, le, lt, neg, pick

__all__ = ["PadContext", "drafts_after_preemption", "drafts_come_with_output", "next_drafts_cap", "pad_context",
           "padded", "placeholder_drafts", "uncached_drafts"]


def next_drafts_cap(layout: Layout, cap: int) -> int:
    """The most drafts a completion's Sample may propose (spec.actions.max_next_drafts):
    `cap` where drafts come with the output, else 0."""
    return cap if drafts_come_with_output(layout.cfg) else 0


def uncached_drafts(layout: Layout, held: Any, scheduled: Any) -> Any:
    """spec.drafts.drafts_left_uncached: the drafts an allocation leaves out
    of the blocks it caches, all those held under vLLM 0.8.x, else those scheduled."""
    return imax(held, scheduled) if layout.cfg.rules.held_drafts_left_uncached else scheduled


def drafts_after_preemption(layout: Layout, held: Any) -> Any:
    """spec.drafts.drafts_after_preemption: a preempted request keeps its
    drafts under vLLM 0.8.x, else none."""
    return held if layout.cfg.rules.held_drafts_left_uncached else V(0)


@dataclass(frozen=True)
class PadContext:
    """What the running loop of this call leaves the padding rule."""

    ran: Any                  # it scheduled some running request
    prefill_scheduled: Any    # one of those had a prefill chunk as its previous entry


def pad_context(layout: Layout, s: SState, count: Any, entries: list) -> PadContext | None:
    """None unless the profile pads admissions and k > 0. `s`: the state
    before the call; `count`, `entries`: the batch after the running loop."""
    cfg = layout.cfg
    if not cfg.rules.pads_admitted_decodes or not cfg.num_spec_tokens:
        return None
    chunk = s.cad[0].chunk                # Request.is_prefill_chunk (spec.drafts.keeps_prefill_chunk_flag)
    scheduled = [conj(lt(j, count), pick(chunk, e.req, z3.BoolVal(False))) for j, e in enumerate(entries)]
    return PadContext(lt(0, count), disj(*scheduled))


def padded(layout: Layout, ctx: PadContext, tokens: Any, hit_tokens: Any, budget: Any) -> tuple[Any, Any]:
    """spec.drafts.padded_admission for the waiting loop's candidate:
    (padded, over) -- padded to 1 + k, or stopping admission because 1 + k
    exceed the budget left."""
    cfg = layout.cfg
    size = 1 + cfg.num_spec_tokens
    pad = conj(eq(tokens - hit_tokens, 1), neg(ctx.prefill_scheduled), disj(ctx.ran, lt(0, hit_tokens)),
               le(hit_tokens + size + 1, V(cfg.max_model_len)))
    return conj(pad, le(size, budget)), conj(pad, lt(budget, V(size)))
