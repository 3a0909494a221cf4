"""Reset and pause (spec/reset_pause.py): the actions read from vLLM 0.34's
`reset_prefix_cache` / `set_pause_state`, the properties RP1-RP4, the
exhaustive search of the sync model, and every mutant killed by its property."""

from __future__ import annotations

import re

import pytest

from flightcheck.spec import CompleteOldest, Config, Pause, Prompt, Reset, Sample, Schedule, SetPause, step
from flightcheck.spec.actions import arrive
from flightcheck.spec.engine import has_requests
from flightcheck.spec.state import Fate, Status, initial_state
from flightcheck.verification.explicit.search import search
from flightcheck.verification.mutants import ALL_MUTANTS, MUTANTS, PROFILE_MUTANTS
from flightcheck.verification.mutants.registry import RESET_PAUSE_MUTANTS
from flightcheck.verification.reset_pause_models import (RESET_DRAFTS_K2, RESET_PAUSE_K2, RESET_PAUSE_K2_ASYNC,
                                                         reset_pause_mutant_model)
from flightcheck.verification.suite import SOMETIMES_NAMES, hunt_mutant

KILLS = {
    "placeholders_kept_on_preemption_pr38624": ("IA1_placeholders", 8),
    "reset_discards_drained_output_pr42117": ("RP2_reset_drops_in_flight", 4),
    "stale_rejections_settled_pr46066": ("IA1_placeholders", 9),
    "pause_clear_cache_keeps_running_pr34382": ("RP2_reset_drops_in_flight", 3),
    "reset_delivers_stale_output": ("RP2_reset_drops_in_flight", 3),
    "drop_mode_output_applied": ("RP3_reset_output_never_applied", 4),
    "paused_all_runs_running_loop": ("RP1_paused_schedules_nothing", 5),
    "paused_new_admits_waiting": ("RP1_paused_schedules_nothing", 3),
}


def _cfg() -> Config:
    return Config(num_stages=2, max_num_batched_tokens=8, max_num_seqs=2, block_size=2, num_blocks=8,
                  max_model_len=16, profile="vllm-0.34", reset_and_pause=True)


def _admitted(cfg: Config, *prompts: Prompt):
    s = initial_state(len(prompts), cfg.num_blocks)
    for r, p in enumerate(prompts):
        s = arrive(s, cfg, r, p)
    return step(s, cfg, Schedule())


def test_off_by_default_and_refused_where_vllm_has_no_reset_or_pause():
    cfg = Config(profile="vllm-0.34")
    s = initial_state(1, cfg.num_blocks)
    assert step(s, cfg, Reset(True)) is None and step(s, cfg, SetPause(Pause.PAUSED_ALL)) is None
    with pytest.raises(ValueError):
        Config(profile="vllm-0.8.5", reset_and_pause=True)


def test_reset_preempts_running_in_order_drops_their_output_and_clears_the_cache():
    cfg = _cfg()
    s = _admitted(cfg, Prompt(4, 3, (1, 2)), Prompt(3, 3, (5,)))
    assert s.running == (0, 1) and len(s.in_flight) == 1
    after = step(s, cfg, Reset(True))
    assert after.running == () and after.waiting == (0, 1)          # prepended from the tail
    for r in (0, 1):
        q = after.requests[r]
        assert q.status is Status.PREEMPTED and q.drop_stale and q.num_stale == q.num_in_flight > 0
        assert all(e.reset and e.fate is Fate.ORPHANED for e in after.entries_of(r, fate=None))
    assert all(label is None for label in after.pool.labels) and not any(after.pool.ref_counts)
    # the batch returns: both outputs are dropped (RP3); drop mode resumes them at once
    done = step(after, cfg, CompleteOldest(()))
    assert [q.num_output for q in done.requests] == [0, 0]
    assert step(done, cfg, Schedule()).running == (0, 1)


def test_reset_without_running_fails_while_blocks_are_held_and_clears_once_idle():
    cfg = _cfg()
    s = _admitted(cfg, Prompt(4, 1, (1, 2)))
    assert step(s, cfg, Reset(False)) == s                          # vLLM returns False
    done = step(s, cfg, CompleteOldest((Sample(),)))
    assert done.requests[0].status is Status.FINISHED_LENGTH
    assert any(label is not None for label in done.pool.labels)
    cleared = step(done, cfg, Reset(False))
    assert all(label is None for label in cleared.pool.labels)
    assert cleared.pool.free_queue == done.pool.free_queue          # the free queue keeps its order


def test_pause_all_schedules_nothing_keeps_batches_completing_and_counts_no_request():
    cfg = _cfg()
    s = _admitted(cfg, Prompt(4, 3, (1, 2)))
    paused = step(s, cfg, SetPause(Pause.PAUSED_ALL))
    assert step(paused, cfg, Schedule()) is None                     # not even an empty batch: has_requests() is false
    assert not has_requests(paused) and paused.in_flight             # the engine must still complete it (E-a)
    done = step(paused, cfg, CompleteOldest((Sample(),)))
    assert done.requests[0].num_output == 1
    new = step(done, cfg, SetPause(Pause.PAUSED_NEW))
    assert has_requests(new) and step(new, cfg, Schedule()).in_flight   # running requests go on


def test_pause_new_admits_no_waiting_request_not_even_a_preempted_one():
    cfg = _cfg()
    s = _admitted(cfg, Prompt(4, 3, (1, 2)))
    s = step(step(s, cfg, Reset(True)), cfg, SetPause(Pause.PAUSED_NEW))
    s = step(s, cfg, CompleteOldest(()))
    assert s.requests[0].status is Status.PREEMPTED
    assert step(s, cfg, Schedule()) is None and not has_requests(s)
    assert step(step(s, cfg, SetPause(Pause.UNPAUSED)), cfg, Schedule()).running == (0,)


@pytest.mark.slow
def test_the_async_model_is_searched_exhaustively_without_a_violation():
    r = search(RESET_PAUSE_K2_ASYNC)
    assert r.complete and r.num_states == 28716
    assert not r.violations and all(r.liveness.values())


def test_the_drafts_model_is_searched_exhaustively_without_a_violation():
    """reset-drafts-k2, the model #46066 is hunted on (a draft-carrying decode
    in flight at a reset, the request resumed beside it): every property of
    vllm-0.34-async holds under the fix, liveness included."""
    r = search(RESET_DRAFTS_K2)
    assert r.complete and r.num_states == 2190
    assert not r.violations and all(r.liveness.values())


def test_every_reset_pause_mutant_is_registered_apart_and_named_for_its_bug():
    assert set(RESET_PAUSE_MUTANTS) == set(KILLS) and set(KILLS) <= set(ALL_MUTANTS)
    assert not set(KILLS) & set(MUTANTS) and not any(set(KILLS) & set(own) for own in PROFILE_MUTANTS.values())
    for name, m in RESET_PAUSE_MUTANTS.items():
        assert (m.kind == "historical") == bool(re.search(r"_pr\d+$", name)), name
        assert (m.killed_by, m.shortest) == KILLS[name]


@pytest.mark.parametrize("name", list(KILLS))
def test_every_reset_pause_mutant_is_killed_by_its_property(name):
    result = hunt_mutant(name, model=reset_pause_mutant_model(name))
    assert result.killed and result.property not in SOMETIMES_NAMES
    assert (result.property, result.trace_length) == KILLS[name]


def test_verify_reset_pause_proves_the_models_properties_and_refuses_other_profiles():
    """`flightcheck verify --profile vllm-0.34 --reset-pause`: the sync model
    searched exhaustively (9,279 states), every property proved, liveness
    included (the mutants are hunted under vllm-0.34-async, above); 0.8.x
    has neither."""
    import subprocess
    import sys

    from flightcheck.verification.suite import SuiteOptions, run_suite

    result = run_suite(SuiteOptions(profile="vllm-0.34", reset_pause=True, use_z3=False))
    report = result.to_json()
    assert report["ok"] and report["reset_pause"] and not report["mutants"]
    assert {p["method"] for p in report["properties"]} == {"exhaustive reset-pause-k2 (9279 states, depth 24)"}
    assert RESET_PAUSE_K2.name == "reset-pause-k2"
    names = {p["name"] for p in report["properties"]}
    assert {"RP1_paused_schedules_nothing", "RP2_reset_drops_in_flight", "RP3_reset_output_never_applied",
            "RP4_prefix_cache_reset", "L1_L3_every_request_can_finish"} <= names
    out = subprocess.run([sys.executable, "-m", "flightcheck.cli", "verify", "--profile", "vllm-0.8.5",
                          "--reset-pause"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--reset-pause" in out.stderr
