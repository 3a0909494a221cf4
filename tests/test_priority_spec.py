"""The priority scheduling policy in the spec (spec/priority.py,
docs/request-states.md, "Priority scheduling"): its models prove PR1-PR3
and every other property under vLLM 0.33 and 0.34, sync and async, with
pinned state counts; each of the issue's priority bugs is a mutant named
for its number, killed by its property at its recorded length with a
counterexample that replays; the policy changes nothing under FCFS."""

from __future__ import annotations

import re

import pytest

from flightcheck.spec import Config, Prompt, invariants_for, transition_properties_for
from flightcheck.spec.transitions import Arrive, CompleteOldest, Sample, Schedule, step
from flightcheck.spec.schedule import schedule
from flightcheck.verification.explicit import search as explicit
from flightcheck.verification.models import Model
from flightcheck.verification.mutants import ALL_MUTANTS, MUTANTS, PROFILE_MUTANTS
from flightcheck.verification.mutants.registry import PRIORITY_MUTANTS
from flightcheck.verification.priority_models import (PRIO_VICTIM_K2, PRIORITY_MUTANT_MODELS,
                                                       PRIORITY_PROFILE_MODELS)
from flightcheck.verification.suite import hunt_mutant
from flightcheck.verification.traces.counterexample import broken_at, replay

ISSUE_BUGS = {23347, 28558, 49097}
KILLS = {
    "victim_kept_in_batch_pr23347": ("PR2_victim_leaves_no_trace", 7),
    "preempted_drafts_kept_pr28558": ("PR2_victim_leaves_no_trace", 7),
    "victim_index_not_adjusted_pr49097": ("PR3_running_loop_skips_nothing", 13),
}
# (states, edges, max depth) -- change only with a reviewed change of semantics.
PINNED = {
    "prio-victim-k2": (3183, 7575, 18),       # 3162, 7543 until it kept is_prefill_chunk (spec/drafts.py)
    "prio-skip-k2": (4256, 6390, 22),
    "prio-victim-k2@vllm-0.33": (3183, 7575, 18),   # the same (0.33 pads admitted decodes too), 6235f9a missed it
    "prio-skip-k2@vllm-0.33": (4256, 6390, 22),
    "prio-victim-k2@vllm-0.33-async": (4097, 7818, 22),
    "prio-skip-k2@vllm-0.33-async": (7484, 12093, 33),
    "prio-victim-k2@vllm-0.34-async": (4097, 7818, 22),
    "prio-skip-k2@vllm-0.34-async": (7484, 12093, 33),
}
PROPERTIES = {"PR1_waiting_in_priority_order", "PR2_victim_leaves_no_trace", "PR3_running_loop_skips_nothing"}


def _prove(profile: str) -> None:
    for model in PRIORITY_PROFILE_MODELS[profile]:
        names = {i.name for i in invariants_for(model.cfg)} | {p.name for p in transition_properties_for(model.cfg)}
        assert PROPERTIES <= names
        r = explicit.search(model)
        assert r.complete
        assert not r.violations, [(v.property, len(v.path)) for v in r.violations]
        assert (r.num_states, r.num_edges, r.max_depth) == PINNED[model.name], model.name


def test_the_policys_models_prove_every_property_under_0_34():
    _prove("vllm-0.34")


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.33-async", "vllm-0.34-async"])
def test_the_policys_models_prove_every_property_under_the_other_profiles(profile):
    _prove(profile)


def test_every_priority_bug_of_the_issue_is_a_mutant_named_for_its_number():
    numbers = {int(m.group(1)) for name in PRIORITY_MUTANTS if (m := re.search(r"_pr(\d+)$", name))}
    assert numbers == ISSUE_BUGS
    assert {n: (m.killed_by, m.shortest) for n, m in PRIORITY_MUTANTS.items()} == KILLS
    assert set(PRIORITY_MUTANTS) <= set(ALL_MUTANTS)
    assert not set(PRIORITY_MUTANTS) & set(MUTANTS)       # never hunted in a run without the policy
    assert not any(set(PRIORITY_MUTANTS) & set(own) for own in PROFILE_MUTANTS.values())


@pytest.mark.parametrize("name", list(KILLS))
def test_priority_mutant_is_killed_by_its_property_with_a_replayable_counterexample(name):
    result = hunt_mutant(name, model=PRIORITY_MUTANT_MODELS[name])
    assert result.killed, f"{name} survived on {result.model}"
    assert (result.property, result.trace_length) == KILLS[name]
    cx = result.counterexample
    states = replay(cx.model, cx.actions)
    assert states == cx.states
    assert cx.property in broken_at(cx.model, states, cx.actions, len(cx.actions))


def test_a_victim_scheduled_earlier_in_the_step_is_handed_back():
    """#23347's scenario on the correct spec: r0 (priority 1) is scheduled
    first, r1 (priority 0) needs a block, r0 is the victim: the batch holds
    r1 alone, with its whole budget, and r0 waits with no block."""
    cfg = PRIO_VICTIM_K2.cfg
    low, high = PRIO_VICTIM_K2.prompts
    actions = [Arrive(0, low), Schedule(), Arrive(1, high), Schedule(),
               CompleteOldest((Sample(),)), CompleteOldest((Sample(next_drafts=1),))]
    state = explicit.initial(PRIO_VICTIM_K2)
    for action in actions:
        state = step(state, cfg, action)
    scheduled = schedule(state, cfg)
    assert scheduled.preempted == (0,)
    assert [e.req for e in scheduled.entries] == [1]
    assert scheduled.state.requests[0].block_table == () and scheduled.state.waiting == (0,)


def test_the_waiting_queue_is_in_priority_then_arrival_order():
    cfg = Config(profile="vllm-0.34", scheduling_policy="priority", prefix_caching=False)
    state = explicit.initial(Model("w", cfg, (Prompt(1, 1),) * 3))
    for r, priority in ((0, 2), (1, 0), (2, 2)):
        state = step(state, cfg, Arrive(r, Prompt(1, 1, priority=priority)))
    assert state.waiting == (1, 0, 2)
    fcfs = Config(profile="vllm-0.34", prefix_caching=False)
    plain = explicit.initial(Model("w", fcfs, (Prompt(1, 1),) * 3))
    for r, priority in ((0, 2), (1, 0), (2, 2)):
        plain = step(plain, fcfs, Arrive(r, Prompt(1, 1, priority=priority)))
    assert plain.waiting == (0, 1, 2) and plain.arrivals == ()     # FCFS: as before, priority ignored
    assert all(q.priority == 0 for q in plain.requests)


def test_fcfs_checks_none_of_the_policys_properties_and_0_8_has_no_policy():
    names = {i.name for i in invariants_for(Config())} | {p.name for p in transition_properties_for(Config())}
    assert not PROPERTIES & names
    with pytest.raises(ValueError, match="no priority policy"):
        Config(profile="vllm-0.8.5", scheduling_policy="priority")
    with pytest.raises(ValueError, match="policy must be"):
        Config(profile="vllm-0.34", scheduling_policy="lifo")

