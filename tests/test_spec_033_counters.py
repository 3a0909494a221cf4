"""vLLM 0.33's stale-output counters, drop mode, empty batches and request
names in the spec (docs/vllm-semantics.md
§"vLLM 0.33: stale output, counters and reused ids"; docs/profiles.md §"Invariants per profile"): the counters are kept apart from the batches and agree
with them while names are unique (IF1-IF3, S7'); the engine queues empty
batches; a name reused while its old batch is in flight binds that batch's
output to the new incarnation, as vLLM does, and the spec finds all three
effects of the bug by itself, as shortest counterexamples."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from flightcheck.spec import (
    Abort,
    Arrive,
    ArriveAs,
    CompleteOldest,
    Config,
    Prompt,
    Sample,
    Schedule,
    State,
    Status,
    initial_state,
    invariants_for,
    schedule,
    step,
    transition_properties_for,
)
from flightcheck.verification.explicit.search import search
from flightcheck.verification.models import DEFERRED_K3, PRESSURE_K2, REUSE_K2, Model
from flightcheck.verification.traces.counterexample import from_actions, replay

from flightcheck.cli import main

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

COUNTER_NAMES = {"IF1_in_flight_counter", "IF2_stale_counter", "IF3_no_stale_resumption"}


def run(cfg: Config, actions: list, num_requests: int = 3) -> list[State]:
    states = [initial_state(num_requests, cfg.num_blocks)]
    for a in actions:
        nxt = step(states[-1], cfg, a)
        assert nxt is not None, f"{a} is not enabled"
        states.append(nxt)
    return states


def broken(cfg: Config, before: State, after: State, action) -> set[str]:
    names = {inv.name for inv in invariants_for(cfg) if not inv.holds(after, cfg)}
    return names | {p.name for p in transition_properties_for(cfg) if not p.holds(before, after, action, cfg)}


# --- 1. counters --------------------------------------------------------------------

CFG_033 = Config(num_stages=2, max_num_batched_tokens=2, max_num_seqs=2, block_size=2, num_blocks=3,
                 max_model_len=6, prefix_caching=False, profile="vllm-0.33")


def test_the_0_8_profiles_keep_no_counters_and_state_only_what_they_did():
    """Under 0.8.5 every reachable state has its counters at 0, no reused name
    and no empty batch, and the state count is the pinned one."""
    r = search(PRESSURE_K2, check_liveness=False)
    assert r.num_states == 4853 and r.ok         # 4124 before held drafts (test_explicit_search.py)
    assert not _find_state(PRESSURE_K2, lambda s: any(b == () for b in s.in_flight) or any(
        (q.num_in_flight, q.num_stale, q.drop_stale, q.name) != (0, 0, False, None) for q in s.requests)
        or any(e.name is not None for b in s.in_flight for e in b))
    assert {inv.name for inv in invariants_for(PRESSURE_K2.cfg)}.isdisjoint(COUNTER_NAMES)
    assert [p.name for p in transition_properties_for(PRESSURE_K2.cfg)] == [
        "S4_snapshot_immutability", "S13_fates_only_age", "S12_status_monotonicity"]


def test_schedule_counts_tokens_in_flight_and_completion_settles_them():
    prompt = Prompt(3, 2)
    states = run(CFG_033, [Arrive(0, prompt), Schedule(), Schedule()], num_requests=1)
    q = states[-1].requests[0]
    assert (q.num_computed, q.num_in_flight, q.num_stale) == (3, 3, 0)   # chunks of 2 and 1
    done = step(states[-1], CFG_033, CompleteOldest(()))
    assert done is not None and done.requests[0].num_in_flight == 1
    done = step(done, CFG_033, CompleteOldest((Sample(),)))
    assert done is not None and (done.requests[0].num_in_flight, done.requests[0].num_output) == (0, 1)


def test_the_0_33_model_proves_the_counter_invariants_and_reaches_the_new_targets():
    """deferred-k3 (3 requests, K = 3), with empty batches: pinned count; IF1-IF3,
    S7' and liveness hold; a deferred resumption, a stale output delivered to a
    preempted request and an empty batch in the queue are reached."""
    r = search(DEFERRED_K3)
    assert (r.num_states, r.max_depth) == (76460, 18)
    assert r.ok and all(r.liveness.values())
    assert {"resumption_deferred", "stale_output_delivered", "empty_batch_in_queue"} <= set(r.reached)
    assert "name_reused_in_flight" not in r.reached


@pytest.mark.parametrize("mode", ["deliver", "drop"])
def test_deliver_mode_defers_and_delivers_drop_mode_resumes_at_once(mode):
    """K = 3, so a preempted request's stale output can still be in flight when a slot frees up."""
    model = Model(f"small-k3-033-{mode}", replace(CFG_033, num_stages=3, stale_mode=mode),
                  (Prompt(1, 3), Prompt(3, 2)), allow_stop=False)
    r = search(model)
    assert r.ok, (mode, [(v.property, len(v.path)) for v in r.violations])
    assert ("stale_output_delivered" in r.reached) == (mode == "deliver")
    assert ("resumption_deferred" in r.reached) == (mode == "deliver")
    # drop mode: some request runs again while its (dropped) stale share is still in flight
    resumed_stale = _find_state(model, lambda s: any(q.status is Status.RUNNING and q.num_stale > 0
                                                     for q in s.requests))
    assert resumed_stale == (mode == "drop")


def _find_state(model: Model, predicate) -> bool:
    from flightcheck.verification.explicit.search import initial, successors
    seen, frontier = {initial(model)}, [initial(model)]
    while frontier:
        nxt = []
        for s in frontier:
            if predicate(s):
                return True
            for _, t in successors(model, s):
                if t not in seen:
                    seen.add(t)
                    nxt.append(t)
        frontier = nxt
    return False


def test_an_invariant_names_each_counter_drift():
    s = run(CFG_033, [Arrive(0, Prompt(3, 2)), Schedule()], num_requests=1)[-1]
    assert not broken(CFG_033, s, s, Schedule())
    drifted = s.with_request(0, num_in_flight=1)
    assert "IF1_in_flight_counter" in broken(CFG_033, s, drifted, Schedule())
    negative = s.with_request(0, num_stale=-1)
    assert "IF2_stale_counter" in broken(CFG_033, s, negative, Schedule())
    resumed_stale = s.with_request(0, num_stale=2)
    assert {"IF2_stale_counter", "IF3_no_stale_resumption"} <= broken(CFG_033, s, resumed_stale, Schedule())
    assert "IF3_no_stale_resumption" not in broken(CFG_033, s, s.with_request(0, num_stale=2, drop_stale=True),
                                                   Schedule())


# --- 2. empty batches --------------------------------------------------------------------

def test_a_step_that_forms_nothing_queues_an_empty_batch_under_0_33_only():
    actions = [Arrive(0, Prompt(2, 2)), Schedule()]      # its sampling prefill is in flight
    s = run(CFG_033, actions, num_requests=1)[-1]
    idle = schedule(s, CFG_033)
    assert idle is not None and idle.entries == () and idle.preempted == ()
    assert idle.state.in_flight == s.in_flight + ((),)
    assert not broken(CFG_033, s, idle.state, Schedule())               # S11': empties count, may be empty
    assert schedule(idle.state, CFG_033) is None                         # K = 2: the queue is full
    cfg_085 = replace(CFG_033, profile="vllm-0.8.5", release_order=None)
    s_085 = run(cfg_085, actions, num_requests=1)[-1]
    assert schedule(s_085, cfg_085) is None
    # completing it changes no request
    drained = step(step(idle.state, CFG_033, CompleteOldest((Sample(),))), CFG_033, CompleteOldest(()))
    assert drained is not None and drained.in_flight == () and drained.requests[0].num_output == 1


def test_no_empty_batch_without_an_unfinished_request():
    s = initial_state(1, CFG_033.num_blocks)
    assert schedule(s, CFG_033) is None


# --- 3. names and incarnations --------------------------------------------------------------------

def test_a_name_is_reused_only_with_the_flag_and_only_once_its_holder_finished():
    reuse = replace(CFG_033, allow_name_reuse=True)
    for cfg in (CFG_033, reuse):
        s = run(cfg, [Arrive(0, Prompt(2, 1)), Schedule()])[-1]
        assert step(s, cfg, ArriveAs(2, Prompt(2, 1), 0)) is None          # r0 still holds the name
        aborted = step(s, cfg, Abort(0))
        again = step(aborted, cfg, ArriveAs(2, Prompt(2, 1), 0))
        assert (again is not None) == cfg.allow_name_reuse
        assert step(aborted, cfg, ArriveAs(2, Prompt(2, 1), 1)) is None    # r1 never arrived


def test_with_unique_names_the_lookup_by_name_is_the_lookup_by_slot():
    """A finished request's in-flight output is dropped (no holder), as before."""
    s = run(CFG_033, [Arrive(0, Prompt(2, 3)), Schedule(), Abort(0)])[-1]
    done = step(s, CFG_033, CompleteOldest(()))
    assert done is not None and done.requests[0].num_output == 0 and done.in_flight == ()


def test_a_reused_name_binds_the_old_batch_s_output_to_the_new_incarnation():
    """docs/vllm-semantics.md §"vLLM 0.33: stale output, counters and reused ids", effect (a): old r0 aborted with its sampling prefill in flight, a new
    request arrives under its name: the old token is appended to it (S7'),
    and its in-flight counter goes below 0 (IF1, IF2)."""
    cfg = replace(CFG_033, allow_name_reuse=True)
    states = run(cfg, [Arrive(0, Prompt(2, 1)), Schedule(), Abort(0), ArriveAs(2, Prompt(2, 2), 0)])
    before = states[-1]
    after = step(before, cfg, CompleteOldest((Sample(),)))
    assert after is not None
    assert (after.requests[2].num_output, after.requests[2].num_in_flight) == (1, -2)
    assert {"S7p_binding_by_incarnation", "IF1_in_flight_counter", "IF2_stale_counter"} <= broken(
        cfg, before, after, CompleteOldest((Sample(),)))


# --- 4. the bug, found by the spec alone ------------------------------------------------------

@pytest.fixture(scope="module")
def reuse_search():
    return search(REUSE_K2)


def test_without_name_reuse_the_reuse_model_proves_every_property(reuse_search):
    clean = search(Model("reuse-k2-unique", replace(REUSE_K2.cfg, allow_name_reuse=False), REUSE_K2.prompts,
                         allow_stop=False))
    assert clean.ok and clean.liveness == {"L1_L3_every_request_can_finish": True,
                                           "L4_every_run_terminates": True}


def test_name_reuse_gives_the_wrong_binding_the_negative_counter_and_the_hang_as_shortest_counterexamples(
        reuse_search):
    shortest = {v.property: len(v.path) for v in reuse_search.violations}
    assert {"S7p_binding_by_incarnation": 5, "IF1_in_flight_counter": 5, "IF2_stale_counter": 5,
            "L4_every_run_terminates": 14}.items() <= shortest.items()
    assert "L1_L3_every_request_can_finish" in shortest
    assert "name_reused_in_flight" in reuse_search.reached
    # the counters drift only where the binding went wrong: IF3 (no stale resumption) still holds
    assert "IF3_no_stale_resumption" not in shortest


def test_the_hang_is_a_lasso_on_empty_batches(reuse_search):
    v = next(v for v in reuse_search.violations if v.property == "L4_every_run_terminates")
    actions = [a for a, _ in v.path]
    states = replay(REUSE_K2, actions)
    assert "lasso" in v.message
    # the loop: an empty batch scheduled and completed, back to the state it left,
    # with a request PREEMPTED on a negative stale count that never drains
    loop_start = states[-3]
    assert states[-1] == loop_start and states[-2].in_flight == loop_start.in_flight + ((),)
    stuck = [q for q in loop_start.requests if q.status is Status.PREEMPTED]
    assert stuck and stuck[0].num_stale < 0 and not any(loop_start.in_flight)
    cx = from_actions(REUSE_K2, v.property, actions, v.message)
    assert cx.length == 14


def test_verify_allow_name_reuse_prints_each_counterexample_and_fails(capsys):
    assert main(["verify", "--profile", "vllm-0.33", "--allow-name-reuse", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["allow_name_reuse"] and report["mutants"] == []
    found = {cx["property"]: len(cx["actions"]) for cx in report["counterexamples"]}
    assert {"S7p_binding_by_incarnation": 5, "IF1_in_flight_counter": 5, "IF2_stale_counter": 5,
            "L4_every_run_terminates": 14}.items() <= found.items()
    rows = {p["name"]: p["status"] for p in report["properties"]}
    assert rows["name_reused_in_flight"] == "reached" and rows["IF3_no_stale_resumption"] == "proved"
    assert main(["verify", "--profile", "vllm-0.33", "--allow-name-reuse"]) == 1
    out = capsys.readouterr().out
    assert "S7p_binding_by_incarnation violated after 5 steps on model reuse-k2" in out
    assert "a lasso" in out


def test_verify_allow_name_reuse_needs_a_profile_that_looks_outputs_up_by_name(capsys):
    assert main(["verify", "--allow-name-reuse"]) == 2
    assert "--allow-name-reuse needs a profile" in capsys.readouterr().err


# --- 5. mutants of 0.33's counters --------------------------------------------------------------

def test_the_profile_mutants_are_hunted_under_their_profile_only():
    from flightcheck.verification.mutants import MUTANTS, PROFILE_MUTANTS, mutants_of
    own = set(PROFILE_MUTANTS["vllm-0.33"])
    assert own == {"resumption_not_deferred", "drop_leaves_counters", "stale_drained_by_wrong_batch",
                   "in_flight_kept_without_output"}
    assert own.isdisjoint(MUTANTS)                             # the default run's set (and golden file) keep theirs
    assert own <= set(mutants_of("vllm-0.33")) and own.isdisjoint(mutants_of("vllm-0.8.5"))


@pytest.mark.parametrize("name", ["resumption_not_deferred", "drop_leaves_counters",
                                  "stale_drained_by_wrong_batch", "in_flight_kept_without_output"])
def test_each_counter_mutant_is_killed_as_recorded_and_the_correct_spec_passes_its_model(name):
    import inspect

    from flightcheck.verification.models import mutant_model
    from flightcheck.verification.mutants import mutant, stale_fingerprints
    from flightcheck.verification.mutants.registry import ORIGINALS
    from flightcheck.verification.suite import SOMETIMES_NAMES, hunt_mutant
    m = mutant(name)
    assert not stale_fingerprints(m)
    for target, replacement in m.replaces.items():
        assert list(inspect.signature(replacement).parameters) == list(inspect.signature(ORIGINALS[target]).parameters)
        assert name in (replacement.__doc__ or "")
    result = hunt_mutant(name, profile="vllm-0.33")
    assert result.killed and (result.property, result.trace_length) == (m.killed_by, m.shortest)
    cx = result.counterexample
    assert replay(cx.model, cx.actions) == cx.states
    clean = search(mutant_model(name, "vllm-0.33").with_mutant(None))
    assert not [v.property for v in clean.violations if v.property not in SOMETIMES_NAMES]


# --- check-trace on vLLM 0.33's real id-reuse runs (recorded, no vLLM needed) -------------------

TRACES_033 = Path(__file__).parent / "data" / "vllm" / "traces-0.33"
# where each run applies old r0's batch-1 token to the new r0 (tests/test_vllm_033.py records
# them afresh from tests/data/vllm/workloads-0.33.json when vLLM 0.33's venv is there)
REUSE_REJECTED_AT = {"id-reuse-wrong-binding": 7, "id-reuse-hang": 8, "id-reuse-assertion": 9}


@pytest.mark.parametrize("name", sorted(REUSE_REJECTED_AT))
@pytest.mark.parametrize("full", [False, True])
def test_check_trace_rejects_a_real_id_reuse_run_where_the_old_output_is_applied(name, full):
    from flightcheck.verification.traces.check import check_trace
    trace = TRACES_033 / f"{name}.jsonl"
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    verdict = check_trace(trace, full=full)
    assert verdict.profile == "vllm-0.33" and not verdict.ok
    assert (verdict.event_index, verdict.property) == (REUSE_REJECTED_AT[name], "S7_output_binding")
    applied = events[verdict.event_index]
    assert applied["ev"] == "complete" and applied["batch"] == 1 and applied["tokens"]["r0"]
    # the second arrive of r0, after the first one's abort, came before: a new incarnation
    arrivals = [i for i, e in enumerate(events) if e["ev"] == "arrive" and e["req"] == "r0"]
    assert len(arrivals) == 2 and arrivals[1] < verdict.event_index


@pytest.mark.parametrize("name", sorted(REUSE_REJECTED_AT))
@pytest.mark.parametrize("full", [False, True])
def test_check_trace_accepts_the_same_run_with_a_fresh_id(name, full):
    from flightcheck.verification.traces.check import check_trace
    verdict = check_trace(TRACES_033 / f"{name}-fresh-id.jsonl", full=full)
    assert verdict.profile == "vllm-0.33" and verdict.ok, verdict
