"""The registry of the spec's mutants (spec.py holds them as patches): by
name, by the profile each is hunted under, and the spec functions they edit.
(The reference's mutants keep their registry beside their data, reference.py.)

`drifted(m)` is the one drift check, for the spec's mutants and the
reference's alike: the edits of m that no longer apply to the code as it is
now, each with the loud message patch.py gives (which mutant, which
function, what it looked for and how often it was found).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from types import FunctionType

from flightcheck.spec.profiles import PROFILES
from flightcheck.verification.mutants.cadence import CADENCE
from flightcheck.verification.mutants.grammar import GRAMMAR_BUGS
from flightcheck.verification.mutants.kv_connector import KV_CONNECTOR
from flightcheck.verification.mutants.lora import LORA
from flightcheck.verification.mutants.patch import MutantNoLongerApplies, edited_code
from flightcheck.verification.mutants.priority import PRIORITY_BUGS
from flightcheck.verification.mutants.priority_kv import PRIORITY_KV_BUGS
from flightcheck.verification.mutants.reference import ReferenceMutant
from flightcheck.verification.mutants.sessions import SESSION_MUTANTS as _SESSION_MUTANTS
from flightcheck.verification.mutants.reset_pause import RESET_PAUSE
from flightcheck.verification.mutants.spec import (ASYNC_0_33, COUNTERS_0_33, HISTORICAL, SPEC_MODULES, SYNTHETIC,
                                                   Mutant)

_EVERY_PROFILE: tuple[Mutant, ...] = HISTORICAL + SYNTHETIC
_ONE_PROFILE: tuple[Mutant, ...] = COUNTERS_0_33 + ASYNC_0_33

MUTANTS: dict[str, Mutant] = {m.name: m for m in _EVERY_PROFILE}
# profile -> the mutants hunted under it only
PROFILE_MUTANTS: dict[str, dict[str, Mutant]] = {}
for _m in _ONE_PROFILE:
    PROFILE_MUTANTS.setdefault(_m.profile or "", {})[_m.name] = _m
# A profile that follows another (`Profile.follows`) hunts its mutants too.
for _name, _profile in PROFILES.items():
    if _profile.follows in PROFILE_MUTANTS:
        PROFILE_MUTANTS[_name] = PROFILE_MUTANTS[_profile.follows]
# The KV connector's historical bugs (kv_connector.py): hunted only on the
# connector's models (`flightcheck verify --kv-connector`), never in a run
# without a connector, so kept out of MUTANTS and PROFILE_MUTANTS.
KV_MUTANTS: dict[str, Mutant] = {m.name: m for m in KV_CONNECTOR}
# The priority policy's historical bugs (priority.py): hunted only on the
# policy's models, kept out of the runs without it as the connector's are.
PRIORITY_MUTANTS: dict[str, Mutant] = {m.name: m for m in PRIORITY_BUGS}
# Where the policy meets the connector (priority_kv.py): hunted only on the
# models that have both (priority_kv_models.py), likewise.
PRIORITY_KV_MUTANTS: dict[str, Mutant] = {m.name: m for m in PRIORITY_KV_BUGS}
# Streaming sessions' bugs (sessions.py): hunted only on the session models
# (`flightcheck verify --sessions`), as the connector's are.
SESSION_MUTANTS: dict[str, Mutant] = {m.name: m for m in _SESSION_MUTANTS}
# Reset and pause's (reset_pause.py): hunted only on their own models, likewise.
RESET_PAUSE_MUTANTS: dict[str, Mutant] = {m.name: m for m in RESET_PAUSE}
# Structured output's bugs (grammar.py): hunted only on the grammar models.
GRAMMAR_MUTANTS: dict[str, Mutant] = {m.name: m for m in GRAMMAR_BUGS}
# The prefill cadence's (cadence.py): hunted only on the cadence models.
CADENCE_MUTANTS: dict[str, Mutant] = {m.name: m for m in CADENCE}
# LoRA's cap and the prompt-logprobs limit (lora.py): hunted only on the LoRA models.
LORA_MUTANTS: dict[str, Mutant] = {m.name: m for m in LORA}
ALL_MUTANTS: dict[str, Mutant] = (MUTANTS | {m.name: m for m in _ONE_PROFILE} | KV_MUTANTS | PRIORITY_MUTANTS
                                  | PRIORITY_KV_MUTANTS | SESSION_MUTANTS | RESET_PAUSE_MUTANTS | GRAMMAR_MUTANTS
                                  | CADENCE_MUTANTS | LORA_MUTANTS)


def spec_function(target: str) -> FunctionType:
    """The spec function named "module.function" (its code swapped while a
    mutant that edits it is applied; the object stays)."""
    module_name, function_name = target.split(".")
    return getattr(importlib.import_module(SPEC_MODULES[module_name]), function_name)


class _Originals(Mapping[str, FunctionType]):
    """The spec functions some mutant edits, "module.function" -> the
    function object, each looked up when first asked: a fabricated KV
    connector edits the explicit search's environment, a module that
    imports this registry (through verification/models.py)."""

    def __init__(self, targets: list[str]) -> None:
        self._targets = list(dict.fromkeys(targets))

    def __getitem__(self, target: str) -> FunctionType:
        if target not in self._targets:
            raise KeyError(target)
        return spec_function(target)

    def __iter__(self) -> Iterator[str]:
        return iter(self._targets)

    def __len__(self) -> int:
        return len(self._targets)


ORIGINALS: Mapping[str, FunctionType] = _Originals([target for m in ALL_MUTANTS.values() for target in m.targets])


def mutant(name: str) -> Mutant:
    """The mutant called `name` (of every profile, or of one); ValueError
    naming the known ones otherwise."""
    if name in ALL_MUTANTS:
        return ALL_MUTANTS[name]
    raise ValueError(f"unknown mutant {name!r}; known: {', '.join(ALL_MUTANTS)}")


def mutants_of(profile: str) -> list[str]:
    """The mutants hunted under `profile`: every profile's, then its own."""
    return list(MUTANTS) + list(PROFILE_MUTANTS.get(profile, {}))


def kv_mutants_of(profile: str) -> list[str]:
    """The KV connector mutants hunted under `profile` (with --kv-connector)."""
    return [name for name, m in KV_MUTANTS.items() if m.profile == profile]


def drifted(m: Mutant | ReferenceMutant) -> list[str]:
    """Why m (a spec or a reference mutant) no longer applies to the code as
    it is now: one message per function whose edits fail (empty when every
    edit applies)."""
    failures = []
    for where in dict.fromkeys(e.where for e in m.edits):
        try:
            edited_code(m.name, tuple(e for e in m.edits if e.where == where))
        except MutantNoLongerApplies as failure:
            failures.append(str(failure))
    return failures


def stale_fingerprints(m: Mutant) -> list[str]:
    """The spec functions m edits whose edits no longer apply (the name this
    check had when mutants were copied functions checked by a hash)."""
    stale = []
    for target in m.targets:
        try:
            edited_code(m.name, m.edits_of(target))
        except MutantNoLongerApplies:
            stale.append(target)
    return stale
