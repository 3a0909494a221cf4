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
    """Finishes by "error", taken where each writer's update made them. A KV
    load failure under the fail policy: vLLM finishes the request after the
    batch's tokens, but its recorder writes the finish within
    update_from_output, before that batch's `complete` (and again when the
    update returns: counted once); the reference writes it after the
    `complete`: such a finish waits for the next completion (`pending`). A
    finish written in an earlier update than that completion's stays before
    it: a grammar error vLLM 0.33/0.34 `Scheduler.update_from_output`
    finishes at the end of an empty batch's update (`grammar_compile_error_reqs`),
    which no decision shows, is no later batch's. Their `held` is left out:
    a request whose load is in flight is held for the load's report, which
    the trace format leaves to the writer."""

    def __init__(self) -> None:
        # written before a `complete`, with the event that wrote each
        self.pending: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.seen: set[str] = set()                    # finished by error (until an arrival reuses the id)
        self.after_complete = False                    # the last decision was a completion

    def take(self, event: dict[str, Any], finishes: list[tuple[Any, ...]]) -> None:
        req_id = event["req"]
        if req_id not in self.seen:
            self.seen.add(req_id)
            decision = ("finish", req_id, "error")
            if self.after_complete or in_an_empty_update(event):
                finishes.append(decision)
            else:
                self.pending.append((decision, event))

    def settle_before(self, complete: dict[str, Any], finishes: list[tuple[Any, ...]]) -> None:
        """At a `complete`: the pending finishes an earlier update wrote
        (their `step` before the one the completion's update wrote its own
        at, `step` - 1: a recorder counts the update when it returns) go
        before it; the rest wait for it."""
        earlier = [(d, e) for d, e in self.pending if _before_update_of(e, complete)]
        finishes.extend(d for d, _ in earlier)
        self.pending = [(d, e) for d, e in self.pending if not _before_update_of(e, complete)]

    def release(self, finishes: list[tuple[Any, ...]]) -> None:
        finishes.extend(d for d, _ in self.pending)
        self.pending.clear()


def _before_update_of(event: dict[str, Any], complete: dict[str, Any]) -> bool:
    step, update = event.get("step"), complete.get("step")
    return isinstance(step, int) and isinstance(update, int) and step < update - 1


def in_an_empty_update(event: dict[str, Any]) -> bool:
    """Whether the writer wrote `event` in the update of an empty batch: the
    last of its `empty_batches_before` is that batch's completion, at the
    event's own `step` (a recorder writes an update's events at its step)."""
    before = event.get("empty_batches_before") or []
    return bool(before) and before[-1].get("ev") == "complete" and "step" in event \
        and before[-1].get("step") == event["step"]
