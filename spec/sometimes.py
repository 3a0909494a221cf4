""""Sometimes" properties: states (or two-stage paths) the spec must be able
to reach. A spec whose guards are too strong passes every invariant
vacuously; these targets make that fail loudly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .blocks import cdiv
from .config import Config
from .state import State, Status

RequestPredicate = Callable[[State, Config, int], bool]


def finished_normally(s: State, cfg: Config, r: int) -> bool:
    """Request r finished by a stop token or its length cap."""
    return s.requests[r].status in (Status.FINISHED_STOPPED, Status.FINISHED_LENGTH)


def pipeline_full(s: State, cfg: Config, r: int) -> bool:
    """K batches are in flight at once."""
    return len(s.in_flight) == cfg.num_stages


def two_prefill_chunks_in_flight(s: State, cfg: Config, r: int) -> bool:
    """Request r has two live entries in flight, the older a non-final prefill chunk."""
    live = s.entries_of(r)
    return len(live) >= 2 and not live[0].samples


def preempted(s: State, cfg: Config, r: int) -> bool:
    """Request r is PREEMPTED."""
    return s.requests[r].status is Status.PREEMPTED


def running_after_preemption_then_finished(s: State, cfg: Config, r: int) -> bool:
    """Request r finished normally (reached after it was preempted)."""
    return finished_normally(s, cfg, r)


def duplicate_cached_block(s: State, cfg: Config, r: int) -> bool:
    """Two blocks cache the same label (vLLM 0.8.x keeps both copies)."""
    return bool(s.pool.duplicates)


def preallocated_block(s: State, cfg: Config, r: int) -> bool:
    """Request r holds a block beyond any its known tokens and drafts can fill (taken ahead of need)."""
    q = s.requests[r]
    return len(q.block_table) > cdiv(q.num_tokens + cfg.num_spec_tokens, cfg.block_size)


@dataclass(frozen=True)
class Sometimes:
    """Some reachable state satisfies `target` for some request; if `after` is
    given, on a path that passed through a state satisfying `after` for the
    same request first."""

    name: str
    target: RequestPredicate
    after: RequestPredicate | None = None
    needs: str | None = None          # a config feature the target needs to be meaningful

    @property
    def statement(self) -> str:
        first = f"{(self.after.__doc__ or '').strip()} and later: " if self.after else ""
        return first + (self.target.__doc__ or "").strip()

    def is_applicable(self, cfg: Config, shares_prefix: bool = False) -> bool:
        """Whether the target is meaningful for `cfg`; `shares_prefix`: the
        model's prompts share a prefix label (a duplicate needs two requests
        computing one content; callers that do not know the prompts leave it
        False and skip that target)."""
        if self.needs == "pipeline":
            return cfg.num_stages >= 2
        if self.needs == "continue_prefill":
            return cfg.num_stages >= 2 and cfg.continue_prefill
        if self.needs == "duplicate_caching":
            return cfg.prefix_caching and cfg.cache_duplicate_blocks and shares_prefix
        if self.needs == "preallocation":
            return cfg.num_preallocate_tokens > 0
        return True


SOMETIMES: tuple[Sometimes, ...] = (
    Sometimes("request_can_finish", finished_normally),
    Sometimes("pipeline_can_be_full", pipeline_full, needs="pipeline"),
    Sometimes("two_prefill_chunks_in_flight", two_prefill_chunks_in_flight, needs="continue_prefill"),
    Sometimes("preempted_request_resumes_and_finishes", finished_normally, after=preempted),
    Sometimes("duplicate_cached_block", duplicate_cached_block, needs="duplicate_caching"),
    Sometimes("preallocated_block", preallocated_block, needs="preallocation"),
)
