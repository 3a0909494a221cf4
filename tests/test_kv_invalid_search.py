"""KV7 (`KV7_no_compute_on_invalid_kv`, spec/kv_invalid.py) by exhaustive
search (verification/kv_models.py `KV_INVALID_MODELS`): under vLLM
0.33/0.34's rules the search finds finding 7's run (a sync load's failure
leaves its block cached and its sharer keeping it, the loader is aborted
before it recomputes, and the sharer's next entry reads the block); under
the fix (`vllm-0.34-invalid-kv-fixed`, `Profile.kv_recompute_quarantines_invalid`)
the whole state graph keeps KV7. The two-request model in the default
suite (under a second each), the three-request one slow."""

from __future__ import annotations

from dataclasses import replace

import pytest

from flightcheck.spec import Config, KvConnector, Prompt, step
from flightcheck.spec.kv_invalid import InvalidKvState, quarantined, with_invalid_kv_identity
from flightcheck.spec.profiles import PROFILES, VERSION_PROFILES
from flightcheck.spec.state import Status, initial_state
from flightcheck.spec.transitions import Abort, Arrive, FailKvLoad, Schedule, transition_properties_for
from flightcheck.verification.explicit import search as explicit
from flightcheck.verification.kv_models import KV_INVALID_K2, KV_INVALID_K3, KV_INVALID_MODELS, KV_PROFILE_MODELS
from flightcheck.verification.results import SOMETIMES_NAMES, kind_of
from flightcheck.verification.suite import SuiteOptions, run_suite
from flightcheck.verification.traces.counterexample import broken_at, from_actions

KV7 = "KV7_no_compute_on_invalid_kv"
FIXED = "vllm-0.34-invalid-kv-fixed"
# (states, edges, max depth) -- change only with a reviewed change of semantics.
PINNED = {
    "kv-invalid-k2@vllm-0.34": (322, 633, 10),
    "kv-invalid-k2@vllm-0.33": (322, 633, 10),
    f"kv-invalid-k2@{FIXED}": (312, 601, 11),
    "kv-invalid-preempt-k2@vllm-0.34": (158, 253, 11),
    f"kv-invalid-preempt-k2@{FIXED}": (150, 243, 9),
}
PINNED_K3 = {"vllm-0.34": (15780, 40821, 17), FIXED: (17011, 42530, 19)}
# finding 7's run, shortest: r0 sync-loads block 0, r1 hits it; the load
# fails (r0 back to 0, r1 keeps the marked block); r0 is aborted; r1 reads it
SHORTEST = ["arrive r0", "arrive r1", "schedule", "kv load failed r0 from block 0", "abort r0", "schedule"]


def _safety(result: explicit.SearchResult) -> list[explicit.Violation]:
    return [v for v in result.violations if v.property not in SOMETIMES_NAMES]


@pytest.mark.parametrize("profile", ["vllm-0.34", "vllm-0.33"])
def test_the_released_rules_break_kv7_in_six_steps(profile: str):
    model = replace(KV_INVALID_K2.under_profile(profile), name=f"kv-invalid-k2@{profile}")
    result = explicit.search(model)
    assert result.complete and (result.num_states, result.num_edges, result.max_depth) == PINNED[model.name]
    assert [v.property for v in _safety(result)] == [KV7]
    path = [a for a, _ in _safety(result)[0].path]
    assert [str(a).split(" (")[0] for a in path] == SHORTEST
    cx = from_actions(model, KV7, path)             # the replay on the spec breaks KV7 at the last step only
    assert [broken_at(model, cx.states, cx.actions, i) for i in range(1, len(path) + 1)] == [[]] * 5 + [[KV7]]


def test_without_an_abort_the_loader_preempted_before_it_recomputes_hits_its_own_invalid_block():
    """kv-invalid-preempt-k2 under 0.34: r0's load of its second block fails
    (r0 back to 2, the block left cached), r1's next chunk preempts r0, and
    r0's resumption takes the block back as a prefix hit and reads it."""
    (_, model) = KV_INVALID_MODELS["vllm-0.34"]
    result = explicit.search(model)
    assert result.complete and (result.num_states, result.num_edges, result.max_depth) == PINNED[model.name]
    (violation,) = _safety(result)
    path = [a for a, _ in violation.path]
    assert violation.property == KV7 and [str(a).split(" (")[0] for a in path] == [
        "arrive r1", "arrive r0", "schedule", "kv load failed r0 from block 1", "complete oldest", "schedule",
        "complete oldest [tok]", "schedule"]
    states = from_actions(model, KV7, path).states
    assert states[6].requests[0].status is Status.PREEMPTED         # preempted by r1's chunk, not aborted
    invalid = states[4].invalid_kv                                   # r0's own block 1, marked by its failure
    assert invalid and set(states[-1].requests[0].block_table[:2]) >= invalid


@pytest.mark.parametrize("index", [0, 1])
def test_the_fixed_rule_keeps_kv7_and_every_property_on_the_whole_graph(index: int):
    model = KV_INVALID_MODELS[FIXED][index]
    result = explicit.search(model)
    assert result.complete and (result.num_states, result.num_edges, result.max_depth) == PINNED[model.name]
    assert not _safety(result) and all(result.liveness.values())
    assert KV7 in {p.name for p in transition_properties_for(model.cfg)} and kind_of(KV7) == "invariant"


def test_the_fix_is_in_no_released_profile():
    assert [name for name, p in PROFILES.items() if p.kv_recompute_quarantines_invalid] == [FIXED]
    assert FIXED not in VERSION_PROFILES.values()


def test_the_fix_evicts_the_invalid_block_and_cuts_the_sharer_at_it():
    """The rule itself, on the counterexample's first four steps: the released
    rules leave block 0 cached and r1 keeping it; the fix uncaches it and
    takes r1 back to 0 (its own first invalid block)."""
    after = {}
    for profile in ("vllm-0.34", FIXED):
        cfg = replace(KV_INVALID_K2.cfg, profile=profile)
        s = with_invalid_kv_identity(initial_state(2, cfg.num_blocks))
        for action in (Arrive(0, KV_INVALID_K2.prompts[0]), Arrive(1, KV_INVALID_K2.prompts[1]), Schedule(),
                       FailKvLoad(0, 0)):
            s = step(s, cfg, action)
        after[profile] = s
    released, fixed = after["vllm-0.34"], after[FIXED]
    block = released.requests[0].block_table[0]
    assert released.requests[1].block_table[0] == block and released.invalid_kv == {block}
    assert released.pool.labels[block] is not None and released.requests[1].num_computed == 2
    assert fixed.pool.labels[block] is None and fixed.requests[1].num_computed == 0
    assert step(fixed, replace(KV_INVALID_K2.cfg, profile=FIXED), Abort(0)) is not None


def test_invalid_kv_is_part_of_the_state_only_where_kv7_is_checked():
    plain = initial_state(1, 2)
    marked = replace(plain, invalid_kv=frozenset({1}))
    assert plain == marked and hash(plain) == hash(marked)          # the history variable, elsewhere
    tracked, tracked_marked = with_invalid_kv_identity(plain), with_invalid_kv_identity(marked)
    assert tracked != tracked_marked and tracked == with_invalid_kv_identity(plain)
    cfg = Config(block_size=2, num_blocks=2, max_model_len=6, profile="vllm-0.34", kv_connector=KvConnector(),
                 check_invalid_kv=True)
    assert isinstance(step(tracked, cfg, Arrive(0, Prompt(3, 1, (1,), 2, False))), InvalidKvState)
    assert isinstance(explicit.initial(KV_INVALID_K2), InvalidKvState)
    with pytest.raises(ValueError, match="recompute"):
        Config(profile="vllm-0.34", kv_connector=KvConnector(load_failure_policy="fail"), check_invalid_kv=True)


def test_verify_kv_connector_gives_kv7_rows_and_the_released_counterexample(monkeypatch):
    """The suite's KV7 rows (its other connector models left out for time)."""
    from flightcheck.verification import suite
    for profile in ("vllm-0.34", FIXED):
        monkeypatch.setitem(suite.KV_PROFILE_MODELS, profile, ())
        monkeypatch.setitem(suite.KV_MUTANT_MODELS, profile, {})
    released = run_suite(SuiteOptions(profile="vllm-0.34", use_z3=False, kv_connector=True))
    fixed = run_suite(SuiteOptions(profile=FIXED, use_z3=False, kv_connector=True))
    assert [(p.status, p.method.split(" (")[0]) for p in released.properties if p.name == KV7] == [
        ("violated", "exhaustive kv-invalid-k2@vllm-0.34"), ("violated", "exhaustive kv-invalid-preempt-k2@vllm-0.34")]
    assert not released.ok and [cx.length for cx in released.counterexamples] == [6, 8]
    assert {cx["property"] for cx in released.to_json()["counterexamples"]} == {KV7}
    assert [p.status for p in fixed.properties if p.name == KV7] == ["proved", "proved"] and fixed.ok


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["vllm-0.34", FIXED])
def test_three_requests_with_a_parked_holder(profile: str):
    """kv-invalid-k3 (about 30-50 s a profile): a parked async load sharing
    the block besides; the released rules' shortest breach is the same six
    steps, the fix keeps every property."""
    model = replace(KV_INVALID_K3.under_profile(profile), name=f"kv-invalid-k3@{profile}")
    result = explicit.search(model)
    assert result.complete and (result.num_states, result.num_edges, result.max_depth) == PINNED_K3[profile]
    if profile == FIXED:
        assert not _safety(result) and all(result.liveness.values())
    else:
        assert [(v.property, len(v.path)) for v in _safety(result)] == [(KV7, 6)]


def _reachable(model) -> list:
    root = explicit.initial(model)
    seen, frontier = {root}, [root]
    while frontier:
        s = frontier.pop()
        for _, nxt in explicit.successors(model, s):
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    return list(seen)


def test_the_fix_keeps_invalid_blocks_quarantined_in_every_reachable_state():
    """KV7's strengthening (`kv_invalid.quarantined`: invalid blocks out of
    the cache and out of every computed prefix) holds in each of the fixed
    model's states, and some state of vLLM's rules breaks it."""
    for fixed, released in zip(KV_INVALID_MODELS[FIXED], KV_INVALID_MODELS["vllm-0.34"]):
        states = _reachable(fixed)
        assert len(states) == PINNED[fixed.name][0] and any(s.invalid_kv for s in states)
        assert all(isinstance(s, InvalidKvState) for s in states)     # no action drops the identity
        assert all(quarantined(s, fixed.cfg) for s in states)
        assert not all(quarantined(s, released.cfg) for s in _reachable(released))


@pytest.mark.slow
def test_the_connector_models_under_the_fix_reach_0_34s_states_and_keep_every_property():
    """The fix changes nothing on the connector's models (no prefix caching:
    a failed sync load has no holder but its loader), about 15 s."""
    from tests.test_spec_kv_search import check
    for model in KV_PROFILE_MODELS[FIXED]:
        check(model)
