"""Every property carries weight: removing it alone lets some mutant survive,
or it is implied by the others (checked here on every reachable state of
every mutant's model, and argued in spec/README.md)."""

from __future__ import annotations

import pytest

from flightcheck.spec import INVARIANTS
from flightcheck.verification.explicit import search as explicit
from flightcheck.verification.models import EXHAUSTIVE_MODELS
from flightcheck.verification.weight import kill_sets, weights

# Properties no mutant needs alone, and why they are kept.
IMPLIED = {
    "S6_decode_gating": "implied by S3 and S5",
    "L1_running_request_unblocked": "implied by S3, S5, S8 and S11",
    "S13_fates_only_age": "overlaps S3 on the one bug it catches",
}


@pytest.fixture(scope="module")
def weight_rows():
    return {w.property: w for w in weights(kill_sets())}


def test_every_property_is_needed_alone_by_some_mutant_or_listed_as_implied(weight_rows):
    for name, w in weight_rows.items():
        if name in IMPLIED:
            assert not w.sole_killer_of, f"{name} now carries weight alone; update IMPLIED"
        else:
            assert w.sole_killer_of, f"{name} is needed by no mutant alone (catches {w.catches})"


def _holds(name: str, s, cfg) -> bool:
    """The invariant called `name`, on the whole state (all its parts)."""
    return next(i for i in INVARIANTS if i.name == name).holds(s, cfg)


def _states_of(models):
    for model in models:
        seen = {explicit.initial(model)}
        frontier = list(seen)
        while frontier:
            s = frontier.pop()
            yield model.cfg, s
            for _, t in explicit.successors(model, s):
                if t not in seen:
                    seen.add(t)
                    frontier.append(t)


def test_implications_hold_on_every_state_reachable_by_the_correct_and_mutant_specs():
    from flightcheck.verification.models import mutant_model
    models = list(EXHAUSTIVE_MODELS) + [mutant_model(m) for m in
                                        ("shared_snapshot", "final_chunk_from_live_counter",
                                         "decode_while_token_in_flight", "rejections_not_subtracted")]
    checked = 0
    for cfg, s in _states_of(models):
        if _holds("S3_contiguous_coverage", s, cfg) and _holds("S5_one_sample_per_prefill", s, cfg):
            assert _holds("S6_decode_gating", s, cfg)
            if _holds("S8_spec_accounting", s, cfg) and _holds("S11_pipeline_depth", s, cfg):
                assert _holds("L1_running_request_unblocked", s, cfg)
        checked += 1
    assert checked > 10_000
    assert {i.name for i in INVARIANTS} >= set(IMPLIED) - {"S13_fates_only_age"}
