"""Does every property carry weight? For each mutant, the set of properties
that catch it (exhaustive search of its hunting model), among the
properties a solver checks (the invariants, their liveness safety forms and
the transition properties; the whole-graph liveness checks are another
method and are left out); a property carries
weight when some mutant is caught by it alone, so that removing it would let
that mutant survive. A property that no mutant needs alone is reported with
the properties that cover every mutant it catches.
"""

from __future__ import annotations

from dataclasses import dataclass

from flightcheck.verification.explicit import search as explicit
from flightcheck.verification.models import mutant_model
from flightcheck.verification.mutants import MUTANTS
from flightcheck.verification.explicit_rows import all_property_names
from flightcheck.verification.results import LIVENESS_GRAPH, SOMETIMES_NAMES


@dataclass
class Weight:
    property: str
    sole_killer_of: list[str]
    catches: list[str]


def kill_sets() -> dict[str, set[str]]:
    """mutant -> every safety/liveness property it violates on its model."""
    result = {}
    for name in MUTANTS:
        r = explicit.search(mutant_model(name))
        result[name] = {v.property for v in r.violations} - SOMETIMES_NAMES - set(LIVENESS_GRAPH)
    return result


def weights(kills: dict[str, set[str]] | None = None) -> list[Weight]:
    kills = kills if kills is not None else kill_sets()
    rows = []
    for prop in all_property_names():
        if prop in SOMETIMES_NAMES or prop in LIVENESS_GRAPH:
            continue
        rows.append(Weight(prop, sorted(m for m, k in kills.items() if k == {prop}),
                           sorted(m for m, k in kills.items() if prop in k)))
    return rows
