"""Every request feature's invariants in Z3, by the spec's invariant name:
the table the feature engines (z3/kv_engines.py) read. A feature beyond the
plain scheduler (the KV connector; priority, structured output, streaming
sessions and priority beside them, reset and pause, the prefill cadence, the LoRA cap) writes its formulas in a
module of its own, clause for clause after the spec's predicates, and adds
them here: one line per feature, so the engines need no edit for a new one.

FORMULAS: the feature invariants a model's profile has (spec.invariants_for)
and the engines prove or bound. AUXILIARY: the feature's helper invariants,
which make them inductive on its models (proved alongside, reported as
auxiliary).
"""

from __future__ import annotations

from typing import Any, Callable

from flightcheck.verification.z3.encoding.cadence_invariants import CAD_AUXILIARY
from flightcheck.verification.z3.encoding.kv_invalid_formulas import KV7_AUXILIARY
from flightcheck.verification.z3.encoding.kv_invariants import KV_AUXILIARY, KV_FORMULAS
from flightcheck.verification.z3.encoding.lora_invariants import LORA_AUXILIARY, LORA_FORMULAS
from flightcheck.verification.z3.encoding.session_invariants import SESSION_AUXILIARY, SESSION_FORMULAS
from flightcheck.verification.z3.encoding.unwritten_formulas import UNWRITTEN_AUXILIARY
from flightcheck.verification.z3.encoding.priority_invariants import (PRIORITY_AUXILIARY, PRIORITY_FORMULAS,
                                                                    PRIORITY_KV_AUXILIARY)
from flightcheck.verification.z3.encoding.priority_session_invariants import (PRIORITY_SESSION_AUXILIARY,
                                                                            PRIORITY_SESSION_FORMULAS)
from flightcheck.verification.z3.encoding.reset_pause_invariants import RP_AUXILIARY, RP_KV_AUXILIARY
from flightcheck.verification.z3.encoding.state import Layout, SState
from flightcheck.verification.z3.encoding.structured_output_invariants import GRAMMAR_AUXILIARY, GRAMMAR_FORMULAS

Formula = Callable[[Layout, SState], Any]

FORMULAS: dict[str, Formula] = {**KV_FORMULAS, **SESSION_FORMULAS, **PRIORITY_FORMULAS}
AUXILIARY: dict[str, Formula] = {**KV_AUXILIARY, **SESSION_AUXILIARY, **RP_AUXILIARY, **PRIORITY_AUXILIARY}
FORMULAS.update(GRAMMAR_FORMULAS); AUXILIARY.update(GRAMMAR_AUXILIARY)     # structured output (G1-G3)
AUXILIARY.update(PRIORITY_KV_AUXILIARY)     # the priority policy beside the connector (PR4's proof)
AUXILIARY.update(CAD_AUXILIARY)     # the prefill cadence (CAD1-CAD3 are of steps: z3/cadence_engines.py)
FORMULAS.update(LORA_FORMULAS); AUXILIARY.update(LORA_AUXILIARY)   # the LoRA cap (LORA1; LORA2, PL1: z3/lora_engines.py)
FORMULAS.update(PRIORITY_SESSION_FORMULAS); AUXILIARY.update(PRIORITY_SESSION_AUXILIARY)   # priority beside sessions (SS5)
AUXILIARY.update(RP_KV_AUXILIARY)   # reset and pause beside the connector (RP5's proof)
AUXILIARY.update(UNWRITTEN_AUXILIARY)   # KV8's under finding 1's fix (KVU1: z3/priority_engines.py)
AUXILIARY.update(KV7_AUXILIARY)     # KV7's strengthening (KV7 is of steps: z3/kv_invalid_engines.py)
