"""Every mutant of the spec is killed with a counterexample that replays on the
concrete (mutant) spec, by the property and at the length its registry entry
records, and the correct spec passes where each mutant fails."""

from __future__ import annotations

import pytest

from flightcheck.verification.mutants import MUTANTS
from flightcheck.verification.explicit import search as explicit
from flightcheck.verification.traces.counterexample import broken_at, replay
from flightcheck.verification.models import mutant_model
from flightcheck.verification.suite import SOMETIMES_NAMES, hunt_mutant

HISTORICAL = [
    "advance_at_completion", "shared_snapshot", "final_chunk_from_live_counter",
    "snapshot_omits_prefix_hit", "rejections_not_subtracted", "decode_while_token_in_flight",
    "stale_output_applied_to_resumed", "inflight_set_not_cleared_on_preemption",
    "rejections_subtracted_after_reset",
]


def test_every_historical_bug_of_the_issue_is_a_mutant():
    assert set(HISTORICAL) <= set(MUTANTS)
    assert {m.name for m in MUTANTS.values() if m.kind == "historical"} == set(HISTORICAL)


@pytest.mark.parametrize("name", list(MUTANTS))
def test_mutant_is_killed_by_a_replayable_counterexample(name):
    result = hunt_mutant(name)
    assert result.killed, f"{name} survived on {result.model}"
    assert (result.property, result.trace_length) == (MUTANTS[name].killed_by, MUTANTS[name].shortest)
    cx = result.counterexample
    states = replay(cx.model, cx.actions)
    assert states == cx.states
    if not cx.property.startswith("L1_L3") and not cx.property.startswith("L4_every"):
        assert cx.property in broken_at(cx.model, states, cx.actions, len(cx.actions))


@pytest.mark.parametrize("name", list(MUTANTS))
def test_correct_spec_passes_on_the_model_each_mutant_is_hunted_in(name):
    model = mutant_model(name).with_mutant(None)
    r = explicit.search(model)
    assert not [v.property for v in r.violations if v.property not in SOMETIMES_NAMES]


def test_prefix_hit_hang_is_found_as_a_stuck_request():
    """The #13637 hang: the final chunk of a request resumed with a prefix hit is
    taken for a partial one, its token is dropped, and it never finishes."""
    model = mutant_model("snapshot_omits_prefix_hit")
    r = explicit.search(model)
    hang = [v for v in r.violations if v.property == "L1_L3_every_request_can_finish"]
    assert hang
    last = hang[0].path[-1][1]
    stuck = [q for q in last.requests if q.status.value == "RUNNING"]
    assert stuck and not last.in_flight
    assert all(q.num_computed == q.num_tokens for q in stuck)   # num_new_tokens == 0 forever
