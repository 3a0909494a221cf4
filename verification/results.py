"""What `flightcheck verify` reports: one row per property and method
(`PropertyResult`), and the kind of each property by name (`kind_of`).
Every engine, explicit or Z3, reports in these terms."""

from __future__ import annotations

from dataclasses import dataclass

from flightcheck.spec import COUNTER_INVARIANTS, INVARIANTS, SOMETIMES, TRANSITION_PROPERTIES
from flightcheck.spec.invariants import (ASYNC_INVARIANTS, ASYNC_REPLACEMENTS, GRAMMAR_INVARIANTS, KV_INVARIANTS,
                                         KV_LOAD_LIMIT, PRIORITY_ORDER, SESSION_INVARIANTS)
from flightcheck.spec.sometimes import (ASYNC_SOMETIMES, CADENCE_KV_SOMETIMES, CADENCE_SOMETIMES, KV_SOMETIMES,
                                       LORA_SOMETIMES, SESSION_SOMETIMES)
from flightcheck.spec.transitions import (CADENCE_PROPERTIES, CONNECTOR_RESET_PROPERTY, CONTRACT_PROPERTIES,
                                         INCARNATION_PROPERTIES, INVALID_KV_PROPERTY, KV_TRANSITION_PROPERTIES,
                                         PRIORITY_PROPERTIES, RESET_PAUSE_PROPERTIES, UNWRITTEN_KV_PROPERTY)

SOMETIMES_NAMES = frozenset(s.name for s in SOMETIMES + ASYNC_SOMETIMES + KV_SOMETIMES + SESSION_SOMETIMES
                            + CADENCE_SOMETIMES + CADENCE_KV_SOMETIMES + LORA_SOMETIMES)
# The streaming sessions' transition property (spec/transitions.py `transition_properties_for`).
SESSION_TRANSITION_PROPERTY = "SS1_old_output_never_bound"
# LoRA's cap and the prompt-logprobs limit (spec/lora.py): LORA1, and the transition properties LORA2 and PL1.
LORA_PROPERTIES = ("LORA1_loras_within_cap", "LORA2_held_request_is_passed_over", "PL1_prompt_logprobs_read_no_cache")
# Liveness proper, decided on the whole state graph by explicit search.
LIVENESS_GRAPH = ("L1_L3_every_request_can_finish", "L4_every_run_terminates")


@dataclass
class PropertyResult:
    name: str
    kind: str            # invariant | liveness | sometimes | auxiliary
    status: str          # proved | bounded | reached | violated | unknown
    method: str
    depth: int | None
    seconds: float


def kind_of(name: str) -> str:
    """invariant (transition properties included), liveness (an invariant's
    safety form, or a property of the state graph), sometimes, or auxiliary
    (a strengthening or inferred fact, not a spec property)."""
    if name in SOMETIMES_NAMES:
        return "sometimes"
    if name in LIVENESS_GRAPH:
        return "liveness"
    for inv in (INVARIANTS + COUNTER_INVARIANTS + ASYNC_INVARIANTS + tuple(ASYNC_REPLACEMENTS.values())
                + KV_INVARIANTS + (KV_LOAD_LIMIT,) + SESSION_INVARIANTS + GRAMMAR_INVARIANTS + (PRIORITY_ORDER,)):
        if inv.name == name:
            return inv.kind
    if any(p.name == name for p in TRANSITION_PROPERTIES + INCARNATION_PROPERTIES + KV_TRANSITION_PROPERTIES
                                   + CONTRACT_PROPERTIES + PRIORITY_PROPERTIES + RESET_PAUSE_PROPERTIES
                                   + (CONNECTOR_RESET_PROPERTY, INVALID_KV_PROPERTY, UNWRITTEN_KV_PROPERTY) + CADENCE_PROPERTIES) \
            or name == SESSION_TRANSITION_PROPERTY or name in LORA_PROPERTIES:
        return "invariant"
    return "auxiliary"
