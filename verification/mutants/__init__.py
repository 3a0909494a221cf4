"""The spec's mutants, kept out of the spec: each is a named change to the one
function (or the few functions) of `spec/` it alters, with its history and its
shortest counterexample (`registry.py`), the mutated functions themselves
(`spec.py`), and `applied(name)`, which swaps them in for the duration of a
check (`patching.py`)."""

from flightcheck.verification.mutants.patching import MutantNoLongerApplies, active, applied
from flightcheck.verification.mutants.registry import (ALL_MUTANTS, MUTANTS, PROFILE_MUTANTS, Mutant, fingerprint,
                                                       mutant, mutants_of, stale_fingerprints)

__all__ = ["ALL_MUTANTS", "MUTANTS", "PROFILE_MUTANTS", "Mutant", "mutants_of", "MutantNoLongerApplies", "active", "applied", "fingerprint", "mutant",
           "stale_fingerprints"]
