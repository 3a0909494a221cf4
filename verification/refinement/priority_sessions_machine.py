"""The refinement fuzzer with streaming sessions under the priority policy
(docs/request-states.md, "Features together"): sessions_machine.py's machine
with every configuration under `SchedulerConfig.scheduling_policy =
"priority"`, so that the reference's rules where the two meet are checked
against the spec's step by step, under vLLM 0.33 and 0.34, sync and async
(`PRIORITY_SESSIONS_FUZZED_PROFILES`):

* a session keeps the priority of its first input: each arrival draws a
  priority (0 to 2, equal ones often), and each later input another, which
  the reference must ignore (vLLM's `StreamingUpdate` carries none);
* a session takes each input's arrival time when it takes the input
  (`_update_request_as_session`: `session.arrival_time =
  update.arrival_time`): every arrival and every input is stamped by one
  clock, in the order the client sends them;
* a stopping session is pushed onto its queue (`waiting`, or
  `kv_holding_waiting` while it holds computed tokens) at its rank;
* the running loop's victim is the running request of the largest
  (priority, arrival time), a session's arrival time its last input's: so
  the pool is drawn from one request's worth to the sessions machine's
  (`room`), and prompts and turns are longer at times (up to the model
  length, up to 12 tokens). With the sessions machine's short requests and
  roomy pool no request was ever preempted in 4,000 steps; with these,
  preemption is common (tests/test_refinement_priority_sessions.py counts it).

The abstraction adds the spec's `arrivals` (spec/priority.py `rank`: a
request's first place is its arrival time, its later places the inputs its
client sent that it has not taken yet): every slot at its `arrival_time`,
and again at each input waiting in its `streaming_queue`, in time order.

SS5 (spec/session_invariants.py) is held to the reference's own state
before the refinement map, as LoRA's properties are in lora_machine.py: a
reference that leaves a queue out of rank order is named by SS5. vLLM breaks
SS5 itself where a parked session takes an input (its key grows inside the
heap, not re-sorted: "Finding: a session's input reorders a priority heap"),
and the spec and the correct reference, which read vLLM, break it there
alike; so a queue out of order is vLLM's own break exactly when it is in
order without the sessions re-keyed in place (an input taken while parked;
each leaves that set when it leaves its queue), and the machine counts such
states (`num_vllm_heap_breaks`) instead of failing.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from flightcheck import spec
from flightcheck.reference import Request, SchedulerConfig
from flightcheck.reference.config import cdiv
from flightcheck.spec import priority
from flightcheck.spec.sessions import END_OF_SESSION
from flightcheck.verification.refinement.bounded_run import fuzz_machine, machine_per_profile
from flightcheck.verification.refinement.checks import AbortMany
from flightcheck.verification.refinement.sessions_machine import MAX_SESSIONS, SessionsRefinementMachine
from flightcheck.verification.refinement.strategies import NUM_SLOTS

PRIORITY_SESSIONS_FUZZED_PROFILES: tuple[str, ...] = ("vllm-0.34", "vllm-0.34-async", "vllm-0.33", "vllm-0.33-async")
SS5 = "SS5_session_queues_in_priority_order"


class PrioritySessionsRefinementMachine(SessionsRefinementMachine):
    """SessionsRefinementMachine under the priority policy (the module doc)."""

    profile = PRIORITY_SESSIONS_FUZZED_PROFILES[0]
    clock = 0                           # the last stamp given (an arrival or an input)
    num_vllm_heap_breaks = 0            # states where SS5 broke as vLLM breaks it

    @initialize(data=st.data(), sample_every_chunk=st.booleans(), room=st.integers(1, MAX_SESSIONS + 1))
    def setup(self, data: Any, sample_every_chunk: bool, room: int) -> None:
        """sessions_machine.py's setup, the pool drawn from one request's
        worth (preemption, where the policy picks its victim by priority and
        arrival) to the sessions machine's (the module doc)."""
        self._next_priority, self._room = 0, room
        self.rekeyed: set[int] = set()  # sessions that took an input in place, still in their queue
        SessionsRefinementMachine.setup(self, data=data, sample_every_chunk=sample_every_chunk)

    def _configured(self, cfg: SchedulerConfig) -> SchedulerConfig:
        roomy = SessionsRefinementMachine._configured(self, cfg)
        per_request = cdiv(cfg.max_model_len, cfg.block_size)
        return replace(roomy, scheduling_policy="priority", num_blocks=max(cfg.num_blocks, self._room * per_request))

    @precondition(lambda self: self.engine is not None and self._may_arrive())
    @rule(prompt_len=st.integers(1, 6) | st.integers(7, 16), tail=st.integers(0, 4),
          max_tokens=st.integers(1, 3) | st.integers(4, 12),
          plain=st.integers(0, 2), inputs=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 3)), max_size=2),
          priority=st.integers(0, 2))
    def arrive(self, prompt_len: int, tail: int, max_tokens: int, plain: int,
               inputs: list[tuple[int, int]], priority: int) -> None:
        """sessions_machine.py's arrival, with a priority."""
        self._next_priority = priority
        SessionsRefinementMachine.arrive(self, prompt_len=prompt_len, tail=tail, max_tokens=max_tokens,
                                         plain=plain, inputs=inputs)

    @precondition(lambda self: self.engine is not None and bool(self._senders()))
    @rule(which=st.integers(0, NUM_SLOTS - 1), priority=st.integers(0, 2))
    def send_input(self, which: int, priority: int) -> None:
        """sessions_machine.py's input, carrying a priority the session must
        not take; one that finds its session parked re-keys it in place."""
        senders = self._senders()
        slot = senders[which % len(senders)]
        if (self.state.requests[slot].status is spec.Status.WAITING_FOR_STREAMING_REQ
                and self.inputs_to_send[slot][0] != END_OF_SESSION):
            self.rekeyed.add(slot)
        self._next_priority = priority
        SessionsRefinementMachine.send_input(self, which=which)

    def _before_add(self, request: Request, slot: int) -> None:
        """Every arrival and every input stamped by the one clock."""
        self.clock += 1
        request.priority, request.arrival_time = self._next_priority, float(self.clock)

    # -- the abstraction's and the checks' priority part -----------------------------

    def _abstract(self) -> spec.State:
        """sessions_machine.py's state, with `arrivals` from the reference's
        arrival times and its sessions' queued inputs (the module doc)."""
        state = SessionsRefinementMachine._abstract(self)
        stamps = [(r.arrival_time, slot) for slot, r in enumerate(self.ledger.requests)]
        stamps += [(update.arrival_time, slot) for slot, r in enumerate(self.ledger.requests)
                   for update in r.streaming_queue or () if update is not None]
        return replace(state, arrivals=tuple(slot for _, slot in sorted(stamps)))

    def _check(self, action: spec.Action | AbortMany, expected: spec.State | None = None) -> None:
        after = self._abstract()
        self.rekeyed &= set(after.waiting) | set(after.kv_holding)
        if not ss5_holds(after, self.spec_cfg, self.rekeyed):
            self._fail(f"{SS5} broken by the reference's `{action}`\n"
                       f"  before:    {spec.describe(self.state)}\n"
                       f"  reference: {spec.describe(after)}")
        super()._check(action, expected)

    def _vllms_own_breaks(self, after: spec.State) -> frozenset[str]:
        """SS5 where vLLM's heap breaks it (the module doc)."""
        if ss5_holds(after, self.spec_cfg, self.rekeyed):
            self.num_vllm_heap_breaks += 1
            return frozenset((SS5,)) | SessionsRefinementMachine._vllms_own_breaks(self, after)
        return SessionsRefinementMachine._vllms_own_breaks(self, after)


def ss5_holds(s: spec.State, cfg: spec.Config, rekeyed: set[int]) -> bool:
    """SS5 on `waiting` and `kv_holding` less the sessions in `rekeyed`:
    each queue in (priority, arrival) order."""
    for queue in (s.waiting, s.kv_holding):
        keys = [priority.rank(s, r) for r in queue if r not in rekeyed]
        if keys != sorted(keys):
            return False
    return True


# The machine with every configuration under a profile (refused outside PRIORITY_SESSIONS_FUZZED_PROFILES).
priority_sessions_machine = machine_per_profile(PrioritySessionsRefinementMachine, "priority-sessions",
                                                PRIORITY_SESSIONS_FUZZED_PROFILES)


def priority_sessions_fuzz(steps: int, seed: int, profile: str, steps_per_program: int = 60,
                           shrink: bool = True, mutant: str | None = None) -> str | None:
    """A refinement run with streaming sessions under the priority policy
    and `profile`, `steps` rule steps from `seed`, the reference's `mutant`
    in force if given; the failure (the program, shrunk unless `shrink` is
    off, and its message), or None."""
    return fuzz_machine(priority_sessions_machine(profile), steps, seed, steps_per_program, shrink, mutant)
