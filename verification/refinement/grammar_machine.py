"""The refinement fuzzer with structured output (docs/request-states.md,
"Structured output"): machine.py's machine under `Config.structured_output`,
the reference's `Grammars` (reference/grammar.py) against spec/grammar.py,
under vLLM 0.33 and 0.34, sync and async (`GRAMMAR_FUZZED_PROFILES`).

The environment's choices beyond machine.py's:

* each arrival asks for structured output or not (`add_structured_request`,
  the spec's `Prompt.structured`);
* the grammar backend: between any two steps a compiling grammar compiles
  or fails (`compile_grammar`: the reference request's `grammar` set to
  "ready" or "failed", the spec's `CompileGrammar` / `FailGrammar`).

The bitmask is the engine's, not the scheduler's, so the machine's engine
(`BitmaskEngine`) builds it, as vLLM's `EngineCore.step_with_batch_queue`
does: for a batch at once, from each structured request's FSM, unless the
scheduler marked the batch `pending_structured_output_tokens`; such a batch
waits (nothing is scheduled) until the oldest output is processed, and its
bitmask is built from the FSM as that output left it. The abstraction maps
each in-flight entry's mask to the spec's `Entry.mask`: the FSM position its
bitmask was built at; in a batch not yet built, `grammar.DEFERRED` for an
entry whose request has an earlier sampling entry of its incarnation in
flight (the spec's `placeholders - own > 0`), else the FSM now (no output of
its request can land before the build). So a scheduler that fails to mark a
batch (vLLM #29379) lets the engine build a stale mask, which the spec
refuses at the completion (G3), and one that marks a batch needlessly makes
the engine wait where the spec schedules. The request's `grammar` and `fsm`
and the scheduler's `grammar_compile_error_reqs` map to the spec's
`Request.grammar`, `Request.fsm` and `State.grammar_errors`.

Not drawn: grammar-illegal drafts (`Sample.illegal_from`): the reference
abstracts draft validation away (every draft it is given is legal).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from flightcheck import spec
from flightcheck.reference import Engine, Request, SamplingParams
from flightcheck.reference.outputs import SchedulerOutput
from flightcheck.spec.grammar import DEFERRED
from flightcheck.spec.state import Grammar, evolve
from flightcheck.spec.transitions import CompileGrammar, FailGrammar
from flightcheck.verification.refinement.abstraction import Ledger, abstract
from flightcheck.verification.refinement.bounded_run import fuzz_machine, machine_per_profile
from flightcheck.verification.refinement.machine import RefinementMachine, _step
from flightcheck.verification.refinement.strategies import EOS, NEAR_CAP, NUM_SLOTS, configs, prompt_tokens

GRAMMAR_FUZZED_PROFILES: tuple[str, ...] = ("vllm-0.34-async", "vllm-0.34", "vllm-0.33-async", "vllm-0.33")
GRAMMAR: dict[str | None, Grammar] = {None: Grammar.NONE, "compiling": Grammar.COMPILING,
                                      "ready": Grammar.READY, "failed": Grammar.FAILED}


class BitmaskEngine(Engine):
    """The reference's engine with vLLM's bitmask step (the module doc):
    `masks` holds each built entry's FSM position (by the entry's id, the
    entry kept beside it so that no id is reused),
    `deferred` the outputs whose bitmask waits for the oldest output."""

    def __init__(self, *args: Any, ledger: Ledger, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ledger = ledger
        self.masks: dict[int, tuple[Any, int | None]] = {}
        self.deferred: list[SchedulerOutput] = []

    def can_schedule(self) -> bool:
        return not self.deferred and super().can_schedule()

    def schedule_step(self) -> SchedulerOutput | None:
        output = super().schedule_step()
        if output is not None:
            self._bitmask_or_defer(output)
        return output

    def enqueue_step(self) -> SchedulerOutput:
        output = super().enqueue_step()
        self._bitmask_or_defer(output)
        return output

    def complete_oldest_step(self) -> list[Any]:
        outputs = super().complete_oldest_step()
        for output in self.deferred:          # built from the FSM as the output left it
            self._build(output)
        self.deferred = []
        return outputs

    def _bitmask_or_defer(self, output: SchedulerOutput) -> None:
        self.ledger.record_batch(self.scheduler, output)   # (the machine records it too: the same binding)
        if output.pending_structured_output_tokens:
            self.deferred.append(output)
        else:
            self._build(output)

    def _build(self, output: SchedulerOutput) -> None:
        for e in output.entries:
            self.masks[id(e)] = (e, self.mask_now(e))

    def mask_now(self, e: Any) -> int | None:
        """The FSM position a bitmask built now gives entry e (None: no mask,
        as `get_grammar_bitmask` skips a prefill chunk and a request without
        a compiled grammar)."""
        request = self.ledger.requests[self.ledger.entry_slot(e.req_id, e.incarnation)]
        return request.fsm if e.samples and request.grammar == "ready" else None


class GrammarRefinementMachine(RefinementMachine):
    """RefinementMachine with structured output (the module doc)."""

    profile = GRAMMAR_FUZZED_PROFILES[0]

    @initialize(data=st.data(), sample_every_chunk=st.booleans())
    def setup(self, data: Any, sample_every_chunk: bool) -> None:
        RefinementMachine.setup(self, cfg=data.draw(configs(self.profile)), sample_every_chunk=sample_every_chunk)
        self.spec_cfg = replace(self.spec_cfg, structured_output=True)
        self.engine = BitmaskEngine(self.scheduler, self.executor, self.engine.loop, ledger=self.ledger)

    @precondition(lambda self: self.engine is not None and self._may_arrive())
    @rule(prompt_len=st.integers(1, 4) | st.integers(1, 15 + NEAR_CAP), family=st.integers(0, 1),
          tail=st.integers(0, 4), max_tokens=st.integers(6, 20), plain=st.integers(0, 2))
    @_step
    def arrive(self, prompt_len: int, family: int, tail: int, max_tokens: int, plain: int) -> None:
        """machine.py's arrival (fresh names only), asking for structured
        output unless `plain` is 2 (shrinking reaches a structured one)."""
        slot = len(self.ledger.requests)
        if prompt_len > 15:
            length = max(1, self.cfg.max_model_len - 1 - (prompt_len - 16))
        else:
            length = 1 + (prompt_len - 1) % max(1, self.cfg.max_model_len // 2)
        request = Request(f"r{slot}", prompt_tokens(slot, family, max(0, length - tail), length),
                          SamplingParams(max_tokens=max_tokens), eos_token_id=EOS)
        structured = plain != 2
        if structured:
            self.scheduler.add_structured_request(request)
        else:
            self.engine.add_request(request)
        _, prompt = self.ledger.arrive(request)
        self._check(spec.Arrive(slot, replace(prompt, structured=structured)))

    @precondition(lambda self: self.engine is not None and bool(self._compiling()))
    @rule(which=st.integers(0, NUM_SLOTS - 1), outcome=st.integers(0, 4))
    @_step
    def settle_grammar(self, which: int, outcome: int) -> None:
        """The backend settles the `which`-th compiling grammar: compiled,
        or (outcome 4, one in five) failed."""
        compiling = self._compiling()
        slot = compiling[which % len(compiling)]
        fails = outcome == 4
        self.ledger.requests[slot].grammar = "failed" if fails else "ready"
        self._check(FailGrammar(slot) if fails else CompileGrammar(slot))

    def _compiling(self) -> list[int]:
        return [slot for slot, r in enumerate(self.ledger.requests)
                if r.grammar == "compiling" and not r.is_finished()]

    def _check_request_data(self, before: spec.State, output: SchedulerOutput) -> None:
        """machine.py's, with a request admitted once its grammar compiled
        as a new request (vLLM's `NewRequestData`): it waited for it."""
        for slot, q in enumerate(before.requests):
            if q.status is spec.Status.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR:
                before = before.with_request(slot, status=spec.Status.WAITING)
        super()._check_request_data(before, output)

    # -- the abstraction's grammar part ------------------------------------------

    def _abstract(self) -> spec.State:
        """abstraction.py's state, with each request's grammar and FSM, the
        recorded failed grammars, and each in-flight entry's mask."""
        state = abstract(self.scheduler, self.engine, self.ledger)
        requests = list(state.requests)
        for slot, r in enumerate(self.ledger.requests):
            requests[slot] = evolve(requests[slot], grammar=GRAMMAR[r.grammar], fsm=r.fsm if r.grammar else 0)
        slot_of = {r.request_id: slot for slot, r in enumerate(self.ledger.requests)}   # (fresh names)
        errors = frozenset(slot_of[req_id] for req_id in self.scheduler.grammar_compile_error_reqs)
        in_flight = tuple(tuple(replace(e, mask=self._mask(out, i, x)) for e, x in zip(batch, out.entries))
                          for i, (batch, (out, _)) in enumerate(zip(state.in_flight, self.engine.batch_queue)))
        return replace(state, requests=tuple(requests), grammar_errors=errors, in_flight=in_flight)

    def _mask(self, output: SchedulerOutput, index: int, e: Any) -> int | None:
        """The entry's mask: built, or (its batch deferred) DEFERRED where an
        earlier sampling entry of the same incarnation is in flight."""
        engine = self.engine
        if not any(output is d for d in engine.deferred):
            return engine.masks[id(e)][1]
        mask = engine.mask_now(e)
        older = [x for out, _ in list(engine.batch_queue)[:index] for x in out.entries]
        if mask is not None and any(x.req_id == e.req_id and x.incarnation == e.incarnation and x.samples
                                    for x in older):
            return DEFERRED
        return mask


# The machine with every configuration under a profile (refused outside GRAMMAR_FUZZED_PROFILES).
grammar_machine = machine_per_profile(GrammarRefinementMachine, "structured-output", GRAMMAR_FUZZED_PROFILES)


def grammar_fuzz(steps: int, seed: int, profile: str, steps_per_program: int = 60,
                 shrink: bool = True, mutant: str | None = None) -> str | None:
    """A refinement run with structured output under `profile`, `steps` rule
    steps from `seed`, the reference's `mutant` in force if given; the
    failure (the program, shrunk unless `shrink` is off, and its message),
    or None."""
    return fuzz_machine(grammar_machine(profile), steps, seed, steps_per_program, shrink, mutant)
