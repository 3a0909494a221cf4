"""What the fabricated model runner answers to the engine's
`take_draft_token_ids` when a batch's sampling is deferred for structured
output (`pending_structured_output_tokens`, async scheduling): the drafts
the engine hands to `Scheduler.update_draft_token_ids_in_output` before it
builds that batch's grammar bitmask (`EngineCore.step_with_batch_queue`,
0.33.0 and 0.34.0, when `check_for_draft_tokens`: speculative decoding on).

Our own copy of the behaviour of vLLM's V2 model runner (the only runner
under async scheduling in 0.33 and in 0.34), `DraftTokensHandler` in
`v1/worker/gpu/spec_decode/utils.py`:

* every batch that samples proposes a row of drafts for each of its
  requests, all rows as wide as the drafter's output (k here);
* 0.33.0 (`get_draft_tokens`): the rows of the latest batch that sampled,
  for all its requests (some may not be in the deferred batch, or may have
  finished since: the scheduler skips those);
* 0.34.0 (`begin_step`, `get_draft_tokens`, `discard`): each live
  request's latest row, kept until the request is removed from the runner
  (`finished_req_ids`), and only for the requests the deferred batch
  scheduled drafts for (`scheduled_spec_decode_tokens`' keys).

The deferred batch itself has not sampled when the engine asks (its
`sample_tokens` comes after the bitmask), so the answer is what the runner
held when that batch was submitted. The rows are the request's own next
tokens (the fabricated model's drafts are its future tokens: every one is
legal for the fabricated grammar, grammar_replay.py), so vLLM keeps every
slot and no scheduling state changes; the call rewrites the deferred
output's draft ids (and, on 0.33, asks the grammar to validate them).

Standard library only.
"""

from __future__ import annotations

from typing import Any


class DraftHandler:
    """The runner's drafts, as the engine's `take_draft_token_ids` reads
    them for a deferred batch (`retains_per_request`: 0.34's handler)."""

    def __init__(self, retains_per_request: bool) -> None:
        self.retains_per_request = retains_per_request
        self._latest_rows: dict[str, list[int]] = {}      # the latest batch that sampled (0.33)
        self._retained: dict[str, list[int]] = {}         # each live request's latest row (0.34)
        # What the runner held when the latest batch with tokens was submitted.
        self._held_latest: dict[str, list[int]] = {}
        self._held_retained: dict[str, list[int]] = {}

    def discard(self, req_id: str) -> None:
        """The runner drops a finished request (`finished_req_ids`)."""
        self._retained.pop(req_id, None)

    def submitted(self, rows: dict[str, list[int]]) -> None:
        """A batch with tokens is submitted: what the runner holds before it
        samples is kept for a deferred bitmask; then its rows (one per
        request of the batch) become the latest."""
        self._held_latest, self._held_retained = self._latest_rows, dict(self._retained)
        self._latest_rows = rows
        self._retained.update(rows)

    def take(self, deferred_output: Any) -> tuple[list[str], list[list[int]]]:
        """The drafts handed to `update_draft_token_ids_in_output` for the
        deferred batch (the latest submitted): request ids and fresh lists
        (the scheduler trims and pads them in place)."""
        if not self.retains_per_request:
            held = self._held_latest
            req_ids = list(held)
        else:
            held = self._held_retained
            scheduled = getattr(deferred_output, "scheduled_spec_decode_tokens", None) or {}
            req_ids = [req_id for req_id in scheduled if req_id in held]
        return req_ids, [list(held[req_id]) for req_id in req_ids]
