"""The spec's mutants, kept out of the spec: each is a small named edit of the
one function (or the few functions) of `spec/` it alters (`spec.py`), with its
history and its shortest counterexample; `registry.py` indexes them;
`applied(name)` puts one in force for the duration of a check (`patching.py`),
through the one mechanism every mutant uses (`patch.py`: the module
recompiled with the edit, the function's code object swapped)."""

from flightcheck.verification.mutants.patch import Edit, MutantNoLongerApplies
from flightcheck.verification.mutants.patching import active, applied
from flightcheck.verification.mutants.registry import (ALL_MUTANTS, MUTANTS, PROFILE_MUTANTS, Mutant, drifted, mutant,
                                                       mutants_of, stale_fingerprints)

__all__ = ["ALL_MUTANTS", "MUTANTS", "PROFILE_MUTANTS", "Edit", "Mutant", "MutantNoLongerApplies", "active",
           "applied", "drifted", "mutant", "mutants_of", "stale_fingerprints"]
