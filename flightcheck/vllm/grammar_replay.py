"""The replay worker's side of a workload with structured-output requests
(grammar_workload.py): a fabricated grammar backend for vLLM's real
scheduler, loaded without xgrammar or any other backend.

vLLM 0.33.0 and 0.34.0 (read in `v1/request.py`, `v1/structured_output/`,
`Scheduler._handle_blocked_waiting_request`, `update_from_output`,
`update_draft_token_ids`): a request whose `SamplingParams.structured_outputs`
is set arrives in `WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR`; `EngineCore.
add_request` then calls `StructuredOutputManager.grammar_init`, which sets
`structured_output_request.grammar` to a Future the scheduler polls. Here
that Future is settled by the workload's compile clock at the start of a
`schedule()` call: with our grammar object (`FabricatedGrammar`), or with an
exception for a grammar that fails. The scheduler asks its manager only
`accept_tokens` (every output's new tokens), `trim_spec_tokens` (0.34) or
`validate_tokens` (0.33) for drafts, and `grammar_bitmask` (which the
engine, not the scheduler, calls: our engine copy does not); the
`FabricatedGrammarManager` answers those. The FSM accepts the seeded set of
tokens the fabricated model may sample for its request; it counts what it
accepted and what it refused, so a run can tell whether every output
advanced it exactly once and no output of another request reached it.

Imports no vLLM (the replay worker, its only user, sets the request's
`structured_outputs`).
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Callable

from .grammar_workload import CompileClock, GrammarSpec
from .workload import RequestSpec, Workload, sampled_token


class FabricatedGrammar:
    """One request's FSM: it accepts the tokens of a seeded set (every token
    the fabricated model may sample for this request, at any position: so a
    token bound to the wrong request is refused, while the model's own
    positions, which it fabricates, are not judged), and counts them."""

    def __init__(self, workload: Workload, spec: RequestSpec) -> None:
        positions = workload.config.max_model_len + workload.config.num_spec_tokens + 1
        self._legal = {sampled_token(workload, spec, p) for p in range(positions)}
        self.position = 0                     # output tokens accepted
        self.refused: list[int] = []          # positions where a token was refused

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        for token in tokens:
            if token not in self._legal:
                self.refused.append(self.position)
                return False                   # "Failed to advance FSM"
            self.position += 1
        return True

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        """Every draft is grammar-legal here (the fabricated model proposes the
        request's own future tokens; the spec explores illegal drafts)."""
        return list(tokens)

    def is_terminated(self) -> bool:
        return False


class FabricatedGrammarManager:
    """What vLLM's scheduler asks a `StructuredOutputManager`, answered with
    fabricated grammars (vLLM's own would build a tokenizer and a backend)."""

    def __init__(self) -> None:
        self.grammars: dict[str, FabricatedGrammar] = {}

    @staticmethod
    def _grammar(request: Any) -> FabricatedGrammar | None:
        structured = request.structured_output_request
        grammar = None if structured is None else structured.grammar
        return grammar if isinstance(grammar, FabricatedGrammar) else None

    def accept_tokens(self, request: Any, new_token_ids: list[int]) -> bool:
        grammar = self._grammar(request)
        if not request.use_structured_output or not new_token_ids or grammar is None:
            return True
        return grammar.accept_tokens(request.request_id, new_token_ids)

    def validate_tokens(self, request: Any, spec_tokens: list[int]) -> list[int]:      # 0.33
        grammar = self._grammar(request)
        if not request.use_structured_output or grammar is None:
            return spec_tokens
        return grammar.validate_tokens([t for t in spec_tokens if t != -1])

    def trim_spec_tokens(self, request: Any, spec_tokens: list[int]) -> list[int]:     # 0.34
        grammar = self._grammar(request)
        if not request.use_structured_output or grammar is None:
            return spec_tokens
        drafts = [t for t in spec_tokens if t != -1]
        return drafts[:len(grammar.validate_tokens(drafts)) + 1]        # the first illegal one kept

    def grammar_bitmask(self, requests: Any, request_ids: list[str], spec_tokens: Any) -> None:
        return None

    def clear_backend(self) -> None:
        pass


class GrammarBackend:
    """The workload's grammars for one replay: `add` as a structured request
    is added (`grammar_init`: a Future), and the compile clock settling
    Futures at the start of each `schedule()` call (`attach`)."""

    def __init__(self, workload: Workload) -> None:
        self._workload = workload
        self.clock = CompileClock()
        self.manager = FabricatedGrammarManager()
        self._futures: dict[str, tuple[Future, RequestSpec]] = {}
        self.compiled: list[str] = []
        self.failed: list[str] = []

    def add(self, spec: RequestSpec, request: Any, grammar: GrammarSpec) -> None:
        future: Future = Future()
        request.structured_output_request.grammar = future
        self._futures[spec.req_id] = (future, spec)
        self.clock.arrive(spec.req_id, grammar)

    def attach(self, scheduler: Any) -> None:
        """Wrap the scheduler's `schedule` so every call first settles the grammars whose time has come."""
        schedule: Callable[..., Any] = scheduler.schedule

        def schedule_after_compiles(*args: Any, **kwargs: Any) -> Any:
            for req_id, fails in self.clock.tick():
                future, spec = self._futures.pop(req_id)
                if fails:
                    future.set_exception(ValueError("fabricated grammar compile failure"))
                    self.failed.append(spec.key)
                else:
                    grammar = FabricatedGrammar(self._workload, spec)
                    self.manager.grammars[spec.key] = grammar
                    future.set_result(grammar)
                    self.compiled.append(spec.key)
            return schedule(*args, **kwargs)

        scheduler.schedule = schedule_after_compiles

    def report(self) -> dict[str, Any]:
        """What the backend saw: grammars compiled and failed, each FSM's position and refusals."""
        return {"compiled": self.compiled, "failed": self.failed,
                "fsm": {key: g.position for key, g in self.manager.grammars.items()},
                "refused": {key: g.refused for key, g in self.manager.grammars.items() if g.refused}}


def start(workload: Workload, scheduler: Any) -> GrammarBackend | None:
    """The workload's grammar backend, put in the scheduler (None, and the
    scheduler untouched, without a structured request)."""
    if not any(spec.grammar is not None for spec in workload.requests):
        return None
    backend = GrammarBackend(workload)
    scheduler.structured_output_manager = backend.manager
    backend.attach(scheduler)
    return backend


def after_add(backend: GrammarBackend | None, spec: RequestSpec, request: Any) -> None:
    """`EngineCore.add_request`: a structured request's grammar starts compiling."""
    if backend is not None and spec.grammar is not None:
        backend.add(spec, request, spec.grammar)
