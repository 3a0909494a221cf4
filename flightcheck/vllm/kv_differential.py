"""The differential's reading of a KV connector's trace events
(differential.py `decisions`): the connector's reports as decisions, and
the finishes by error the fail policy causes, which vLLM's recorder and the
reference write at different places.

Standard library only.
"""

from __future__ import annotations

from typing import Any


KV_REPORTS = ("kv_received", "kv_failed", "kv_sent")


def kv_decision(event: dict[str, Any]) -> tuple[Any, ...]:
    """A KV connector's report as a decision (both sides' fabricated
    connectors follow kv_workload.py's timing rule; the rollback a failure
    causes shows in the request's next entry)."""
    if event["ev"] == "kv_failed":
        return ("kv_failed", event["req"], event["from_block"])
    return (event["ev"], event["req"])


class ErrorFinishes:
    """Finishes by "error" (a KV load failure under the fail policy), taken
    after the completion of the failing batch: vLLM finishes the request
    after the batch's tokens, but its recorder writes the finish within
    update_from_output, before that batch's `complete` (and again when the
    update returns: counted once); the reference writes it after the
    `complete`. Their `held` is left out: a request whose load is in flight
    is held for the load's report, which the trace format leaves to the writer."""

    def __init__(self) -> None:
        self.pending: list[tuple[Any, ...]] = []      # written before their batch's `complete`
        self.seen: set[str] = set()                    # finished by error (until an arrival reuses the id)
        self.after_complete = False                    # the last decision was a completion

    def take(self, event: dict[str, Any], finishes: list[tuple[Any, ...]]) -> None:
        """A `finish` by error: after the completion before it, or pending
        the next one. One written in an empty batch's update (a grammar
        error, which vLLM 0.33/0.34 `Scheduler.update_from_output` finishes at
        the end of any update, `grammar_compile_error_reqs`) follows that
        empty completion, which no decision shows: no later batch's."""
        req_id = event["req"]
        if req_id not in self.seen:
            self.seen.add(req_id)
            after = self.after_complete or in_an_empty_update(event)
            (finishes if after else self.pending).append(("finish", req_id, "error"))

    def release(self, finishes: list[tuple[Any, ...]]) -> None:
        finishes.extend(self.pending)
        self.pending.clear()


def in_an_empty_update(event: dict[str, Any]) -> bool:
    """Whether the writer wrote `event` in the update of an empty batch: the
    last of its `empty_batches_before` is that batch's completion, at the
    event's own `step` (a recorder writes an update's events at its step)."""
    before = event.get("empty_batches_before") or []
    return bool(before) and before[-1].get("ev") == "complete" and "step" in event \
        and before[-1].get("step") == event["step"]
