"""The `vllm-0.33-async` profile (issue 22): vLLM 0.33's AsyncScheduler with
the V2 model runner under pipeline parallelism -- a queue of K + 1 batches,
output placeholders, decodes of one request K schedule() calls apart, the
max_tokens guard counting placeholders -- its invariants (IA1, IA2, S6' and
the restated S3, S5, L2), its sometimes-targets and its mutants."""

from __future__ import annotations

from dataclasses import replace

import pytest
from flightcheck.spec import (
    Config,
    Prompt,
    Sample,
    State,
    initial_state,
    invariants_for,
)
from flightcheck.spec.actions import arrive, complete_oldest
from flightcheck.spec.invariants import placeholders_match_entries, placeholders_within_max_tokens
from flightcheck.spec.profiles import PROFILES
from flightcheck.spec.schedule import schedule
from flightcheck.verification.explicit import search as explicit
from flightcheck.verification.models import (
    ASYNC_DRAFTS_K2,
    ASYNC_DROP_K2,
    ASYNC_K3,
    PROFILE_MODELS,
)
from flightcheck.verification.mutants import applied
from flightcheck.verification.mutants.registry import PROFILE_MUTANTS
from flightcheck.verification.suite import (
    EXPLICIT_ONLY_PROFILES,
    Z3_PROFILES,
    hunt_mutant,
)

ASYNC = "vllm-0.33-async"


def _cfg(**changes) -> Config:
    base = dict(num_stages=2, max_num_batched_tokens=4, max_num_seqs=2, block_size=2, num_blocks=6,
                max_model_len=12, prefix_caching=False, profile=ASYNC)
    return Config(**(base | changes))


def _scheduled(state: State, cfg: Config) -> State:
    result = schedule(state, cfg)
    assert result is not None
    return result.state


def _holds(state: State, cfg: Config) -> list[str]:
    return [inv.name for inv in invariants_for(cfg) if not inv.holds(state, cfg)]


def test_the_profile_is_0_33_plus_async_and_the_queue_and_stagger_follow_k():
    sync, async_ = PROFILES["vllm-0.33"], PROFILES[ASYNC]
    # (both cache settled blocks on output: sync 0.33 with drafts, async with placeholders)
    assert replace(async_, name=sync.name, output_placeholders=False, extra_queued_batches=0,
                   decode_stagger_is_pipeline_depth=False, draft_source="submission") == sync
    assert (sync.draft_source, async_.draft_source) == ("submission", "placeholders")
    assert (_cfg(num_stages=3).queue_depth, _cfg(num_stages=3).stagger) == (4, 3)
    assert (Config(num_stages=3, profile="vllm-0.33").queue_depth, Config(num_stages=3, profile="vllm-0.33").stagger) == (3, 0)
    # a trace's explicit keys override the profile's
    assert (_cfg(batch_queue_depth=2, decode_stagger=1).queue_depth, _cfg(decode_stagger=1).stagger) == (2, 1)
    # num_stages changed by replace carries depth and stagger along
    assert replace(_cfg(), num_stages=4).queue_depth == 5


def test_sync_profiles_keep_their_invariants_and_async_restates_s3_s5_s6_l2():
    sync_names = [i.name for i in invariants_for(Config(profile="vllm-0.33"))]
    assert "IA1_placeholders" not in sync_names and "S6_decode_gating" in sync_names
    names = [i.name for i in invariants_for(_cfg())]
    assert {"IA1_placeholders", "IA2_placeholders_within_max_tokens", "S6p_async_decode_gating",
            "S3a_async_coverage", "S5a_async_sampling", "IF1_in_flight_counter"} <= set(names)
    assert not {"S6_decode_gating", "S3_contiguous_coverage", "S5_one_sample_per_prefill"} & set(names)


def test_a_decode_is_scheduled_behind_the_previous_one_after_the_stagger():
    cfg = _cfg()                                           # K = 2: depth 3, stagger 2
    s = arrive(initial_state(1, cfg.num_blocks), cfg, 0, Prompt(2, 3))
    s = _scheduled(s, cfg)                                 # the prefill samples: one placeholder
    q = s.requests[0]
    assert (q.num_computed, q.placeholders, q.decode_countdown) == (2, 1, 2)
    s = _scheduled(s, cfg)                                 # one call later: held back, an empty batch
    assert s.in_flight[-1] == () and s.requests[0].decode_countdown == 1
    s = _scheduled(s, cfg)                                 # two calls later: the decode, token 1 not back yet
    q = s.requests[0]
    assert (q.num_computed, q.placeholders, len(s.in_flight)) == (3, 2, 3)
    assert q.num_computed == q.num_tokens + q.placeholders - 1 and not _holds(s, cfg)
    assert schedule(s, cfg) is None                        # the queue holds K + 1 batches
    s = complete_oldest(s, cfg, (Sample(),))               # the prefill's token returns
    assert s is not None
    q = s.requests[0]
    assert (q.num_output, q.placeholders, q.num_computed) == (1, 1, 3) and not _holds(s, cfg)


def test_the_max_tokens_guard_counts_placeholders_and_its_mutant_schedules_past_max_tokens():
    cfg = _cfg()
    s = arrive(initial_state(1, cfg.num_blocks), cfg, 0, Prompt(2, 2))
    for _ in range(3):
        s = _scheduled(s, cfg)                             # prefill, an empty batch, the decode
    s = complete_oldest(s, cfg, (Sample(),))               # the prefill's token: [empty, decode] in flight
    s = complete_oldest(s, cfg, ())                        # the empty batch: [decode]
    assert s is not None and (s.requests[0].num_output, s.requests[0].placeholders) == (1, 1)
    s = _scheduled(s, cfg)                                 # within the stagger: an empty batch
    assert s.requests[0].decode_countdown == 1 and s.in_flight[-1] == ()
    # out of the stagger: the guard holds it back (one token in flight reaches max_tokens)
    guarded = schedule(s, cfg)
    assert guarded is not None and not guarded.entries and placeholders_within_max_tokens(guarded.state, cfg, 0)
    assert guarded.state.requests[0].decode_countdown == 0
    with applied("async_max_tokens_guard_off_by_one"):
        mutated = schedule(s, cfg)
    assert mutated is not None and mutated.entries and not placeholders_within_max_tokens(mutated.state, cfg, 0)


def test_preemption_resets_the_placeholders_but_not_the_countdown():
    """`_preempt_request` sets num_output_placeholders = 0 and leaves
    next_decode_eligible_step alone; the in-flight tokens become stale."""
    from flightcheck.spec.schedule import _mark_stale_output, _preempt, _Step
    cfg = _cfg()
    s = arrive(initial_state(1, cfg.num_blocks), cfg, 0, Prompt(2, 3))
    s = _scheduled(s, cfg)
    assert (s.requests[0].placeholders, s.requests[0].decode_countdown) == (1, 2)
    step = _Step(s, cfg)                                   # the next call: the countdown moves to 1
    _preempt(step, 0)
    _mark_stale_output(step, 0)
    q = step.state.requests[0]
    assert (q.placeholders, q.decode_countdown, q.num_computed, q.num_stale) == (0, 1, 0, 2)
    assert placeholders_match_entries(step.state, cfg, 0)    # (mid-call: this call's batch is not queued yet)
    with applied("async_placeholders_kept_on_preemption"):
        step = _Step(s, cfg)
        _preempt(step, 0)
        _mark_stale_output(step, 0)
    assert step.state.requests[0].placeholders == 1 and not placeholders_match_entries(step.state, cfg, 0)


# -- exhaustive search: every property proved, every target reached, counts pinned --

# (async-drafts-k2 and async-drop-k2, k = 1: 2,465 and 6,968 states while a
# completion chose the drafts for the next step; 1,302 and 3,875 since
# AsyncScheduler's placeholder drafts, k after every sampling entry, and the
# padded admissions of spec/drafts.py; async-drop-k2 3,968 since the spec
# keeps vLLM's is_prefill_chunk for that padding, not derived from counters)
PINNED = {ASYNC_K3.name: 21554, ASYNC_DRAFTS_K2.name: 1302, ASYNC_DROP_K2.name: 3968}


@pytest.mark.parametrize("model", PROFILE_MODELS[ASYNC], ids=lambda m: m.name)
def test_exhaustive_search_of_each_async_model_proves_everything_and_reaches_every_target(model):
    r = explicit.search(model)
    assert r.complete and not r.violations, [(v.property, v.message) for v in r.violations]
    assert r.num_states == PINNED[model.name]
    assert {"decode_behind_decode", "stopped_with_output_in_flight", "empty_batch_in_queue"} <= set(r.reached)


def test_verify_runs_the_z3_engines_under_the_async_profile():
    assert ASYNC in Z3_PROFILES and ASYNC not in EXPLICIT_ONLY_PROFILES


# -- the profile's mutants: each killed by the property it breaks ---------------------

EXPECTED_KILLS = {
    "async_rejections_not_settled": "IA1_placeholders",
    "async_placeholders_kept_on_preemption": "IA1_placeholders",
    "async_stagger_ignored": "S6p_async_decode_gating",
    "async_max_tokens_guard_off_by_one": "IA2_placeholders_within_max_tokens",
    # (IA1 until the placeholder drafts; since, S5a breaks first, at the same length)
    "async_decode_on_stale_placeholder": "S5a_async_sampling",
}


def test_the_async_mutants_are_the_five_issue_22_names():
    assert set(PROFILE_MUTANTS[ASYNC]) == set(EXPECTED_KILLS)


@pytest.mark.parametrize("name", sorted(EXPECTED_KILLS))
def test_each_async_mutant_is_killed_by_its_property(name):
    result = hunt_mutant(name, profile=ASYNC)
    mutant = PROFILE_MUTANTS[ASYNC][name]
    assert result.killed and result.property == EXPECTED_KILLS[name] == mutant.killed_by
    assert result.trace_length == mutant.shortest


def test_names_reused_under_async_show_the_0_33_bug_and_break_the_placeholders_too():
    from flightcheck.verification.models import NAME_REUSE_MODELS
    (model,) = NAME_REUSE_MODELS[ASYNC]
    r = explicit.search(model)
    broken = {v.property for v in r.violations}
    assert {"S7p_binding_by_incarnation", "IF1_in_flight_counter", "IA1_placeholders"} <= broken
    assert "name_reused_in_flight" in r.reached


def test_with_a_stagger_of_1_the_max_tokens_guard_alone_lets_decodes_past_max_tokens():
    """What the stagger buys (vLLM's XPU without PP microbatching sets it to
    1): with three decodes in flight the guard does not fire, so IA2 rests on
    the stagger of K, not on the guard."""
    from flightcheck.verification.models import Model
    model = Model("stagger-1", _cfg(num_blocks=3, max_num_batched_tokens=2, max_model_len=6, decode_stagger=1),
                  (Prompt(1, 3), Prompt(2, 2)), allow_abort=False)
    from flightcheck.verification.results import SOMETIMES_NAMES
    r = explicit.search(model, stop_at_first=True, check_liveness=False)
    assert {v.property for v in r.violations} - SOMETIMES_NAMES == {"IA2_placeholders_within_max_tokens"}


@pytest.mark.slow
def test_verify_under_async_proves_everything_by_k_induction_too_and_kills_every_mutant(capsys):
    """`flightcheck verify --profile vllm-0.33-async`: the exhaustive search,
    then k-induction and BMC of shared-k3 under the profile (minutes on a
    busy 2-core machine): every encoded invariant and transition property,
    IA1, IA2 and S6' among them, proved by k-induction as well."""
    import json

    from flightcheck.cli import main
    from flightcheck.verification.z3.encoding.transitions import spec_properties_for
    from flightcheck.verification.z3.profiles import profile_model
    assert main(["verify", "--profile", ASYNC, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and "explicit_only" not in report
    inducted = {p["name"] for p in report["properties"]
                if p["method"].startswith("k-induction") and p["method"].endswith(f"[{ASYNC}]")
                and p["status"] == "proved"}
    from flightcheck.verification.models import SHARED_K3
    assert inducted == set(spec_properties_for(profile_model(SHARED_K3, ASYNC).cfg))
    assert {"IA1_placeholders", "IA2_placeholders_within_max_tokens", "S6p_async_decode_gating"} <= inducted
    assert all(m["killed"] for m in report["mutants"])
    # (draft_cap_ignored since the placeholder drafts: a completion proposes none under async)
    assert set(report["moot_mutants"]) == {"empty_batch_submitted", "decode_while_token_in_flight",
                                           "draft_cap_ignored"}
    assert {p["name"] for p in report["properties"]} >= {"IA1_placeholders", "S6p_async_decode_gating",
                                                         "decode_behind_decode", "L4_every_run_terminates"}
