"""An in-process executor for tests: a worker whose "model" is a callback.

Like vLLM's test executor it reads a `SchedulerOutput` only when the
future's result is requested, so a scheduler that changes a batch's snapshot
after submitting it (the `shared_snapshot` mutant) is caught in the act.
Batches execute in submission order (a pipeline runs them FIFO): asking for
a later batch's result runs the earlier ones first.

The worker keeps its own view of each request, as a pipeline's stage 0 must:
the number of known tokens, from `NewRequestData.prompt_token_ids` and from
each `CachedRequestData`'s start + `new_token_ids`. An entry samples exactly
when its snapshot reaches the end of those tokens (start + n - drafts >=
known); otherwise it returns `[]` (a non-final prefill chunk). The test's
callback chooses the token, how many drafts were accepted and the drafts
proposed for the next step.

`keeps_sampled_tokens` (for vLLM 0.33's async scheduling): the worker also
counts each token it samples as known at once, as the V2 model runner does
(it keeps the sampled tokens on the device: the scheduler sends none under
async scheduling), and a resumed request's entry resets its view (the V2
runner re-adds a resumed request with all its tokens). A decode scheduled
while the previous one is in flight (output placeholders) then samples the
next position; a running request's view is then the runner's own count
alone (an entry scheduled on drafts rejected since starts past it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .outputs import ModelRunnerOutput, NewRequestData, SchedulerOutput


@dataclass(frozen=True)
class Sample:
    token_id: int                                  # the bonus token after accepted drafts
    num_accepted: int = 0                          # drafts accepted, 0..len(drafts)
    next_draft_token_ids: tuple[int, ...] = ()     # proposed for the request's next step


# callback(req_id, num_known_tokens, scheduled_draft_token_ids) -> Sample or a token id
SampleFn = Callable[[str, int, Sequence[int]], "Sample | int"]


def default_sample(req_id: str, num_tokens: int, drafts: Sequence[int]) -> Sample:
    """A token that depends only on the position, never EOS-like (ids >= 1000)."""
    return Sample(1000 + num_tokens)


@dataclass(frozen=True)
class ExecutedEntry:
    """What the worker computed for one entry, as it read the snapshot."""

    req_id: str
    start: int
    n: int
    sampled: bool


class LazyFuture:
    def __init__(self, executor: "ScriptedExecutor", scheduler_output: SchedulerOutput) -> None:
        self._executor = executor
        self.scheduler_output = scheduler_output
        self._result: ModelRunnerOutput | None = None

    def done(self) -> bool:
        return self._result is not None

    def result(self, timeout: float | None = None) -> ModelRunnerOutput:
        if self._result is None:
            self._executor._run_through(self)
        assert self._result is not None
        return self._result


class ScriptedExecutor:
    def __init__(self, sample: SampleFn | None = None, *, sample_every_chunk: bool = False,
                 keeps_sampled_tokens: bool = False) -> None:
        """`sample_every_chunk`: also return a token for non-final chunks, as a
        vLLM <= 0.8.2 worker did, leaving the scheduler to discard it.
        `keeps_sampled_tokens`: the worker learns the tokens it samples (async
        scheduling; see the module's doc)."""
        self._sample = sample or default_sample
        self._sample_every_chunk = sample_every_chunk
        self._keeps_sampled_tokens = keeps_sampled_tokens
        self._pending: deque[LazyFuture] = deque()
        self._num_known_tokens: dict[str, int] = {}
        self._proposed: dict[str, list[int]] = {}       # each request's latest drafts proposed
        self.executed: list[list[ExecutedEntry]] = []   # per batch, in execution order

    def submit(self, scheduler_output: SchedulerOutput) -> LazyFuture:
        future = LazyFuture(self, scheduler_output)
        self._pending.append(future)
        return future

    def _run_through(self, future: LazyFuture) -> None:
        while self._pending:
            head = self._pending.popleft()
            head._result = self._execute(head.scheduler_output)
            if head is future:
                return
        raise RuntimeError("result() of a future this executor does not hold")

    def _execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        known = self._num_known_tokens
        for req_id in scheduler_output.finished_req_ids:
            known.pop(req_id, None)
            self._proposed.pop(req_id, None)
        req_ids: list[str] = []
        sampled: list[list[int]] = []
        proposed: list[list[int]] = []
        executed: list[ExecutedEntry] = []
        for entry in scheduler_output.entries:
            req_id, start, n = entry.req_id, entry.num_computed_tokens, entry.num_new_tokens
            if type(entry) is NewRequestData:
                num_known = len(entry.prompt_token_ids)
            elif self._keeps_sampled_tokens and (entry.resumed_from_preemption or entry.rolled_back):
                num_known = start + len(entry.new_token_ids)
            elif self._keeps_sampled_tokens and req_id in known:
                # The runner's own count: a decode scheduled on drafts that a
                # batch executed since rejected starts past the tokens that
                # exist (the scheduler rolled its counter back after it was
                # scheduled), so the scheduler's start says nothing here.
                num_known = known[req_id]
            else:
                num_known = max(known.get(req_id, 0), start + len(entry.new_token_ids))
            known[req_id] = num_known
            drafts = entry.spec_token_ids
            is_final = start + n - len(drafts) >= num_known
            tokens: list[int] = []
            next_drafts: list[int] = []
            if is_final or self._sample_every_chunk:
                position = num_known if is_final else start + n
                tokens, next_drafts = self._call_sample(req_id, position, self._filled(req_id, drafts))
                self._proposed[req_id] = next_drafts
                if is_final and self._keeps_sampled_tokens:
                    known[req_id] = num_known + len(tokens)
            req_ids.append(req_id)
            sampled.append(tokens)
            proposed.append(next_drafts)
            executed.append(ExecutedEntry(req_id, start, n, bool(tokens)))
        self.executed.append(executed)
        return ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)}, sampled, proposed)

    def _filled(self, req_id: str, drafts: Sequence[int]) -> Sequence[int]:
        """vLLM 0.33's placeholder drafts (`-1`: async scheduling, a padded
        admission) filled in with the drafts the worker proposed for the
        request last (the V2 runner keeps them on the device), up to the first
        it has none for: such a placeholder matches no sampled token (the
        rejection sampler rejects it), so no draft after it is accepted."""
        if -1 not in drafts:
            return drafts
        proposed = self._proposed.get(req_id, [])
        filled: list[int] = []
        for i, draft in enumerate(drafts):
            if draft != -1:
                filled.append(draft)
            elif i < len(proposed):
                filled.append(proposed[i])
            else:
                break               # nothing proposed for this slot: it and those after are rejected
        return filled

    def _call_sample(self, req_id: str, position: int,
                     drafts: Sequence[int]) -> tuple[list[int], list[int]]:
        choice = self._sample(req_id, position, list(drafts))
        if not isinstance(choice, Sample):
            choice = Sample(int(choice))
        num_accepted = max(0, min(choice.num_accepted, len(drafts)))
        return [*drafts[:num_accepted], choice.token_id], list(choice.next_draft_token_ids)
