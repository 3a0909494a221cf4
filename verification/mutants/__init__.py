"""The hand-written mutants, kept out of the code they break: each is a small
named edit of the one function (or the few functions) it alters, with its
history. The spec's (`spec.py`, with the shortest counterexample; indexed by
`registry.py`) and the reference scheduler's (`reference.py`, caught by the
fuzzer). `applied(name)` puts a spec mutant in force for the duration of a
check, `reference_applied(name)` a reference mutant for a run (`patching.py`),
through the one mechanism every mutant uses (`patch.py`: the module
recompiled with the edit, the function's code object swapped)."""

from flightcheck.verification.mutants.patch import Edit, MutantNoLongerApplies
from flightcheck.verification.mutants.patching import active, active_reference, applied, reference_applied
from flightcheck.verification.mutants.registry import (ALL_MUTANTS, GRAMMAR_MUTANTS, KV_MUTANTS, MUTANTS, PROFILE_MUTANTS,
                                                       SESSION_MUTANTS, Mutant, drifted,
                                                       kv_mutants_of, mutant, mutants_of, stale_fingerprints)

__all__ = ["ALL_MUTANTS", "GRAMMAR_MUTANTS", "KV_MUTANTS", "MUTANTS", "PROFILE_MUTANTS", "SESSION_MUTANTS", "Edit", "Mutant",
           "MutantNoLongerApplies", "active",
           "active_reference", "applied", "drifted", "kv_mutants_of", "mutant", "mutants_of", "reference_applied",
           "stale_fingerprints"]
