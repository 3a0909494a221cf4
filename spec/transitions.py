"""Labelled actions, the step function, and properties of single transitions.

`step(state, cfg, action)` is the spec's next-state relation for one labelled
action; counterexamples and trace replays are lists of these labels. The
transition properties are the parts of S4, S7 and S12 that speak about a
change rather than a state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

from . import cadence_properties, lora_properties
from .actions import Prompt, Sample, abort, arrive, arrive_as, complete_oldest, finish_request
from .config import Config
from .connector_contract import Labels, contract_clauses
from .grammar import compile_grammar, fail_grammar
from .kv_invalid import schedule_reads
from .kv_unwritten import schedule_unwritten_reads
from .kv_reports import fail_kv_load, fail_kv_output, receive_kv, send_kv
from .priority_invariants import running_loop_skips_nothing, victim_leaves_no_trace
from .reset_pause import (reset, rp1_paused_schedules_nothing, rp2_reset_drops_in_flight,
                          rp3_reset_output_never_applied, rp4_prefix_cache_reset,
                          rp5_connector_reset_forgets_offers, set_pause)
from .schedule import Scheduled, schedule
from .session_invariants import ss1_old_output_never_bound
from .sessions import has_sessions, send_input
from .state import FINISHED, Entry, Fate, Pause, Request, State, Status


@dataclass(frozen=True)
class Arrive:
    req: int
    prompt: Prompt

    def __str__(self) -> str:
        p = self.prompt
        return f"arrive r{self.req} (prompt {p.prompt_len}, max_tokens {p.max_tokens}" + \
            (f", labels {list(p.labels)})" if p.labels else ")")


@dataclass(frozen=True)
class ArriveAs(Arrive):
    """An arrival under the name of a finished request (`actions.arrive_as`):
    an Arrive, for every property that speaks of arrivals."""

    name: int

    def __str__(self) -> str:
        return super().__str__().replace(f"arrive r{self.req} ", f"arrive r{self.req} as r{self.name} ", 1)


@dataclass(frozen=True)
class Schedule:
    def __str__(self) -> str:
        return "schedule"


@dataclass(frozen=True)
class CompleteOldest:
    samples: tuple[Sample, ...] = ()

    def __str__(self) -> str:
        parts = []
        for s in self.samples:
            bits = [f"acc={s.num_accepted}"] if s.num_accepted else []
            if s.stop_at is not None:
                bits.append(f"stop@{s.stop_at}")
            if s.next_drafts:
                bits.append(f"drafts={s.next_drafts}")
            if s.illegal_from is not None:
                bits.append(f"illegal@{s.illegal_from}")
            parts.append(",".join(bits) or "tok")
        return "complete oldest" + (f" [{'; '.join(parts)}]" if parts else "")


@dataclass(frozen=True)
class Abort:
    req: int

    def __str__(self) -> str:
        return f"abort r{self.req}"


@dataclass(frozen=True)
class ReceiveKv:
    """The KV connector's `finished_recving` for r's load (kv_reports.receive_kv)."""

    req: int

    def __str__(self) -> str:
        return f"kv received r{self.req}"


@dataclass(frozen=True)
class FailKvLoad:
    """The KV connector's `failed_recving` / `invalid_block_ids` for r's load,
    from block `from_block` of its table on (kv_reports.fail_kv_load)."""

    req: int
    from_block: int

    def __str__(self) -> str:
        return f"kv load failed r{self.req} from block {self.from_block}"


@dataclass(frozen=True)
class FailKvOutput:
    """The load failures one batch output reports, judged jointly
    (kv_reports.fail_kv_output); with one failure it is that `FailKvLoad`.
    The trace checker's label for an output's several `kv_failed` events;
    the explicit search and the Z3 encodings explore `FailKvLoad`
    (docs/kv-connector.md, "One output, several failures")."""

    failures: tuple[FailKvLoad, ...]

    def __str__(self) -> str:
        return "kv loads failed " + ", ".join(f"r{f.req} from block {f.from_block}" for f in self.failures)


@dataclass(frozen=True)
class SendKv:
    """The KV connector's `finished_sending` for r (kv_reports.send_kv)."""

    req: int

    def __str__(self) -> str:
        return f"kv sent r{self.req}"


@dataclass(frozen=True)
class SendInput:
    """A streaming session's client sends its next input: vLLM's
    `add_request` under the session's live id (sessions.send_input)."""

    req: int

    def __str__(self) -> str:
        return f"send input r{self.req}"


# The connector's reports: environment actions, each enabled only with a connector.
KV_REPORTS = (ReceiveKv, FailKvLoad, SendKv)


@dataclass(frozen=True)
class Reset:
    """`reset_prefix_cache(reset_running_requests=running, reset_connector=connector)` (reset_pause.reset)."""

    running: bool
    connector: bool = False

    def __str__(self) -> str:
        return ("reset prefix cache" + (" and running requests" if self.running else "")
                + (" and the connector's cache" if self.connector else ""))


@dataclass(frozen=True)
class SetPause:
    """`set_pause_state(pause)` (reset_pause.set_pause)."""

    pause: Pause

    def __str__(self) -> str:
        return f"pause {self.pause.value}"


@dataclass(frozen=True)
class CompileGrammar:
    """r's structured-output grammar compiled (grammar.compile_grammar)."""

    req: int

    def __str__(self) -> str:
        return f"grammar compiled r{self.req}"


@dataclass(frozen=True)
class FailGrammar:
    """r's structured-output grammar failed to compile (grammar.fail_grammar)."""

    req: int

    def __str__(self) -> str:
        return f"grammar failed r{self.req}"


# The grammar backend's events: environment actions, enabled only with structured output.
GRAMMAR_EVENTS = (CompileGrammar, FailGrammar)

Action = Union[Arrive, ArriveAs, Schedule, CompleteOldest, Abort, ReceiveKv, FailKvLoad, FailKvOutput, SendKv,
               SendInput, Reset, SetPause, CompileGrammar, FailGrammar]


def step(state: State, cfg: Config, action: Action) -> State | None:
    """The successor of `state` under `action`, or None if it is disabled."""
    if isinstance(action, ArriveAs):
        return arrive_as(state, cfg, action.req, action.prompt, action.name)
    if isinstance(action, Arrive):
        return arrive(state, cfg, action.req, action.prompt)
    if isinstance(action, Schedule):
        scheduled = schedule(state, cfg)
        return None if scheduled is None else scheduled.state
    if isinstance(action, CompleteOldest):
        return complete_oldest(state, cfg, action.samples)
    if isinstance(action, Abort):
        return abort(state, cfg, action.req)
    if isinstance(action, ReceiveKv):
        return receive_kv(state, cfg, action.req)
    if isinstance(action, FailKvLoad):
        return fail_kv_load(state, cfg, action.req, action.from_block)
    if isinstance(action, FailKvOutput):
        return fail_kv_output(state, cfg, tuple((f.req, f.from_block) for f in action.failures))
    if isinstance(action, SendKv):
        return send_kv(state, cfg, action.req)
    if isinstance(action, CompileGrammar):
        return compile_grammar(state, cfg, action.req)
    if isinstance(action, FailGrammar):
        return fail_grammar(state, cfg, action.req)
    if isinstance(action, SendInput):
        return send_input(state, cfg, action.req, finish_request)
    if isinstance(action, Reset):
        return reset(state, cfg, action.running, action.connector)
    if isinstance(action, SetPause):
        return set_pause(state, cfg, action.pause)
    raise TypeError(f"not an action: {action!r}")


def _same_snapshot(a: Entry, b: Entry) -> bool:
    return (a.req, a.start, a.n, a.samples, a.drafts) == (b.req, b.start, b.n, b.samples, b.drafts)


def s4_snapshot_immutability(before: State, after: State, action: Action, cfg: Config) -> bool:
    """A batch's snapshot never changes while it is in flight; only its entries' fates move on."""
    kept = before.in_flight[1:] if isinstance(action, CompleteOldest) else before.in_flight
    if len(after.in_flight) < len(kept):
        return False
    # x == y (compared in C, entries by identity first) settles the common
    # case, a batch no fate of which changed, without a look at its entries
    return all(x == y or (len(x) == len(y) and all(_same_snapshot(a, b) for a, b in zip(x, y)))
               for x, y in zip(kept, after.in_flight))


_FATE_ORDER = {Fate.LIVE: 0, Fate.ORPHANED: 1, Fate.SUPERSEDED: 2}


def s13_fates_only_age(before: State, after: State, action: Action, cfg: Config) -> bool:
    """An entry's fate only moves LIVE -> ORPHANED -> SUPERSEDED: an output is never rebound to a newer incarnation."""
    kept = before.in_flight[1:] if isinstance(action, CompleteOldest) else before.in_flight
    return all(x == y or all(_FATE_ORDER[a.fate] <= _FATE_ORDER[b.fate] for a, b in zip(x, y))
               for x, y in zip(kept, after.in_flight))


def s12_status_monotonicity(before: State, after: State, action: Action, cfg: Config) -> bool:
    """Finished states are absorbing, a finished request gains no tokens, only schedule moves a request to RUNNING, and never in a step that preempted."""
    if not all(status_only_moves_forward(b, a, action) for b, a in zip(before.requests, after.requests)):
        return False
    if isinstance(action, Schedule):
        return s12_no_admission_after_preemption(before, schedule(before, cfg))  # deterministic: the step's own record
    return True


def status_only_moves_forward(before: Request, after: Request, action: Action) -> bool:
    """S12 for one request: `before` and `after` are its records across the step.
    A request whose record the step did not replace satisfies it trivially."""
    if before is after:
        return True
    if before.status in FINISHED and (after.status != before.status or after.num_output != before.num_output):
        return False
    if before.status is Status.NEW and after.status is not Status.NEW and not isinstance(action, Arrive):
        return False
    return not (after.status is Status.RUNNING and before.status is not Status.RUNNING
                and not isinstance(action, Schedule))


def s12_no_admission_after_preemption(before: State, scheduled: Scheduled | None) -> bool:
    """S12 for a schedule step, given its record: a step that preempted admits nobody."""
    if scheduled is None or not scheduled.preempted:
        return True
    return not any(before.requests[e.req].status is not Status.RUNNING or e.req in scheduled.preempted
                   for e in scheduled.entries)


def s7p_binding_by_incarnation(before: State, after: State, action: Action, cfg: Config) -> bool:
    """S7': a completion appends tokens only to the incarnations its entries were scheduled for (by slot, not by name)."""
    if not isinstance(action, CompleteOldest) or not before.in_flight:
        return True
    own = {e.req for e in before.in_flight[0]}
    return all(r in own or a.num_output == b.num_output
               for r, (b, a) in enumerate(zip(before.requests, after.requests)))


# --- the KV connector's transition properties (docs/kv-connector.md)


def kv3_rollback_restores_counters(before: State, after: State, action: Action, cfg: Config) -> bool:
    """KV3: after a recompute rollback of a failed load, num_computed is the valid prefix, no live entry of the request reaches past it, and its in-flight, stale and placeholder counters count exactly the entries still live (vLLM #49250: placeholders)."""
    if not isinstance(action, (FailKvLoad, FailKvOutput)) or cfg.kv_connector is None:
        return True
    if cfg.kv_connector.load_failure_policy != "recompute":
        return True
    if isinstance(action, FailKvOutput):
        return all(_kv3_restored(after, f, cfg, joint=True) for f in action.failures)
    return _kv3_restored(after, action, cfg, joint=False)


def _kv3_restored(after: State, action: FailKvLoad, cfg: Config, joint: bool) -> bool:
    """KV3 for one failure. Alone, the request's valid prefix is its failed
    block's start; in an output with others (kv_reports.fail_kv_output) it
    may be earlier (an invalid block of another load it holds) or, where an
    earlier holder took every invalid block it holds, past it: it keeps them
    and loses only the carrying batch's tokens (no entry left live)."""
    r, q = action.req, after.requests[action.req]
    if q.status.is_finished:
        return True                     # a loader aborted since: the failure rolls back only its sharers
    valid = action.from_block * cfg.block_size
    kept = joint and (q.num_computed < valid or not after.entries_of(r))
    if q.num_computed != valid and not kept:
        return False
    live = after.entries_of(r)
    if any(e.end > q.num_computed for e in live):
        return False
    if not cfg.rules.stale_output_counters:
        return True
    every = after.entries_of(r, fate=None)
    return (q.num_in_flight == sum(e.n for e in every)
            and q.num_stale == sum(e.n for e in every if e.fate is not Fate.LIVE)
            and q.placeholders == (sum(1 + e.drafts for e in live if e.samples)
                                   if cfg.rules.output_placeholders else 0))


def p_kv_preemption_frees(before: State, after: State, action: Action, cfg: Config) -> bool:
    """P_KV_preemption_frees (progress): a preemption chosen to make room frees the victim's blocks at once, none put aside behind the step fence (vLLM #49674: a fenced victim's preemption frees nothing for the request it makes room for)."""
    if not isinstance(action, Schedule) or cfg.kv_connector is None:
        return True
    scheduled = schedule(before, cfg)
    if scheduled is None or not scheduled.preempted:
        return True
    return len(after.deferred_frees) == len(before.deferred_frees)


def kv7_no_compute_on_invalid_kv(before: State, after: State, action: Action, cfg: Config) -> bool:
    """KV7: no entry of a batch computes on a block a failed sync load left invalid (in its computed prefix) unless the batch itself recomputes the block; checked where `Config.check_invalid_kv` makes `invalid_kv` part of the state (spec/kv_invalid.py; vLLM #37827, finding 7)."""
    return not isinstance(action, Schedule) or not schedule_reads(before, after, cfg)


def kv8_no_hit_on_unwritten_kv(before: State, after: State, action: Action, cfg: Config) -> bool:
    """KV8: no entry of a batch has in its computed prefix a block cached for a chunk a priority preemption took back in its own call, unless the batch writes the block; checked where `Config.check_unwritten_kv` makes `unwritten_kv` part of the state (spec/kv_unwritten.py; docs/vllm-unwritten-kv-findings.md, finding 1)."""
    return not isinstance(action, Schedule) or not schedule_unwritten_reads(before, after, cfg)


# --- the priority policy's step properties (priority_invariants.py)


def pr2_victim_leaves_no_trace(before: State, after: State, action: Action, cfg: Config) -> bool:
    """PR2: a request preempted in a schedule step leaves no trace in the batch it forms: no entry (tokens or drafts), no block, and the batch within the budget (vLLM #23347, #28558)."""
    return not isinstance(action, Schedule) or victim_leaves_no_trace(after, schedule(before, cfg), cfg)


def pr3_running_loop_skips_nothing(before: State, after: State, action: Action, cfg: Config) -> bool:
    """PR3 (progress): a running request left out of a schedule step's batch had nothing to schedule, or the step spent its token budget (vLLM #49097: a request passed over when the victim sat before the loop's index)."""
    return not isinstance(action, Schedule) or running_loop_skips_nothing(before, after, schedule(before, cfg), cfg)


def ss1_session_binding(before: State, after: State, action: Action, cfg: Config) -> bool:
    if not isinstance(action, CompleteOldest) or not before.in_flight:
        return True
    return ss1_old_output_never_bound(before, after, before.in_flight[0], cfg)


ss1_session_binding.__doc__ = ss1_old_output_never_bound.__doc__


# --- reset and pause (reset_pause.py): RP1-RP5 on their labelled actions


def rp1_pause(before: State, after: State, action: Action, cfg: Config) -> bool:
    """RP1_paused_schedules_nothing: under PAUSED_ALL a schedule forms no entry and preempts nobody; under PAUSED_NEW it schedules only requests that were RUNNING before it or hold KV blocks (a session's next turn)."""
    if not isinstance(action, Schedule) or before.pause is Pause.UNPAUSED:
        return True
    scheduled = schedule(before, cfg)
    return scheduled is None or rp1_paused_schedules_nothing(before, after, scheduled.entries, scheduled.preempted)


def rp2_reset(before: State, after: State, action: Action, cfg: Config) -> bool:
    """RP2_reset_drops_in_flight: after a reset of the running requests none runs, and each one reset has every entry in flight marked and not live, drop mode on, stale = in flight, no placeholders."""
    return not isinstance(action, Reset) or rp2_reset_drops_in_flight(before, after, action.running)


def rp3_reset_output(before: State, after: State, action: Action, cfg: Config) -> bool:
    """RP3_reset_output_never_applied: a completion applies no output of an entry in flight at its request's reset."""
    return not isinstance(action, CompleteOldest) or rp3_reset_output_never_applied(before, after)


def rp4_cache(before: State, after: State, action: Action, cfg: Config) -> bool:
    """RP4_prefix_cache_reset: after a reset of the running requests no block is held and no label cached; without them, every label cleared or (a block held) nothing changed."""
    return not isinstance(action, Reset) or rp4_prefix_cache_reset(before, after, action.running)


def rp5_connector_reset(before: State, after: State, action: Action, cfg: Config) -> bool:
    """RP5_connector_reset_forgets_offers: no request whose offer a reset of the connector's cache forgot is admitted with, or parks for, an external load."""
    if not isinstance(action, Schedule) or not any(q.offer_reset for q in before.requests):
        return True
    scheduled = schedule(before, cfg)
    return scheduled is None or rp5_connector_reset_forgets_offers(before, after, scheduled.entries)


# --- the prefill cadence (cadence.py, cadence_properties.py): on each schedule step


def cad1(before: State, after: State, action: Action, cfg: Config) -> bool:
    return _on_schedule(before, action, cfg, cadence_properties.cad1_deferred_call_carries_no_prefill)


def cad2(before: State, after: State, action: Action, cfg: Config) -> bool:
    return _on_schedule(before, action, cfg, cadence_properties.cad2_backed_up_queue_not_held)


def _on_schedule(before: State, action: Action, cfg: Config, prop: Callable) -> bool:
    if not isinstance(action, Schedule):
        return True
    scheduled = schedule(before, cfg)
    return scheduled is None or prop(before, scheduled, cfg)


def cad3(before: State, after: State, action: Action, cfg: Config) -> bool:
    return _on_schedule(before, action, cfg, cadence_properties.cad3_hold_restarts_after_prefill)


def lora2(before: State, after: State, action: Action, cfg: Config) -> bool:
    return _on_schedule(before, action, cfg, lora_properties.lora2_held_request_is_passed_over)


def pl1(before: State, after: State, action: Action, cfg: Config) -> bool:
    return _on_schedule(before, action, cfg, lora_properties.pl1_prompt_logprobs_read_no_cache)


lora2.__doc__ = lora_properties.lora2_held_request_is_passed_over.__doc__
pl1.__doc__ = lora_properties.pl1_prompt_logprobs_read_no_cache.__doc__
cad1.__doc__ = cadence_properties.cad1_deferred_call_carries_no_prefill.__doc__
cad2.__doc__ = cadence_properties.cad2_backed_up_queue_not_held.__doc__
cad3.__doc__ = cadence_properties.cad3_hold_restarts_after_prefill.__doc__


@dataclass(frozen=True)
class TransitionProperty:
    name: str
    predicate: Callable[[State, State, Action, Config], bool]

    @property
    def statement(self) -> str:
        return (self.predicate.__doc__ or "").strip()

    def holds(self, before: State, after: State, action: Action, cfg: Config) -> bool:
        return self.predicate(before, after, action, cfg)


TRANSITION_PROPERTIES: tuple[TransitionProperty, ...] = (
    TransitionProperty("S4_snapshot_immutability", s4_snapshot_immutability),
    TransitionProperty("S13_fates_only_age", s13_fates_only_age),
    TransitionProperty("S12_status_monotonicity", s12_status_monotonicity),
)

# Properties of the profiles with stale-output counters and outputs looked up
# by name (vLLM 0.33): S7' restates S7's binding for a name that may be reused.
INCARNATION_PROPERTIES: tuple[TransitionProperty, ...] = (
    TransitionProperty("S7p_binding_by_incarnation", s7p_binding_by_incarnation),
)


# With a KV connector: KV3 where loads can fail, P_KV_preemption_frees always.
KV_TRANSITION_PROPERTIES: tuple[TransitionProperty, ...] = (
    TransitionProperty("KV3_rollback_restores_counters", kv3_rollback_restores_counters),
    TransitionProperty("P_KV_preemption_frees", p_kv_preemption_frees),
)

# Under the priority policy (checked first: a victim left in the batch breaks S12 too).
PRIORITY_PROPERTIES: tuple[TransitionProperty, ...] = (
    TransitionProperty("PR2_victim_leaves_no_trace", pr2_victim_leaves_no_trace),
    TransitionProperty("PR3_running_loop_skips_nothing", pr3_running_loop_skips_nothing),
)

# The KV connector's contract (connector_contract.py): properties of the
# environment, checked on every step of a configuration with a connector.
CONTRACT_PROPERTIES: tuple[TransitionProperty, ...] = tuple(
    TransitionProperty(name, clause)
    for name, clause in contract_clauses(Labels(Schedule, ReceiveKv, FailKvLoad, SendKv)))


# With `Config.reset_and_pause`.
RESET_PAUSE_PROPERTIES: tuple[TransitionProperty, ...] = (
    TransitionProperty("RP1_paused_schedules_nothing", rp1_pause),
    TransitionProperty("RP2_reset_drops_in_flight", rp2_reset),
    TransitionProperty("RP3_reset_output_never_applied", rp3_reset_output),
    TransitionProperty("RP4_prefix_cache_reset", rp4_cache),
)
# With reset and pause beside a KV connector.
CONNECTOR_RESET_PROPERTY = TransitionProperty("RP5_connector_reset_forgets_offers", rp5_connector_reset)
# KV7, where a model makes `invalid_kv` part of the state (`Config.check_invalid_kv`).
INVALID_KV_PROPERTY = TransitionProperty("KV7_no_compute_on_invalid_kv", kv7_no_compute_on_invalid_kv)
# KV8, where a model makes `unwritten_kv` part of the state (`Config.check_unwritten_kv`).
UNWRITTEN_KV_PROPERTY = TransitionProperty("KV8_no_hit_on_unwritten_kv", kv8_no_hit_on_unwritten_kv)


# With the prefill cadence (`Config.prefill_schedule_interval` > 1).
CADENCE_PROPERTIES: tuple[TransitionProperty, ...] = (
    TransitionProperty("CAD1_deferred_call_carries_no_prefill", cad1),
    TransitionProperty("CAD2_backed_up_queue_not_held", cad2),
    TransitionProperty("CAD3_hold_restarts_after_prefill", cad3),
)


def transition_properties_for(cfg: Config) -> tuple[TransitionProperty, ...]:
    """The transition properties of cfg's profile: every profile's, S7'
    where outputs are looked up by name, and with a KV connector KV3 (where
    the profile has load failures), P_KV_preemption_frees and the
    connector's contract (C1-C5); under the priority policy PR2 and PR3 first, SS1
    with streaming sessions, and RP1-RP4 with reset and pause (RP5 beside a
    connector); LORA2 with a
    LoRA cap and PL1 where requests may ask for prompt logprobs."""
    chosen = TRANSITION_PROPERTIES + (INCARNATION_PROPERTIES if cfg.rules.stale_output_counters else ())
    if cfg.scheduling_policy == "priority":
        chosen = PRIORITY_PROPERTIES + chosen + ((UNWRITTEN_KV_PROPERTY,) if cfg.check_unwritten_kv else ())
    if cfg.kv_connector is not None:
        chosen += tuple(p for p in KV_TRANSITION_PROPERTIES
                        if p.name != "KV3_rollback_restores_counters" or cfg.rules.kv_load_failures)
        chosen += CONTRACT_PROPERTIES
        chosen += (INVALID_KV_PROPERTY,) if cfg.check_invalid_kv else ()
    if has_sessions(cfg):
        chosen += (TransitionProperty("SS1_old_output_never_bound", ss1_session_binding),)
    if cfg.reset_and_pause:
        chosen += RESET_PAUSE_PROPERTIES + ((CONNECTOR_RESET_PROPERTY,) if cfg.kv_connector is not None else ())
    if cfg.prefill_schedule_interval > 1 and cfg.rules.prefill_cadence:
        chosen += CADENCE_PROPERTIES
    if cfg.max_loras:
        chosen += (TransitionProperty("LORA2_held_request_is_passed_over", lora2),)
    if cfg.prompt_logprobs and cfg.prefix_caching:
        chosen += (TransitionProperty("PL1_prompt_logprobs_read_no_cache", pl1),)
    return chosen
