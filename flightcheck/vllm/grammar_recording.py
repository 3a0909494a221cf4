"""What the recorder writes for structured output (docs/trace-format.md,
`grammar_compiled`, `grammar_failed`; docs/request-states.md, "Structured
output"), as hooks recording.py calls:

* the config event says `structured_output: true` when the deployment says
  so (`FLIGHTCHECK_STRUCTURED_OUTPUT=1`; the replay worker sets it for a
  workload with a structured request): the checker then models grammars;
* an arrival of a structured request says `structured: true`;
* right before each `schedule()` call, every request still waiting for its
  grammar whose grammar has settled since (the Future done: compiled, or
  failed with an exception) gets `grammar_compiled` / `grammar_failed`: the
  scheduler can see it from that call on;
* a failed grammar's finish by "error" (vLLM finishes `grammar_compile_error_reqs`
  at the end of `update_from_output`) is written after the batch's
  `complete` event, where the spec finishes it.

Imports no vLLM.
"""

from __future__ import annotations

import os
from typing import Any

STRUCTURED_ENV = "FLIGHTCHECK_STRUCTURED_OUTPUT"
WAITING_FOR_GRAMMAR = "WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR"


def config_fields() -> dict[str, Any]:
    return {"structured_output": True} if os.environ.get(STRUCTURED_ENV) == "1" else {}


def arrive_fields(request: Any) -> dict[str, Any]:
    return {"structured": True} if getattr(request, "use_structured_output", False) else {}


def settled_grammars(requests: dict[str, Any], reported: set[str]) -> list[dict[str, Any]]:
    """The grammar events due before a `schedule()` call (each request once)."""
    events = []
    for req_id, request in requests.items():
        if req_id in reported or request.status.name != WAITING_FOR_GRAMMAR:
            continue
        structured = request.structured_output_request
        grammar = None if structured is None else structured.grammar    # settles a done Future
        if grammar is None:
            continue
        reported.add(req_id)
        failed = isinstance(grammar, Exception)
        events.append({"ev": "grammar_failed" if failed else "grammar_compiled", "req": req_id})
    return events


def is_grammar_error(request: Any, reason: str) -> bool:
    """A finish by "error" of a request still waiting for its grammar (its grammar failed)."""
    return reason == "error" and request.status.name == WAITING_FOR_GRAMMAR


def own_grammar_failed(request: Any) -> bool:
    """Whether this request's own grammar failed to compile (a done Future settles)."""
    structured = getattr(request, "structured_output_request", None)
    return structured is not None and isinstance(structured.grammar, Exception)
