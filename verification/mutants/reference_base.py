"""What a reference mutant is (reference.py holds them): its name, its
history, its edits of the reference scheduler's steps and the profile it is
fuzzed under; `_edit` names a step by the short name of its module
("scheduler.Scheduler._preempt"), `_mutant` makes one. Kept apart so that
each feature's reference mutants (reference_kv.py) can be written beside
reference.py without importing it.
"""

from __future__ import annotations

from dataclasses import dataclass

from flightcheck.verification.mutants.patch import Edit

# The reference modules a mutant may edit methods of, by the short name a
# target is written with ("scheduler.Scheduler._preempt").
REFERENCE_MODULES: dict[str, str] = {
    "scheduler": "flightcheck.reference.scheduler",
    "update": "flightcheck.reference.update",
    "kv_transfer": "flightcheck.reference.kv_transfer",      # the KV connector's steps
    "kv_waiting": "flightcheck.reference.kv_waiting",
    "priority": "flightcheck.reference.priority",            # the priority policy
    "sessions": "flightcheck.reference.sessions",             # streaming sessions' steps
    "grammar": "flightcheck.reference.grammar",               # structured output's steps
    "reset_pause": "flightcheck.reference.reset_pause",       # the reset and the pause
    "lora": "flightcheck.reference.lora",                     # LoRA's max_loras cap
    "waiting": "flightcheck.reference.waiting",               # the waiting loop (the cap's skip)
    "kv_cache_manager": "flightcheck.reference.kv_cache_manager",   # the prompt-logprobs limit
}


@dataclass(frozen=True)
class ReferenceMutant:
    name: str
    history: str                    # the bug, where it comes from (one line of --list-mutants lore)
    edits: tuple[Edit, ...]         # applied in order; several may edit one method
    profile: str | None = None      # the one profile it is fuzzed under; None: every profile


def _edit(target: str, old: str, new: str) -> Edit:
    module, function = target.split(".", 1)
    return Edit(REFERENCE_MODULES[module], function, old, new)


def _mutant(name: str, history: str, *edits: Edit, profile: str | None = None) -> ReferenceMutant:
    return ReferenceMutant(name, history, edits, profile)
