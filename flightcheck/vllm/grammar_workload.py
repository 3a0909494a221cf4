"""A workload's structured-output requests (docs/request-states.md,
"Structured output"): the key each request may carry, and the fabricated
grammar backend's timing rule, read alike by the replay worker (vLLM's real
scheduler) and by the reference's run.

    "grammar": {"compile_steps": 2, "fails": false}

A request with `grammar` asks for structured output: it arrives waiting for
its grammar (`WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR`), which compiles, or
fails to compile when `fails`, once `compile_steps` `schedule()` calls have
begun since its arrival (0: compiled before the first call after it
arrives). Its FSM accepts a seeded token set, the tokens the fabricated
model may sample for that request (`sampled_token` at any position): a
token of another request's output is refused; the fabricated model's own
positions are not judged (after a rejected draft under async scheduling it
does not shift its later samples as vLLM's runner does). Drafts are the
request's own future tokens, always grammar-legal (the bridge fabricates
no illegal draft). Only vLLM 0.33 and 0.34 are driven with it.

Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .workload_limits import LimitError

MAX_COMPILE_STEPS = 64


class GrammarWorkloadError(LimitError):
    pass


@dataclass(frozen=True)
class GrammarSpec:
    compile_steps: int = 0
    fails: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"compile_steps": self.compile_steps, "fails": self.fails}


def grammar_from_json(raw: Any, where: str) -> GrammarSpec | None:
    """A request's `grammar` key (None: no structured output)."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) - {"compile_steps", "fails"}:
        raise GrammarWorkloadError(f"{where}: must be an object with compile_steps and fails, got {raw!r}")
    steps, fails = raw.get("compile_steps", 0), raw.get("fails", False)
    if not isinstance(steps, int) or isinstance(steps, bool) or not 0 <= steps <= MAX_COMPILE_STEPS:
        raise GrammarWorkloadError(f"{where}.compile_steps: must be an integer in 0..{MAX_COMPILE_STEPS}, got {steps!r}")
    if not isinstance(fails, bool):
        raise GrammarWorkloadError(f"{where}.fails: must be true or false, got {fails!r}")
    return GrammarSpec(steps, fails)


class CompileClock:
    """When each structured request's grammar is settled: counted in
    `schedule()` calls begun since it arrived. `arrive` when the request is
    added; `tick` at the start of every `schedule()` call returns the
    requests settled by it, with whether each failed."""

    def __init__(self) -> None:
        self._left: dict[str, tuple[int, bool]] = {}

    def arrive(self, req_id: str, spec: GrammarSpec) -> None:
        self._left[req_id] = (spec.compile_steps, spec.fails)

    def forget(self, req_id: str) -> None:
        self._left.pop(req_id, None)

    def tick(self) -> list[tuple[str, bool]]:
        settled = [(req_id, fails) for req_id, (left, fails) in self._left.items() if left == 0]
        for req_id, _ in settled:
            del self._left[req_id]
        self._left = {req_id: (left - 1, fails) for req_id, (left, fails) in self._left.items()}
        return settled

    def pending(self) -> int:
        return len(self._left)
