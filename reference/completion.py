"""What a completed batch entry does to its request (the body of
`update_from_output`, entry by entry).

* `Fate`: the entry's output is bound to the incarnation it was scheduled
  for: *live* (still that incarnation), *orphaned* (preempted since, not
  rescheduled) or *superseded* (rescheduled, aborted or finished since);
  the scheduler's `_fate` step decides which.
* `count_rejected`: how many of the entry's scheduled drafts the model
  rejected (the scheduler's `_subtract_rejections` takes them back from a
  live entry's counter; an orphaned entry leaves the counter alone:
  preemption reset it, and the recompute after resumption includes the
  tokens appended here).
* `append_sampled`: a live or orphaned entry's sampled tokens are appended
  one by one with vLLM's stop check after each; a live entry also takes the
  drafts proposed for its next step.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from .config import SchedulerConfig
from .outputs import EngineCoreOutput, RequestData
from .request import Request, RequestStatus


class Fate(str, enum.Enum):
    """What becomes of a batch entry's output (docs/design.md §"Entry fates")."""

    LIVE = "live"              # the request is still the incarnation it was scheduled for
    ORPHANED = "orphaned"      # preempted since, not rescheduled: tokens kept, counter untouched
    SUPERSEDED = "superseded"  # rescheduled, aborted or finished since: tokens dropped


# The per-entry code compares with these module names, not `Fate.LIVE`: on
# Python 3.11 every attribute of an Enum class is looked up through
# `EnumType.__getattr__`'s slow path (about 60 ns more than a global).
LIVE, ORPHANED, SUPERSEDED = Fate.LIVE, Fate.ORPHANED, Fate.SUPERSEDED


def count_rejected(request: Request, entry: RequestData, generated: list[int]) -> int:
    """Drafts of the entry the model rejected: it returns the accepted drafts
    then one bonus token, so at most drafts + 1 tokens."""
    num_drafts = len(entry.spec_token_ids)
    if len(generated) > num_drafts + 1:
        raise ValueError(f"{len(generated)} tokens returned for request {request.request_id!r}, "
                         f"which had {num_drafts} drafts scheduled (at most {num_drafts + 1})")
    return num_drafts + 1 - len(generated)


def append_sampled(request: Request, generated: list[int], fate: Fate,
                   proposed_drafts: Sequence[int] | None, config: SchedulerConfig,
                   stop_tokens_first: bool = False) -> EngineCoreOutput:
    """Append a live or orphaned entry's sampled tokens (accepted drafts, then
    the bonus token) up to the first that stops the request. `stop_tokens_first`:
    vLLM 0.33's stop check (the profile's `stop_tokens_before_length`, read
    once by the scheduler: this runs per sampled entry). `proposed_drafts`
    None: drafts do not come with the output (vLLM 0.33), those held stay."""
    # The model's list is the output's unless a stop trims it (as vLLM).
    new_token_ids = generated
    stop = check_stop_tokens_first if stop_tokens_first else check_stop
    for num_new, token_id in enumerate(generated, 1):
        request.all_token_ids.append(token_id)
        if stop(request, token_id, config.max_model_len):
            if num_new < len(generated):
                new_token_ids = generated[:num_new]   # tokens after the stop are trimmed
            break
    # Cheapest test first: most entries have no drafts either way.
    if proposed_drafts is not None and (proposed_drafts or request.spec_token_ids) \
            and fate is LIVE and not request.is_finished():
        request.spec_token_ids = tuple(proposed_drafts[:config.num_spec_tokens])
    return EngineCoreOutput(request.request_id, new_token_ids,
                            request.get_finished_reason(), request.stop_reason)


def check_stop(request: Request, token_id: int, max_model_len: int) -> bool:
    """vLLM's check_stop after each appended token: length first, then EOS
    (unless ignore_eos), then stop_token_ids."""
    num_tokens = len(request.all_token_ids)
    if (num_tokens >= max_model_len
            or num_tokens - request.num_prompt_tokens >= request.max_tokens):
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    if token_id in request.stop_token_set:
        request.status = RequestStatus.FINISHED_STOPPED
        if token_id != request.eos_token_id or request.sampling_params.ignore_eos:
            request.stop_reason = token_id     # a stop token id, not EOS
        return True
    return False


def check_stop_tokens_first(request: Request, token_id: int, max_model_len: int) -> bool:
    """vLLM 0.33's `check_stop` (v1/core/sched/utils.py): EOS (unless
    ignore_eos) and stop_token_ids first, then the length cap, so a stop
    token sampled as the last allowed token finishes as `stop`."""
    if token_id in request.stop_token_set:
        request.status = RequestStatus.FINISHED_STOPPED
        if token_id != request.eos_token_id or request.sampling_params.ignore_eos:
            request.stop_reason = token_id     # a stop token id, not EOS
        return True
    num_tokens = len(request.all_token_ids)
    if (num_tokens >= max_model_len
            or num_tokens - request.num_prompt_tokens >= request.max_tokens):
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False
