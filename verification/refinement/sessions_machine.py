"""The refinement fuzzer with streaming sessions (docs/request-states.md,
"Streaming sessions"): machine.py's machine under `Config.streaming_sessions`,
the reference's `StreamingSessions` (reference/sessions.py) against
spec/sessions.py, under vLLM 0.33 and 0.34, sync and async
(`SESSIONS_FUZZED_PROFILES`).

The environment's choices beyond machine.py's:

* each arrival is a session or not; a session's arrival draws the inputs
  its client sends after its prompt (up to two, each `(new tokens,
  max_tokens)`, then the end of the session), the spec's `Prompt.session`,
  so that every turn fits below max_model_len (a session that grows past
  it is vLLM's finding, which neither side models: docs/request-states.md,
  "Finding: a session grows past max_model_len");
* between any two steps the client of a session with inputs left sends the
  next one (`send_input`): an `add_request` under the session's live id,
  not resumable for the end of the session (the spec's `SendInput`).

Configurations are machine.py's (prefix caching on or off: with it, a
session's kept outputs are prompt blocks its later lookups hit, labelled as
the spec's `content_label` labels them: abstraction.py's ledger rehashes a
session's blocks from the one its next input changed) and with a token
budget of at least 1 + k: a session's
next turn always has computed tokens, so a turn of one token is a decode
that vLLM 0.33's and 0.34's waiting loop pads with k drafts, and admits only
when the padding fits the budget ("Prefer to not schedule than schedule
un-padded"); below 1 + k it is never admitted, and the spec's L2 breaks.
And at most `MAX_SESSIONS` sessions unfinished at once, with a pool that
holds that many requests' blocks and one more: a session keeps its blocks
between turns and the waiting loop never preempts, so two sessions that
fill the pool between turns are never admitted again (L2 breaks). Both
are L2 failures of the spec and the reference alike, so no refinement
failure (tests/test_sessions_refinement.py pins them), and vLLM's own
(tests/test_vllm_sessions.py runs both on its real scheduler). A session's turns
are short (max_tokens 1 to 3), so that turns end often, by their length or
by EOS.

The abstraction adds a session's fields: `resumable`, the inputs its client
has still to send (the machine's own record), `queued_inputs` (the
reference's `streaming_queue`), `turn` and each entry's `Entry.turn` (ghosts:
the machine counts the reference's stops of a session, `_handle_stopped`
calls, and records the turn each entry was scheduled in), and
`kv_holding` (the reference's `kv_holding_waiting`). A session's next turn
is admitted as a new request (`NewRequestData`, its whole table). The engine
counts are the spec's as a parked session leaves it out
(`reset_pause.num_unfinished_requests`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from flightcheck import spec
from flightcheck.reference import Request, SamplingParams
from flightcheck.reference.config import cdiv
from flightcheck.reference.outputs import SchedulerOutput
from flightcheck.spec import reset_pause
from flightcheck.spec.sessions import END_OF_SESSION
from flightcheck.spec.state import evolve
from flightcheck.verification.refinement.abstraction import abstract
from flightcheck.verification.refinement.bounded_run import fuzz_machine, machine_per_profile
from flightcheck.verification.refinement.machine import RefinementMachine, _step
from flightcheck.verification.refinement.strategies import EOS, NUM_SLOTS, configs, prompt_tokens

SESSIONS_FUZZED_PROFILES: tuple[str, ...] = ("vllm-0.34-async", "vllm-0.34", "vllm-0.33-async", "vllm-0.33")
INPUT_TOKEN_BASE = 50_000           # a later input's tokens: below output tokens, never EOS
MAX_SESSIONS = 2                    # unfinished sessions at once (the pool holds them: the module doc)


class SessionsRefinementMachine(RefinementMachine):
    """RefinementMachine with streaming sessions (the module doc)."""

    profile = SESSIONS_FUZZED_PROFILES[0]

    @initialize(data=st.data(), sample_every_chunk=st.booleans())
    def setup(self, data: Any, sample_every_chunk: bool) -> None:
        cfg = data.draw(configs(self.profile))
        # a budget of at least 1 + k: below it a session's next turn of one
        # token is never admitted (the padding's liveness hole, module doc)
        # and a pool that holds MAX_SESSIONS sessions' blocks and one more
        # request's: sessions keep their blocks between turns, and two that
        # fill the pool wait for each other for ever (the module doc)
        per_request = cdiv(cfg.max_model_len, cfg.block_size)
        cfg = replace(cfg, num_blocks=max(cfg.num_blocks, (MAX_SESSIONS + 1) * per_request),
                      max_num_batched_tokens=max(cfg.max_num_batched_tokens, 1 + cfg.num_spec_tokens))
        RefinementMachine.setup(self, cfg=cfg, sample_every_chunk=sample_every_chunk)
        self.spec_cfg = replace(self.spec_cfg, streaming_sessions=True)
        self.inputs_to_send: dict[int, list[tuple[int, int]]] = {}   # per session: what its client still sends
        self.turns: dict[str, int] = {}                  # per session id: its stops so far
        self.entry_turns: dict[int, tuple[Any, int]] = {}  # entry id -> (the entry, its request's turn then)
        handle_stopped = self.scheduler._handle_stopped

        def counted(request: Request, was_running: bool) -> bool:
            if request.resumable:
                self.turns[request.request_id] = self.turns.get(request.request_id, 0) + 1
            return handle_stopped(request, was_running)
        self.scheduler._handle_stopped = counted

    @precondition(lambda self: self.engine is not None and self._may_arrive())
    @rule(prompt_len=st.integers(1, 6), tail=st.integers(0, 4), max_tokens=st.integers(1, 3),
          plain=st.integers(0, 2), inputs=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 3)), max_size=2))
    @_step
    def arrive(self, prompt_len: int, tail: int, max_tokens: int, plain: int,
               inputs: list[tuple[int, int]]) -> None:
        """An arrival: a session (unless `plain` is 2) whose client sends
        `inputs` after its prompt, those that fit below max_model_len, then
        the end of the session."""
        slot = len(self.ledger.requests)
        length = max(1, min(prompt_len, self.cfg.max_model_len - 1 - max_tokens))
        request = Request(f"r{slot}", prompt_tokens(slot, 0, max(0, length - tail), length),
                          SamplingParams(max_tokens=max_tokens), eos_token_id=EOS)
        session: tuple[tuple[int, int], ...] = ()
        live = sum(1 for r in self.ledger.requests if r.resumable and not r.is_finished())
        if plain != 2 and live < MAX_SESSIONS:
            room, kept = self.cfg.max_model_len - 1 - length - max_tokens, []
            for tokens, turn_max in inputs:
                if tokens + turn_max <= room:       # at most every output kept, then the input
                    kept.append((tokens, turn_max))
                    room -= tokens + turn_max
            session = (*kept, END_OF_SESSION)
            request.resumable = True
            self.inputs_to_send[slot] = list(session)
        self.engine.add_request(request)
        _, prompt = self.ledger.arrive(request)
        self._check(spec.Arrive(slot, replace(prompt, session=session)))

    @precondition(lambda self: self.engine is not None and bool(self._senders()))
    @rule(which=st.integers(0, NUM_SLOTS - 1))
    @_step
    def send_input(self, which: int) -> None:
        """The client of the `which`-th session with inputs left sends the
        next: `add_request` under its live id (not resumable: the end)."""
        senders = self._senders()
        slot = senders[which % len(senders)]
        tokens, max_tokens = self.inputs_to_send[slot].pop(0)
        session = self.ledger.requests[slot]
        turn = self.turns.get(session.request_id, 0)
        update = Request(session.request_id,
                         [INPUT_TOKEN_BASE + slot * 1000 + turn * 10 + i for i in range(max(tokens, 1))],
                         SamplingParams(max_tokens=max(max_tokens, 1)), eos_token_id=EOS)
        update.resumable = (tokens, max_tokens) != END_OF_SESSION
        self.engine.add_request(update)
        self._check(spec.SendInput(slot))

    def _senders(self) -> list[int]:
        return [slot for slot, left in sorted(self.inputs_to_send.items())
                if left and not self.ledger.requests[slot].is_finished()]

    def _complete(self, returned: list[Any]) -> None:
        self._turns_before = dict(self.turns)
        super()._complete(returned)

    def _check_streamed(self, batch_id: int | None, output: Any, slot: int, num_output: dict[int, int]) -> None:
        """machine.py's, but for a session whose turn this batch ended: its
        outputs were cleared for the next input, so what was streamed
        (the turn's last tokens) is no longer among them."""
        name = self.ledger.requests[slot].request_id
        if self.turns.get(name, 0) == self._turns_before.get(name, 0):
            super()._check_streamed(batch_id, output, slot, num_output)

    # -- the abstraction's and the checks' session part ---------------------------

    def _abstract(self) -> spec.State:
        """abstraction.py's state, with the sessions' fields, the turn each
        entry was scheduled in, and `kv_holding`."""
        state = abstract(self.scheduler, self.engine, self.ledger)
        requests = list(state.requests)
        for slot, r in enumerate(self.ledger.requests):
            if not r.resumable:
                continue
            finished = r.is_finished()
            queued = tuple(END_OF_SESSION if u is None else (len(u.prompt_token_ids), u.max_tokens)
                           for u in r.streaming_queue)
            requests[slot] = evolve(requests[slot], resumable=True, turn=self.turns.get(r.request_id, 0),
                                    inputs_to_send=() if finished else tuple(self.inputs_to_send.get(slot, ())),
                                    queued_inputs=() if finished else queued)
        for out, _ in self.engine.batch_queue:
            for e in out.entries:
                if id(e) not in self.entry_turns:   # first seen right after the schedule() that made it
                    self.entry_turns[id(e)] = (e, self.turns.get(e.req_id, 0))
        in_flight = tuple(tuple(replace(e, turn=self.entry_turns[id(x)][1]) for e, x in zip(batch, out.entries))
                          for batch, (out, _) in zip(state.in_flight, self.engine.batch_queue))
        holding = tuple(self.ledger.slot_of(r) for r in self.scheduler.kv_holding_waiting)
        return replace(state, requests=tuple(requests), in_flight=in_flight, kv_holding=holding)

    def _check_request_data(self, before: spec.State, output: SchedulerOutput) -> None:
        """machine.py's, with a session's next turn admitted as a new
        request: the workers get its whole table (vLLM's `NewRequestData`)."""
        for slot in before.kv_holding:
            if before.requests[slot].status is spec.Status.WAITING:
                before = before.with_request(slot, block_table=())
        super()._check_request_data(before, output)

    def _check_engine_counts(self, after: spec.State) -> None:
        """machine.py's, with the counts as parked sessions make them:
        `has_unfinished_requests()` leaves them out, as `has_requests()`."""
        unfinished = reset_pause.num_unfinished_requests(after) > 0
        if self.scheduler.has_unfinished_requests() != unfinished:
            self._fail(f"has_unfinished_requests() is {not unfinished} in {spec.describe(after)}")
        if self.scheduler.has_requests() != (unfinished or bool(self.finished_unreported)):
            self._fail(f"has_requests() is {self.scheduler.has_requests()} in {spec.describe(after)}")
        ids = [out.batch_id for out, _ in self.engine.batch_queue if out.batch_id is not None]
        if ids != list(range(self.num_batches - len(ids) + 1, self.num_batches + 1)):
            self._fail(f"batch ids in flight {ids}, {self.num_batches} batches submitted")


# The machine with every configuration under a profile (refused outside SESSIONS_FUZZED_PROFILES).
sessions_machine = machine_per_profile(SessionsRefinementMachine, "streaming-session", SESSIONS_FUZZED_PROFILES)


def sessions_fuzz(steps: int, seed: int, profile: str, steps_per_program: int = 60,
                  shrink: bool = True, mutant: str | None = None) -> str | None:
    """A refinement run with streaming sessions under `profile`, `steps` rule
    steps from `seed`, the reference's `mutant` in force if given; the
    failure (the program, shrunk unless `shrink` is off, and its message),
    or None."""
    return fuzz_machine(sessions_machine(profile), steps, seed, steps_per_program, shrink, mutant)
