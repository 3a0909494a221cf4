"""One profile constant at a time: the trial profiles behind `flightcheck vllm
fit`'s `explained_by`.

A profile is a frozen dataclass of named constants, each read from a vLLM
function (reference/profiles.py for the reference scheduler's batches,
spec/profiles.py for check-trace's verdicts). A trial takes one profile and
gives one constant another value: for a bool its negation, otherwise each
value that constant has in another known profile (`engine_loop`'s loops,
`num_preallocate_tokens`' 64, a release order). The trial stands in the
registry under the profile's own name for as long as it runs (`trial`), so
the reference (`SchedulerConfig(profile=...)`, with its released variant),
the checker (`check_trace(..., profile=...)`) and whatever keys on the name
take it as that profile; the original is put back after. Fit runs one trial
at a time in one thread.

Standard library, flightcheck.reference and flightcheck.spec only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from flightcheck.reference import profiles as reference_profiles
from flightcheck.spec import profiles as spec_profiles

Side = Literal["reference", "spec"]

# Fields of a profile that are no rule of vLLM's: its name, and the release
# whose models and mutants a profile carries over (spec `Profile.follows`).
NOT_RULES = frozenset({"name", "follows"})


@dataclass(frozen=True)
class Flip:
    """One constant of one side's profile given another value."""
    side: Side
    constant: str
    value: Any

    def describe(self) -> str:
        return f"{self.constant}={self.value!r} ({self.side})"


def judged_profiles() -> list[str]:
    """The profiles fit judges: those both the reference and the spec have
    (the spec's what-if `vllm-0.33-hardened` is no release), in the
    reference's order."""
    return [name for name in reference_profiles.PROFILES if name in spec_profiles.PROFILES]


def _known(side: Side) -> list[Any]:
    if side == "reference":
        return [*reference_profiles.PROFILES.values(), *reference_profiles.RELEASED.values()]
    return list(spec_profiles.PROFILES.values())


def _base(side: Side, name: str) -> Any:
    if side == "reference":
        return reference_profiles.RELEASED.get(name, reference_profiles.PROFILES[name])
    return spec_profiles.PROFILES[name]


def flips(side: Side, name: str) -> list[Flip]:
    """Every single-constant change of `name`'s profile on `side`, in the
    order the dataclass declares its constants."""
    base = _base(side, name)
    out: list[Flip] = []
    for constant in (f.name for f in fields(base) if f.name not in NOT_RULES):
        current = getattr(base, constant)
        if isinstance(current, bool):
            others: list[Any] = [not current]
        else:
            others = sorted({getattr(p, constant) for p in _known(side)} - {current}, key=repr)
        out.extend(Flip(side, constant, value) for value in others)
    return out


@contextmanager
def trial(name: str, flip: Flip) -> Iterator[str]:
    """The profile `name` with `flip` applied, in force under its own name
    while the block runs (the reference's released variant too), then put
    back. Under its own name, everything that looks a profile up by name (a
    release table, the engine loop a release runs) treats the trial as the
    profile it changes: only the one constant differs."""
    if flip.side == "reference":
        registries = [reference_profiles.PROFILES]
        if name in reference_profiles.RELEASED:
            registries.append(reference_profiles.RELEASED)
    else:
        registries = [spec_profiles.PROFILES]
    originals = [registry[name] for registry in registries]
    try:
        for registry, original in zip(registries, originals):
            registry[name] = replace(original, **{flip.constant: flip.value})
        yield name
    finally:
        for registry, original in zip(registries, originals):
            registry[name] = original
