"""The KV connector in the spec (docs/kv-connector.md): each action and each
named property on hand-built runs, fast. The exhaustive proofs are in
tests/test_spec_kv_search.py."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from flightcheck.spec import (Abort, Arrive, CompleteOldest, Config, FailKvLoad, KvConnector, Load, Prompt,
                              ReceiveKv, Sample, Schedule, SendKv, State, Status, initial_state, invariants_for,
                              step, transition_properties_for, violated)
from flightcheck.spec.invariants import KV_INVARIANTS
from flightcheck.spec.kv_fence import can_free_now, release_table
from flightcheck.spec.schedule import schedule
from flightcheck.spec.profiles import PROFILES
from flightcheck.spec.transitions import KV_TRANSITION_PROPERTIES
from flightcheck.verification.explicit import search as explicit
from flightcheck.verification.kv_models import KV_FENCE_K2, KV_SEND_K2


def cfg_of(profile: str = "vllm-0.34", **kv) -> Config:
    return Config(num_stages=2, max_num_batched_tokens=4, max_num_seqs=2, block_size=2, num_blocks=6,
                  max_model_len=10, prefix_caching=False, profile=profile, kv_connector=KvConnector(**kv))


def run(cfg: Config, prompts: list[Prompt], actions: list) -> list[State]:
    """Every state of the run; each action must be enabled, and no invariant
    or transition property may break on the way."""
    state = initial_state(len(prompts), cfg.num_blocks)
    states = [state]
    for action in actions:
        if action == "arrive":
            action = Arrive(sum(1 for q in state.requests if q.status is not Status.NEW),
                            prompts[sum(1 for q in state.requests if q.status is not Status.NEW)])
        nxt = step(state, cfg, action)
        assert nxt is not None, f"{action} disabled"
        assert [i.name for i in violated(nxt, cfg)] == [], action
        assert [p.name for p in transition_properties_for(cfg) if not p.holds(state, nxt, action, cfg)] == []
        state = nxt
        states.append(state)
    return states


ASYNC = Prompt(5, 2, external_hit=4, load_async=True)
SYNC = Prompt(5, 2, external_hit=4)


def test_without_a_connector_nothing_changes():
    cfg = Config(prefix_caching=False)
    assert cfg.kv_connector is None
    assert not any(i.name.startswith("KV") for i in invariants_for(cfg))
    assert not any(p.name.startswith(("KV", "P_KV")) for p in transition_properties_for(cfg))
    state = step(initial_state(1, cfg.num_blocks), cfg, Arrive(0, Prompt(3, 1, external_hit=2)))
    assert state.requests[0].external_hit == 0 and state.kv_holding == () and state.arrivals == ()


def test_each_profile_has_its_rows_of_the_version_table():
    p = PROFILES
    assert not p["vllm-0.8.4"].kv_sync_hits
    assert p["vllm-0.8.5"].kv_sync_hits and not p["vllm-0.8.5"].kv_async_loads
    for name in ("vllm-0.33", "vllm-0.33-async", "vllm-0.34", "vllm-0.34-async"):
        rules = p[name]
        assert all((rules.kv_async_loads, rules.kv_load_failures, rules.kv_send_hold, rules.kv_aborted_load_held,
                    rules.kv_step_fence, rules.kv_holding_first, rules.kv_producer_drops_stale_output)), name
        assert rules.kv_inflight_load_limit == name.startswith("vllm-0.34"), name


def test_a_sync_hit_is_computed_at_schedule_time_and_loaded_by_the_batch():
    s = run(cfg_of(), [SYNC], ["arrive", Schedule()])[-1]
    q = s.requests[0]
    assert q.status is Status.RUNNING and q.load is Load.DONE and q.num_computed == 5
    (entry,) = s.in_flight[0]
    assert (entry.start, entry.n, entry.external) == (4, 1, 4)


def test_an_async_hit_parks_then_the_landed_load_is_promoted_and_scheduled_in_one_call():
    states = run(cfg_of(), [ASYNC], ["arrive", Schedule(), ReceiveKv(0), Schedule()])
    parked, landed, ran = states[2], states[3], states[4]
    q = parked.requests[0]
    assert (q.status, q.load, q.num_computed, len(q.block_table)) == (Status.WAITING_FOR_REMOTE_KVS,
                                                                        Load.IN_FLIGHT, 4, 2)
    assert parked.kv_holding == (0,) and parked.waiting == () and parked.in_flight == ((),)   # 0.34: empty batch
    assert schedule(states[1], cfg_of()).kv_loads == ((0, 4),)              # the trace's schedule.kv_loads
    assert landed.requests[0].load is Load.RECEIVED
    q = ran.requests[0]
    assert q.status is Status.RUNNING and q.load is Load.DONE and ran.kv_holding == ()
    assert ran.in_flight[-1][0].start == 4


def test_a_load_of_every_token_leaves_the_last_one_to_compute():
    full = Prompt(4, 2, external_hit=8, load_async=True)
    s = run(cfg_of(), [full], ["arrive", Schedule(), ReceiveKv(0), Schedule()])[-1]
    (entry,) = s.in_flight[-1]
    assert (entry.start, entry.n, entry.samples) == (3, 1, True)


def test_the_connector_is_asked_once_per_request():
    cfg = cfg_of()
    s = run(cfg, [SYNC], ["arrive", Schedule()])[-1]
    preempted = replace(s, running=(), waiting=(0,), in_flight=())
    preempted = preempted.with_request(0, status=Status.PREEMPTED, num_computed=0, block_table=(),
                                       num_in_flight=0)
    preempted = replace(preempted, pool=release_table(s, cfg, 0, s.requests[0].block_table).pool)
    again = step(preempted, cfg, Schedule())
    assert again.in_flight[-1][0].start == 0 and again.in_flight[-1][0].external == 0


def test_a_request_level_failure_recomputes_a_parked_load_from_nothing():
    cfg = cfg_of()
    states = run(cfg, [ASYNC], ["arrive", Schedule(), FailKvLoad(0, 0), ReceiveKv(0), Schedule()])
    assert states[3].requests[0].load is Load.FAILED and states[3].requests[0].num_computed == 0
    q = states[-1].requests[0]
    assert q.status is Status.RUNNING and states[-1].in_flight[-1][0].start == 0


def test_a_block_level_failure_keeps_the_valid_prefix():
    states = run(cfg_of(), [ASYNC], ["arrive", Schedule(), FailKvLoad(0, 1), ReceiveKv(0), Schedule()])
    assert states[-1].in_flight[-1][0].start == 2


def test_a_failure_must_name_a_block_of_the_load():
    cfg = cfg_of()
    parked = run(cfg, [ASYNC], ["arrive", Schedule()])[-1]
    assert step(parked, cfg, FailKvLoad(0, 2)) is None                    # past the load
    running = run(cfg, [Prompt(5, 2, external_hit=2)], ["arrive", Schedule()])[-1]
    assert step(running, cfg, FailKvLoad(0, 1)) is None                   # not a loaded block
    assert step(running, replace(cfg, profile="vllm-0.8.5"), FailKvLoad(0, 0)) is None   # 0.8.5: no failures


def test_a_sync_failure_with_its_batch_in_flight_rolls_every_counter_back():
    cfg = cfg_of("vllm-0.34-async")
    states = run(cfg, [Prompt(3, 3, external_hit=2)], ["arrive", Schedule(), Schedule(), FailKvLoad(0, 0)])
    before, after = states[-2], states[-1]
    assert before.requests[0].placeholders == 1
    q = after.requests[0]
    assert (q.num_computed, q.placeholders, q.num_stale, q.drop_stale) == (0, 0, q.num_in_flight, True)
    assert not after.entries_of(0)
    s = run(cfg, [Prompt(3, 3, external_hit=2)], ["arrive", Schedule(), Schedule(), FailKvLoad(0, 0),
                                                 CompleteOldest(()), Schedule()])[-1]
    assert s.in_flight[-1][0].start == 0                                  # recomputed from the valid prefix


def test_the_fail_policy_finishes_with_an_error_and_holds_a_parked_table_until_its_report():
    cfg = cfg_of(load_failure_policy="fail")
    states = run(cfg, [ASYNC], ["arrive", Schedule(), FailKvLoad(0, 1), ReceiveKv(0)])
    failed, reported = states[3].requests[0], states[4].requests[0]
    assert failed.status is Status.FINISHED_ERROR and failed.held and failed.block_table
    assert not reported.held and not reported.block_table


def test_an_abort_during_a_load_holds_its_blocks_until_the_report():
    cfg = cfg_of()
    states = run(cfg, [ASYNC], ["arrive", Schedule(), Abort(0), ReceiveKv(0)])
    aborted = states[3]
    assert aborted.requests[0].held and set(aborted.requests[0].block_table).isdisjoint(aborted.pool.free_queue)
    assert len(states[4].pool.free_queue) == cfg.num_blocks


def test_an_abort_after_the_load_landed_frees_at_once():
    s = run(cfg_of(), [ASYNC], ["arrive", Schedule(), ReceiveKv(0), Abort(0)])[-1]
    assert not s.requests[0].held and not s.requests[0].block_table


def test_a_producer_holds_a_finished_request_until_it_is_sent():
    cfg = cfg_of(consumer=False, producer=True)
    states = run(cfg, [Prompt(3, 1)], ["arrive", Schedule(), CompleteOldest((Sample(),)), SendKv(0)])
    finished = states[3].requests[0]
    assert finished.status is Status.FINISHED_LENGTH and finished.held and finished.block_table
    assert step(states[3], cfg, ReceiveKv(0)) is None
    assert len(states[4].pool.free_queue) == cfg.num_blocks and not states[4].requests[0].held


def test_under_the_fence_a_finished_request_s_blocks_wait_for_its_last_batch():
    cfg = replace(cfg_of(), max_num_batched_tokens=2)
    states = run(cfg, [Prompt(3, 1)], ["arrive", Schedule(), Schedule(), Abort(0), CompleteOldest(()),
                                       CompleteOldest(())])
    aborted, one_done, all_done = states[4], states[5], states[6]
    assert aborted.deferred_frees == ((2, (0, 1)),)
    assert one_done.deferred_frees == ((1, (0, 1)),)
    assert all_done.deferred_frees == () and len(all_done.pool.free_queue) == cfg.num_blocks


def test_without_the_fence_blocks_are_freed_at_once():
    cfg = replace(cfg_of(consumer=False, producer=True), max_num_batched_tokens=2)
    s = run(cfg, [Prompt(3, 1)], ["arrive", Schedule(), Schedule(), Abort(0)])[-1]
    assert s.deferred_frees == () and len(s.pool.free_queue) == cfg.num_blocks


def reachable(model):
    """Every reachable state of a small connector model, breadth-first."""
    seen, frontier = {explicit.initial(model)}, [explicit.initial(model)]
    while frontier:
        frontier = [t for s in frontier for _, t in explicit.successors(model, s) if t not in seen]
        seen.update(frontier)
    return seen


def test_a_victim_whose_free_would_be_fenced_is_not_preempted():
    cfg = KV_FENCE_K2.cfg
    unfenced = replace(cfg, kv_connector=KvConnector(consumer=False))
    held_back = [s for s in reachable(KV_FENCE_K2)
                 if (plain := schedule(s, unfenced)) is not None and plain.preempted
                 and (fenced := schedule(s, cfg)) is not None and not fenced.preempted]
    assert held_back
    for s in held_back:
        assert not can_free_now(s, cfg, s.running[-1])


def test_a_producer_s_preemption_drops_the_victim_s_output():
    preemptions = [scheduled for s in reachable(KV_SEND_K2)
                   if (scheduled := schedule(s, KV_SEND_K2.cfg)) is not None and scheduled.preempted]
    assert preemptions
    assert all(sch.state.requests[r].drop_stale for sch in preemptions for r in sch.preempted)


def test_landed_loads_go_before_a_plain_waiting_request():
    cfg = replace(cfg_of(), num_blocks=4)
    plain = Prompt(7, 1)                       # needs every block of the pool
    s = run(cfg, [ASYNC, plain], ["arrive", Schedule(), "arrive", ReceiveKv(0)])[-1]
    assert s.kv_holding == (0,) and s.waiting == (1,)
    nxt = step(replace(s, in_flight=()), cfg, Schedule())
    assert nxt.requests[0].status is Status.RUNNING


def test_the_0_34_load_limit_holds_a_second_load_back_and_loads_start_without_a_seat():
    cfg = replace(cfg_of(max_inflight_loads=1), max_num_seqs=1)
    two = [ASYNC, Prompt(3, 1, external_hit=2, load_async=True), Prompt(1, 1)]
    s = run(cfg, two, ["arrive", "arrive", Schedule()])[-1]
    assert s.requests[0].load is Load.IN_FLIGHT and s.requests[1].load is Load.NONE
    s = run(cfg, two, ["arrive", "arrive", "arrive", Schedule()])[-1]
    assert s.requests[2].status is Status.RUNNING                        # the plain one runs beside the load
    s = run(replace(cfg, kv_connector=KvConnector()), two, ["arrive", "arrive", "arrive", Schedule()])[-1]
    assert s.requests[1].load is Load.IN_FLIGHT                          # no limit: both loads start


def test_the_connector_properties_apply_only_with_a_connector():
    names = {i.name for i in KV_INVARIANTS} | {"KV6_load_limit"}
    assert names <= {i.name for i in invariants_for(cfg_of(max_inflight_loads=1))}
    assert "KV6_load_limit" not in {i.name for i in invariants_for(cfg_of())}
    assert {p.name for p in KV_TRANSITION_PROPERTIES} <= {p.name for p in transition_properties_for(cfg_of())}
    assert "KV3_rollback_restores_counters" not in {
        p.name for p in transition_properties_for(cfg_of("vllm-0.8.5"))}


@pytest.mark.parametrize("broken, name", [
    ("freed_held_table", "KV1_no_reuse_under_transfer"),
    ("scheduled_while_loading", "KV2_loading_not_scheduled"),
    ("finished_keeps_table", "KV4_no_leak"),
    ("deferred_with_nothing_in_flight", "KV4_no_leak"),
    ("over_the_limit", "KV6_load_limit"),
])
def test_each_invariant_can_fail(broken, name):
    cfg = cfg_of(max_inflight_loads=1)
    parked = run(cfg, [ASYNC, ASYNC], ["arrive", Schedule(), "arrive", Abort(0)])[-1]
    if broken == "freed_held_table":
        s = replace(parked, pool=replace(parked.pool, free_queue=parked.pool.free_queue + (0,)))
    elif broken == "scheduled_while_loading":
        s = run(cfg, [ASYNC], ["arrive", Schedule()])[-1]
        s = replace(s, running=(0,), kv_holding=())
    elif broken == "finished_keeps_table":
        s = parked.with_request(0, held=False)
    elif broken == "deferred_with_nothing_in_flight":
        s = replace(parked, deferred_frees=((1, (5,)),))
    else:
        s = run(cfg, [ASYNC, ASYNC], ["arrive", Schedule()])[-1].with_request(1, load=Load.IN_FLIGHT)
    assert name in {i.name for i in violated(s, cfg)}


def test_kv5_fails_when_a_plain_request_blocks_a_landed_load():
    cfg = replace(cfg_of(), num_blocks=4)
    s = run(cfg, [ASYNC, Prompt(7, 1)], ["arrive", Schedule(), "arrive", ReceiveKv(0)])[-1]
    s = replace(s, in_flight=(), kv_holding=(), waiting=(1, 0))    # vLLM before #45388: one queue
    kv5 = next(i for i in KV_INVARIANTS if i.name == "KV5_loaded_not_starved")
    assert not kv5.holds(s, cfg)
    promoted_first = replace(s, kv_holding=(0,), waiting=(1,))          # the correct order
    assert kv5.holds(promoted_first, cfg)


def test_kv3_and_p_kv_can_fail():
    cfg = cfg_of("vllm-0.34-async")
    states = run(cfg, [Prompt(3, 3, external_hit=2)], ["arrive", Schedule(), Schedule()])
    before = states[-1]
    after = step(before, cfg, FailKvLoad(0, 0)).with_request(0, placeholders=1)    # #49250
    kv3, p_kv = KV_TRANSITION_PROPERTIES
    assert kv3.holds(before, step(before, cfg, FailKvLoad(0, 0)), FailKvLoad(0, 0), cfg)
    assert not kv3.holds(before, after, FailKvLoad(0, 0), cfg)
    cfg = KV_SEND_K2.cfg
    before = next(s for s in reachable(KV_SEND_K2) if (sch := schedule(s, cfg)) is not None and sch.preempted)
    after = schedule(before, cfg).state
    assert p_kv.holds(before, after, Schedule(), cfg)
    put_aside = replace(after, deferred_frees=((1, before.requests[before.running[-1]].block_table),))
    assert not p_kv.holds(before, put_aside, Schedule(), cfg)        # vLLM #49674: a fenced victim's free


def test_vllm_0_8_5_has_sync_hits_only_and_0_8_4_none():
    cfg = cfg_of("vllm-0.8.5")
    s = run(cfg, [ASYNC], ["arrive", Schedule()])[-1]
    q = s.requests[0]
    assert not q.load_async and q.status is Status.RUNNING and s.in_flight[-1][0].external == 4
    cfg = replace(cfg_of("vllm-0.8.4"), continue_prefill=None, release_order=None, num_preallocate_tokens=None,
                  cache_duplicate_blocks=None)
    s = run(cfg, [SYNC], ["arrive", Schedule()])[-1]
    assert s.requests[0].external_hit == 0 and s.in_flight[-1][0].start == 0


def test_verify_kv_connector_refuses_a_profile_without_async_loads(capsys):
    from flightcheck.cli import main
    assert main(["verify", "--kv-connector"]) == 2
    assert "--kv-connector needs a profile" in capsys.readouterr().err
    assert main(["verify", "--kv-connector", "--profile", "vllm-0.34", "--all-profiles"]) == 2


def test_verify_kv_connector_searches_the_profile_s_connector_models(capsys):
    from flightcheck.cli import main
    # --no-z3: the Z3 rows of --kv-connector (minutes) are tests/test_z3_kv.py's
    assert main(["verify", "--kv-connector", "--profile", "vllm-0.33", "--json", "--no-z3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["kv_connector"] and out["profile"] == "vllm-0.33"
    methods = {p["method"].split(" (")[0] for p in out["properties"]}
    assert methods == {f"exhaustive {m}" for m in ("kv-load-fail-k2", "kv-load-error-k2", "kv-send-k2",
                                                   "kv-fence-k2")}
    proved = {p["name"] for p in out["properties"] if p["status"] == "proved"}
    assert {"KV1_no_reuse_under_transfer", "KV2_loading_not_scheduled", "KV3_rollback_restores_counters",
            "KV4_no_leak", "KV5_loaded_not_starved", "P_KV_preemption_frees"} <= proved
