"""Sampled-token feedback: the last stage sends every token it samples to
stage 0, which embeds it when a later batch needs it.

This is what vLLM 0.33's V2 model runner does under pipeline parallelism with
asynchronous scheduling (`v1/worker/gpu/pp_utils.py` `PPHandler`: the last
rank broadcasts each step's sampled tokens, the other ranks consume them
`pp_size` steps later). The scheduler then stops sending a running request's
tokens (`Scheduler._make_cached_request_data`: `new_token_ids` only when
`use_pp and not async_scheduling`), because under async scheduling it does
not have them yet when it schedules the request's next decode.

Identity is a *generation*, not a request id. Every stage numbers the
request incarnations it sees (an admission or a resumption opens one, a
finish or a preemption closes it) from one counter in plan order, so all
stages give an incarnation the same number. The last stage tags each token
with its entry's generation; stage 0 drops a token whose generation has
closed meanwhile (vLLM's per-slot counter `req_idx_gen_np`, snapshotted at
receive and compared in `get_prev_sampled_outputs`). A reused request id
gets a new generation, so a token of the old request can never be taken by
the new one.

With drafts (spec decoding) the message also says, for every entry that
sampled, how many of its drafts were rejected and which drafts the last
stage proposed next (`EntryFeedback`), as vLLM's `PPHandler.broadcast` sends
`num_rejected` beside the sampled tokens and `broadcast_drafts` the draft
proposals. Under async scheduling the scheduler placed the request's next
decode before either was known: it counted every draft as accepted and
scheduled draft *slots* (vLLM: `-1` placeholders,
`AsyncScheduler._update_after_schedule`). Every stage but the last reads the
rejection count to find where that decode really starts (the V2 runner's
`post_update`: `num_computed += query_len - num_rejected` on the device),
and stage 0 fills the draft slots with the proposed drafts. That is why the
messages go to every stage but the last, not to stage 0 alone.

One message per batch the last stage runs, in batch order: int64 tensors
only, a header `[2]` = (batch id, rows) then the rows `[rows, 3]` =
(generation, position, token), so it travels over gloo or NCCL point to
point with sizes known before each receive. An entry's record travels as
rows with a negative position (`pack`): `(generation, -1, rejected)` then
`(generation, -2 - i, draft i)` for each proposed draft.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class EntryFeedback:
    """What a sampling entry's drafts came to: how many the model rejected,
    and the drafts the last stage proposed after its tokens (for the
    request's next decode, whose draft slots stage 0 fills with them)."""

    generation: int
    num_rejected: int
    draft_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class SampledTokens:
    """The tokens one batch sampled: rows of (generation, position, token);
    and one record per entry that sampled."""

    batch_id: int
    rows: tuple[tuple[int, int, int], ...]
    entries: tuple[EntryFeedback, ...] = ()


# A message with this batch id ends the stream (the stages are stopping).
END_OF_STREAM = -1
# Positions of the rows that carry an entry's record, not a token.
REJECTED_ROW = -1
FIRST_DRAFT_ROW = -2


def pack(message: SampledTokens) -> tuple[torch.Tensor, torch.Tensor]:
    """header [2] int64, rows [N, 3] int64: the token rows, then each entry's
    record as rows with a negative position (one tensor shape for both, so
    the receiver needs one size)."""
    rows = list(message.rows)
    for entry in message.entries:
        rows.append((entry.generation, REJECTED_ROW, entry.num_rejected))
        rows.extend((entry.generation, FIRST_DRAFT_ROW - i, draft)
                    for i, draft in enumerate(entry.draft_token_ids))
    header = torch.tensor([message.batch_id, len(rows)], dtype=torch.int64)
    return header, torch.tensor(rows, dtype=torch.int64).reshape(len(rows), 3)


def unpack(header: torch.Tensor, rows: torch.Tensor) -> SampledTokens:
    tokens: list[tuple[int, int, int]] = []
    entries: list[EntryFeedback] = []
    for generation, position, value in rows.cpu().tolist():
        if position >= 0:
            tokens.append((generation, position, value))
        elif position == REJECTED_ROW:
            entries.append(EntryFeedback(generation, value))
        else:                               # the next draft of the last record
            last = entries[-1]
            assert last.generation == generation and \
                FIRST_DRAFT_ROW - len(last.draft_token_ids) == position, "malformed feedback rows"
            entries[-1] = EntryFeedback(generation, last.num_rejected,
                                        (*last.draft_token_ids, value))
    return SampledTokens(int(header[0]), tuple(tokens), tuple(entries))


class FeedbackSource(Protocol):
    """Where stage 0 reads the messages: blocking, in batch order."""

    def receive(self) -> SampledTokens: ...


class LocalFeedback:
    """In-process channel (LocalExecutor, or a one-stage pipeline): the last
    stage's `send` runs before any later batch reaches stage 0, so a receive
    on an empty channel means the token was never sampled: an error, not a wait."""

    def __init__(self) -> None:
        self._messages: deque[SampledTokens] = deque()

    def send(self, message: SampledTokens) -> None:
        self._messages.append(message)

    def receive(self) -> SampledTokens:
        if not self._messages:
            raise FeedbackError("stage 0 needs a sampled token that no batch before it sampled")
        return self._messages.popleft()


class FeedbackError(RuntimeError):
    """Stage 0 needs a token the last stage never sent."""


class FeedbackReceiver:
    """Stage 0's side over torch.distributed. A thread receives every message
    as soon as the last stage sends it and queues it, so the last stage's
    sends always complete (gloo's send is a rendezvous: a stage 0 that only
    received when it needed a token could leave the last stage waiting on a
    send while the driver waits on the last stage). `receive()` blocks on
    that queue, in order; a failed receive is re-raised there."""

    def __init__(self, src: int, group: Any, device: torch.device) -> None:
        self._src, self._group, self._device = src, group, device
        self._queue: queue.Queue[SampledTokens | BaseException] = queue.Queue()
        self._thread = threading.Thread(target=self._run, daemon=True, name="feedback-receiver")
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                header = torch.empty(2, dtype=torch.int64, device=self._device)
                dist.recv(header, src=self._src, group=self._group)
                rows = torch.empty(int(header[1]), 3, dtype=torch.int64, device=self._device)
                if rows.numel():
                    dist.recv(rows, src=self._src, group=self._group)
                message = unpack(header, rows)
                self._queue.put(message)
                if message.batch_id == END_OF_STREAM:
                    return
        except BaseException as err:          # a peer died: tell the stage's loop
            self._queue.put(err)

    def receive(self) -> SampledTokens:
        item = self._queue.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def send_message(outbox: Any, message: SampledTokens, dst: int, group: Any,
                 device: torch.device) -> None:
    """The last stage's side: isend through the stage's outbox (tensors kept
    alive until waited). Empty row tensors are not sent (NCCL and gloo both
    accept them, but the receiver skips them to keep one rule)."""
    header, rows = pack(message)
    outbox.isend(header.to(device), dst, group)
    if rows.numel():
        outbox.isend(rows.to(device), dst, group)


class TokenInbox:
    """A stage's view of the feedback (every stage but the last has one):
    tokens by generation and position, and entry records by generation and
    message index, taken in order from a `FeedbackSource` only when a batch needs one.

    Rows of a generation that has closed are dropped on arrival, and a
    closing generation's stored rows are dropped with it (`num_dropped`
    counts both). `num_expected` is the number of batches the last stage has
    run before the batch this stage is preparing (every batch sends one
    message): once that many messages are in and the token or record is
    missing, it will never come, and `take` / `settle` say so instead of
    waiting forever. `keeps_tokens=False` (the stages between the first and
    the last, which embed nothing): token rows are not stored."""

    def __init__(self, source: FeedbackSource, *, keeps_tokens: bool = True) -> None:
        self.source = source
        self.keeps_tokens = keeps_tokens
        self.live: set[int] = set()
        self._tokens: dict[int, dict[int, int]] = {}       # generation -> position -> token
        # generation -> message index -> that batch's record of the generation's
        # entry. Indexed by arrival, not batch id: batch ids start again after
        # a reset, the stream of messages does not.
        self._records: dict[int, dict[int, EntryFeedback]] = {}
        self.num_received = 0                               # messages read
        self.num_dropped = 0                                # rows of closed generations

    def open(self, generation: int) -> None:
        self.live.add(generation)

    def close(self, generation: int) -> None:
        self.live.discard(generation)
        self.num_dropped += len(self._tokens.pop(generation, {}))
        self._records.pop(generation, None)

    def settle(self, generation: int, index: int, num_expected: int) -> EntryFeedback:
        """The record of the generation's sampling entry in the `index`-th
        batch this stage ran (counted from 0 since the start: the last stage
        runs the same batches in the same order and sends one message each,
        so it is the `index`-th message)."""
        while self.num_received <= index:
            if self.num_received >= num_expected:
                raise FeedbackError(
                    f"stage needs batch #{index}'s record of generation {generation}, and none "
                    f"of the {num_expected} batches before this one sent it")
            self._store(self.source.receive())
        record = self._records.get(generation, {}).pop(index, None)
        if record is None:
            raise FeedbackError(f"batch #{index} sent no record of generation {generation}'s "
                                "entry, which sampled")
        return record

    def take(self, generation: int, position: int, num_expected: int) -> int:
        while True:
            stored = self._tokens.get(generation)
            if stored is not None and position in stored:
                return stored.pop(position)
            if self.num_received >= num_expected:
                raise FeedbackError(
                    f"stage 0 needs the token at position {position} of generation {generation}, "
                    f"and none of the {num_expected} batches before this one sampled it")
            self._store(self.source.receive())

    def _store(self, message: SampledTokens) -> None:
        index = self.num_received
        self.num_received += 1
        for generation, position, token in message.rows:
            if generation not in self.live:
                self.num_dropped += 1
            elif self.keeps_tokens:
                self._tokens.setdefault(generation, {})[position] = token
        for record in message.entries:
            if record.generation in self.live:
                self._records.setdefault(record.generation, {})[index] = record
