"""What a vLLM run exercised, read from its trace (the campaign's coverage
counts): a preemption or an abort while the request had a batch in flight,
a prefix hit, two chunks of one request in flight.

Standard library only.
"""

from __future__ import annotations

from typing import Any


def coverage_of(events: list[dict[str, Any]]) -> dict[str, bool]:
    """What a vLLM run exercised, read from its trace: a preemption or an
    abort while the request had a batch in flight, a prefix hit, a duplicate
    cached block (a full block whose content another block of the pool already
    holds), two chunks of one request in flight."""
    in_flight: dict[int, set[str]] = {}
    seen = {"preemption_in_flight": False, "abort_in_flight": False, "prefix_hit": False,
            "two_chunks_in_flight": False}
    for event in events:
        kind = event.get("ev")
        if kind == "schedule" and event.get("entries") is not None:
            requests_in_flight = set().union(*in_flight.values()) if in_flight else set()
            for req in event.get("preempted", ()):
                seen["preemption_in_flight"] |= req in requests_in_flight
            for entry in event.get("entries", ()):
                seen["prefix_hit"] |= entry.get("cached", 0) > 0
                seen["two_chunks_in_flight"] |= entry["req"] in requests_in_flight
            if event.get("batch") is not None:
                in_flight[event["batch"]] = {entry["req"] for entry in event.get("entries", ())}
        elif kind == "complete":
            in_flight.pop(event.get("batch"), None)
        elif kind == "abort":
            seen["abort_in_flight"] |= any(event["req"] in reqs for reqs in in_flight.values())
    return seen
