"""The structured-output model the Z3 engines check (kv_engines.py, with the
grammar's formulas: encoding/structured_output_invariants.py): small enough
that the cross-check compares the encoding with the spec on every reachable
state (tests/test_z3_grammar.py), large enough that every part of the
encoding acts in it.

GRAMMAR_Z3 is the explicit search's GRAMMAR_K2 (verification/grammar_models.py)
under vLLM 0.34 with sync scheduling: two requests, one structured, K = 2;
701 reachable states, among them grammars compiling while the other request
runs, the waiting loop skipping the request that waits (its place kept),
grammars failed and finished with FINISHED_ERROR by the next completion,
aborts while compiling, and outputs advancing the FSM with a batch behind
them in flight.

What the encoding leaves out (structured_output_state.refuse_unencoded_grammar):
asynchronous scheduling's deferred bitmasks and drafts, so the historical
mutants (vLLM #29379, #49694), which need both, are killed by the explicit
search on GRAMMAR_SPEC_K1; BMC here catches `compiling_grammar_scheduled`.
"""

from __future__ import annotations

from dataclasses import replace

from flightcheck.verification.grammar_models import GRAMMAR_K2
from flightcheck.verification.models import Model

GRAMMAR_Z3_PROFILE = "vllm-0.34"

GRAMMAR_Z3: Model = replace(GRAMMAR_K2.under_profile(GRAMMAR_Z3_PROFILE), name=f"grammar-k2@{GRAMMAR_Z3_PROFILE}")

# The grammar mutant BMC catches on it (G1, at depth 2: arrive, schedule).
GRAMMAR_Z3_MUTANT = "compiling_grammar_scheduled"


def grammar_z3_mutant_model(name: str = GRAMMAR_Z3_MUTANT) -> Model:
    return GRAMMAR_Z3.with_mutant(name)


# How deep BMC of the grammar model goes (the k-induction proof is unbounded;
# BMC gives each invariant a second, independent method).
GRAMMAR_Z3_BMC_DEPTH = 6


def grammar_z3_auxiliary() -> list[str]:
    """The conjuncts the k-induction of G1-G3 starts from: the grammar's
    auxiliary invariants (encoding/structured_output_invariants.py) and
    every candidate of the plain scheduler (its S- and A-invariants), the
    Houdini loop dropping those a grammar breaks (S10's queues, which
    GA2 restates with the grammar-waiting status)."""
    from flightcheck.verification.z3.encoding.structured_output_invariants import GRAMMAR_AUXILIARY
    from flightcheck.verification.z3.kv_engines import candidate_names
    return [*GRAMMAR_AUXILIARY, *candidate_names(GRAMMAR_Z3.cfg)]
