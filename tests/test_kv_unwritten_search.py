"""KV8 (`KV8_no_hit_on_unwritten_kv`, spec/kv_unwritten.py) by exhaustive
search (verification/priority_models.py `PRIORITY_UNWRITTEN_MODELS`): under
vLLM 0.33/0.34's rules the search finds finding 1's run of
docs/vllm-unwritten-kv-findings.md (a priority victim handed back from a
chunk whose allocation cached a block it would have finished, the block
freed with its label, and the victim's re-admission reading it as a prefix
hit); under the fix (`vllm-0.34-unwritten-kv-fixed`,
`Profile.hand_back_uncaches_unwritten`) the whole state graph keeps KV8 and
every other property. The 0.34 counterexample and the fixed graph in the
default suite (a few seconds each), 0.33's graph and the suite's rows slow."""

from __future__ import annotations

from dataclasses import replace

import pytest

from flightcheck.spec import Config, step
from flightcheck.spec.kv_unwritten import (UnwrittenKvState, schedule_unwritten_reads, still_unwritten,
                                           with_unwritten_kv_identity)
from flightcheck.spec.pool_store import label_of
from flightcheck.spec.profiles import PROFILES, VERSION_PROFILES
from flightcheck.spec.state import Status, initial_state
from flightcheck.spec.transitions import Arrive, transition_properties_for
from flightcheck.verification.explicit import search as explicit
from flightcheck.verification.explicit_rows import exhaustive_rows
from flightcheck.verification.priority_models import (PRIO_UNWRITTEN_K3, PRIORITY_PROFILE_MODELS,
                                                       PRIORITY_UNWRITTEN_MODELS, UNWRITTEN_KV_FIXED)
from flightcheck.verification.results import SOMETIMES_NAMES, kind_of
from flightcheck.verification.traces.counterexample import broken_at, from_actions

KV8 = "KV8_no_hit_on_unwritten_kv"
FIXED = UNWRITTEN_KV_FIXED
# (states, edges, max depth) -- change only with a reviewed change of semantics.
PINNED = {"vllm-0.34": (1580, 2592, 15), "vllm-0.33": (1580, 2592, 15), FIXED: (1572, 2584, 15)}
# finding 1's run, shortest: r0 chunked behind r1; r2 admitted behind r0's
# second chunk; r0's third chunk caches its second block and r2's next chunk
# hands r0 back; r0's re-admission hits the block
SHORTEST = ["arrive r0", "arrive r1", "schedule", "arrive r2", "complete oldest [tok]", "schedule", "schedule",
            "complete oldest", "complete oldest [tok]", "schedule"]
HAND_BACK = 6          # the index of the schedule step that hands r0 back


def _safety(result: explicit.SearchResult) -> list[explicit.Violation]:
    return [v for v in result.violations if v.property not in SOMETIMES_NAMES]


def _model(profile: str):
    (model,) = PRIORITY_UNWRITTEN_MODELS[profile]
    return model


def test_the_released_rules_break_kv8_in_ten_steps_and_the_replay_breaks_it_at_the_hit():
    model = _model("vllm-0.34")
    result = explicit.search(model, stop_at_first=True, check_liveness=False)   # breadth-first: a shortest
    (violation,) = _safety(result)
    path = [a for a, _ in violation.path]
    assert violation.property == KV8 and [str(a).split(" (")[0] for a in path] == SHORTEST
    cx = from_actions(model, KV8, path)
    assert [broken_at(model, cx.states, cx.actions, i) for i in range(1, len(path) + 1)] == [[]] * 9 + [[KV8]]
    handed_back, last = cx.states[HAND_BACK + 1], cx.states[-1]
    assert handed_back.requests[0].status is Status.PREEMPTED and handed_back.requests[2].status is Status.RUNNING
    (block, label), = handed_back.unwritten_kv               # r0's second block, tokens 4-7, label 2
    assert label == 2 and label_of(handed_back.pool, block) == 2
    assert last.requests[0].block_table[:2] == (1, block)            # r0's hit: its first block and this one
    assert schedule_unwritten_reads(cx.states[-2], last, model.cfg) == [(0, [block])]


def test_the_fixed_rule_keeps_kv8_and_every_property_on_the_whole_graph():
    model = _model(FIXED)
    result = explicit.search(model)
    assert result.complete and (result.num_states, result.num_edges, result.max_depth) == PINNED[FIXED]
    assert not _safety(result) and all(result.liveness.values())
    assert KV8 in {p.name for p in transition_properties_for(model.cfg)} and kind_of(KV8) == "invariant"


def test_the_fix_uncaches_the_victims_block_before_it_is_freed():
    """The rule itself, on the counterexample's first seven steps: the
    released rules leave r0's second block labelled and in `unwritten_kv`;
    the fix drops its label (a free block any allocation takes fresh) and
    marks nothing."""
    path = [a for a, _ in _safety(explicit.search(_model("vllm-0.34"), stop_at_first=True,
                                                  check_liveness=False))[0].path][:HAND_BACK + 1]
    after = {}
    for profile in ("vllm-0.34", FIXED):
        cfg = replace(PRIO_UNWRITTEN_K3.cfg, profile=profile)
        s = with_unwritten_kv_identity(initial_state(3, cfg.num_blocks))
        for action in path:
            s = step(s, cfg, action)
        after[profile] = s
    released, fixed = after["vllm-0.34"], after[FIXED]
    (block, _), = released.unwritten_kv
    assert still_unwritten(released) == {block} and label_of(released.pool, block) == 2
    assert not fixed.unwritten_kv and label_of(fixed.pool, block) is None
    assert fixed.requests[0].status is Status.PREEMPTED and fixed.running == released.running == (2,)


def test_the_fix_is_in_no_released_profile_and_the_flag_needs_priority_and_prefix_caching():
    assert [name for name, p in PROFILES.items() if p.hand_back_uncaches_unwritten] == [FIXED]
    assert FIXED not in VERSION_PROFILES.values() and PROFILES[FIXED].follows == "vllm-0.34"
    with pytest.raises(ValueError, match="check_unwritten_kv"):
        Config(profile="vllm-0.34", check_unwritten_kv=True)                # FCFS
    with pytest.raises(ValueError, match="check_unwritten_kv"):
        Config(profile="vllm-0.34", scheduling_policy="priority", prefix_caching=False, check_unwritten_kv=True)
    plain = replace(PRIO_UNWRITTEN_K3.cfg, check_unwritten_kv=False)
    assert KV8 not in {p.name for p in transition_properties_for(plain)}
    assert set(PRIORITY_PROFILE_MODELS[FIXED]) and all(m.cfg.profile == FIXED for m in PRIORITY_PROFILE_MODELS[FIXED])


def test_unwritten_kv_is_part_of_the_identity_only_where_kv8_is_checked():
    plain = initial_state(3, 4)
    marked = replace(plain, unwritten_kv=frozenset({(0, 2)}))
    assert plain == marked                                   # a history variable: no part of State's identity
    tracked, tracked_marked = with_unwritten_kv_identity(plain), with_unwritten_kv_identity(marked)
    assert tracked != tracked_marked and tracked == with_unwritten_kv_identity(plain)
    assert isinstance(step(tracked, PRIO_UNWRITTEN_K3.cfg, Arrive(0, PRIO_UNWRITTEN_K3.prompts[0])), UnwrittenKvState)
    assert isinstance(explicit.initial(PRIO_UNWRITTEN_K3), UnwrittenKvState)


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["vllm-0.34", "vllm-0.33"])
def test_the_released_graphs_break_kv8_and_nothing_else(profile: str):
    model = _model(profile)
    result = explicit.search(model)
    assert result.complete and (result.num_states, result.num_edges, result.max_depth) == PINNED[profile]
    assert {v.property for v in _safety(result)} == {KV8}
    assert [str(a).split(" (")[0] for a, _ in min(_safety(result), key=lambda v: len(v.path)).path] == SHORTEST


@pytest.mark.slow
def test_the_suite_rows_say_violated_under_the_released_rules_and_proved_under_the_fix():
    rows = {profile: {r.name: r.status for r in exhaustive_rows(_model(profile))} for profile in ("vllm-0.34", FIXED)}
    assert rows["vllm-0.34"][KV8] == "violated" and rows[FIXED][KV8] == "proved"
    assert {n for n, s in rows["vllm-0.34"].items() if s == "violated"} == {KV8}
    assert all(s in ("proved", "reached") for s in rows[FIXED].values())
