"""The spec's actions besides `schedule`: `arrive`, `complete_oldest`, `abort`.

Each action is a function of the state, the configuration and the
environment's choices; guards come first and a disabled action returns None.

`complete_oldest` consumes the head of the in-flight FIFO (batches complete
in the order they were scheduled: every pipeline stage runs them FIFO). Each
entry's output is applied according to its fate:
* LIVE: sampled tokens appended, spec-decode rejections subtracted from
  num_computed, stop conditions checked after each token;
* ORPHANED (request preempted after this batch was scheduled, not since
  rescheduled): tokens appended, num_computed untouched (the recompute after
  resumption includes them), the request may finish while PREEMPTED;
* SUPERSEDED: dropped.

Abstracted away: token values (the environment says only whether and where a
stop token was sampled), logprobs, stop strings (the front end turns them
into aborts, which `abort` covers), and the detokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import blocks
from .config import Config
from .schedule import Scheduled, schedule  # noqa: F401  (re-exported: the fourth action)
from .state import Entry, Fate, State, Status, retire_entries


@dataclass(frozen=True)
class Prompt:
    """An arrival's prompt, chosen by the environment."""

    prompt_len: int
    max_tokens: int
    labels: tuple[int, ...] = ()   # one content label per full block; shared prefix = shared labels


@dataclass(frozen=True)
class Sample:
    """What the model returns for one entry that samples (environment's choice)."""

    num_accepted: int = 0          # drafts accepted (0..entry.drafts)
    stop_at: int | None = None     # index among the generated tokens of a stop token
    next_drafts: int = 0           # drafts proposed for the request's next step (0..k)


def arrive(state: State, cfg: Config, r: int, prompt: Prompt) -> State | None:
    """Request r arrives and joins the tail of `waiting`."""
    if not (0 <= r < len(state.requests)) or state.requests[r].status is not Status.NEW:
        return None
    if not (1 <= prompt.prompt_len < cfg.max_model_len) or prompt.max_tokens < 1:
        return None
    labels = prompt.labels if cfg.prefix_caching else ()
    if cfg.prefix_caching and len(labels) != prompt.prompt_len // cfg.block_size:
        return None
    if len(set(labels)) != len(labels):
        return None      # chained block hashes never repeat within a prompt (a repeat would break S9)
    state = replace(state, waiting=state.waiting + (r,))
    return state.with_request(r, status=Status.WAITING, prompt_len=prompt.prompt_len,
                              max_tokens=prompt.max_tokens, prompt_labels=labels, num_computed=0)


def abort(state: State, cfg: Config, r: int) -> State | None:
    """Request r is aborted, whatever it is doing (in flight included)."""
    if not (0 <= r < len(state.requests)) or not state.requests[r].status.is_active:
        return None
    return _finish(state, cfg, r, Status.FINISHED_ABORTED)


def entry_samples(state: State, cfg: Config, e: Entry) -> bool:
    """Whether the model returns tokens for e: decided by the snapshot."""
    return e.samples


def sampling_entries(state: State, cfg: Config) -> list[Entry]:
    """The entries of the oldest batch whose tokens will be applied, in order:
    `complete_oldest` takes one `Sample` for each."""
    if not state.in_flight:
        return []
    return [e for e in state.in_flight[0]
            if e.fate is not Fate.SUPERSEDED and entry_samples(state, cfg, e)]


def max_next_drafts(cfg: Config) -> int:
    """The most drafts the drafter proposes for a request's next step: k."""
    return cfg.num_spec_tokens


def is_valid_sample(cfg: Config, e: Entry, s: Sample) -> bool:
    return (0 <= s.num_accepted <= e.drafts
            and (s.stop_at is None or 0 <= s.stop_at <= s.num_accepted)
            and 0 <= s.next_drafts <= max_next_drafts(cfg))


def is_complete_enabled(state: State) -> bool:
    """A batch is in flight: the oldest one can return, whatever its entries' fates."""
    return bool(state.in_flight)


def complete_oldest(state: State, cfg: Config, samples: tuple[Sample, ...],
                    dropped: frozenset[int] = frozenset()) -> State | None:
    """The oldest in-flight batch returns; its entries' outputs are applied in order.

    `dropped`: requests whose ORPHANED entries the scheduler drops instead of
    applying (vLLM 0.8.5 does; wasteful but safe). Only trace validation uses
    it; the model checkers explore the rule that applies them."""
    if not can_complete_oldest(state, cfg, samples):
        return None
    batch = state.in_flight[0]
    flags = [e.fate is not Fate.SUPERSEDED and entry_samples(state, cfg, e) for e in batch]
    remaining = iter(samples)
    state = replace(state, in_flight=state.in_flight[1:])
    for e, samples_here in zip(batch, flags):
        if e.fate is Fate.SUPERSEDED:
            continue
        if e.fate is Fate.LIVE:
            state = _settle_live(state, cfg, e)
        if samples_here:
            sample = next(remaining)
            if not (e.fate is Fate.ORPHANED and e.req in dropped):
                state = _apply_sample(state, cfg, e, sample, e.fate)
    return state


def can_complete_oldest(state: State, cfg: Config, samples: tuple[Sample, ...]) -> bool:
    """complete_oldest's guard (the rest of it always succeeds): a batch is in
    flight, and `samples` holds one valid sample per entry that samples."""
    if not is_complete_enabled(state):
        return False
    sampling = sampling_entries(state, cfg)
    return len(samples) == len(sampling) and all(is_valid_sample(cfg, e, s) for e, s in zip(sampling, samples))


def _settle_live(state: State, cfg: Config, e: Entry) -> State:
    """Bookkeeping every live entry gets, whether or not it sampled."""
    if not cfg.continue_prefill:
        state = replace(state, scheduled_ids=state.scheduled_ids - {e.req})
    return state


def _apply_sample(state: State, cfg: Config, e: Entry, s: Sample, fate: Fate) -> State:
    r = e.req
    req = state.requests[r]
    if _subtracts_rejections(fate):
        req = replace(req, num_computed=req.num_computed - (e.drafts - s.num_accepted))
    finish: Status | None = None
    for j in range(s.num_accepted + 1):
        req = replace(req, num_output=req.num_output + 1)
        finish = _stop_reason(cfg, req, j, s)
        if finish is not None:
            break
    if finish is not None:
        state = state.with_request(r, num_output=req.num_output, num_computed=req.num_computed)
        return _finish(state, cfg, r, finish)
    if fate is Fate.LIVE:
        req = replace(req, num_drafts=s.next_drafts)       # the drafts proposed for its next step
    return state.with_request(r, num_output=req.num_output, num_computed=req.num_computed,
                              num_drafts=req.num_drafts)


def _subtracts_rejections(fate: Fate) -> bool:
    """Rejected drafts were counted in num_computed at schedule time: a live
    entry takes them back. An orphan's request was reset to 0 by preemption,
    so it has nothing to take back."""
    return fate is Fate.LIVE


def _stop_reason(cfg: Config, req, j: int, s: Sample) -> Status | None:
    """vLLM's check_stop, after each appended token: 0.8.x tests the length
    cap first, then stop tokens; 0.33 (`Profile.stop_tokens_before_length`)
    tests EOS and the stop ids first."""
    if cfg.rules.stop_tokens_before_length and s.stop_at == j:
        return Status.FINISHED_STOPPED
    if req.num_tokens >= cfg.max_model_len:
        return Status.FINISHED_LENGTH
    if req.num_output >= req.max_tokens:
        return Status.FINISHED_LENGTH
    if s.stop_at == j:
        return Status.FINISHED_STOPPED
    return None


def _finish(state: State, cfg: Config, r: int, status: Status) -> State:
    """Finish or abort r: out of every queue, blocks freed, in-flight work superseded."""
    req = state.requests[r]
    state = replace(state, pool=blocks.free_table(state.pool, req.block_table, cfg.release_order,
                                                  cfg.rules.unhashed_blocks_to_head),
                    waiting=tuple(x for x in state.waiting if x != r),
                    running=tuple(x for x in state.running if x != r),
                    scheduled_ids=state.scheduled_ids - {r})
    state = retire_entries(state, r, frozenset({Fate.LIVE, Fate.ORPHANED}), Fate.SUPERSEDED)
    return state.with_request(r, status=status, num_computed=0, num_drafts=0, block_table=())
