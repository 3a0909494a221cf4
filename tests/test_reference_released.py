"""vLLM as released (reference/profiles.py `RELEASED`): each of the
reference's named deviations from vLLM (reference/README.md) is one or more
profile constants, off in every profile, that a version's released profile
switches on. The vLLM differential's conforming run is the plain reference
under that profile (`SchedulerConfig(as_released=True)`), with no scheduler
of its own: these tests pin which constants each version's released profile
sets, and show each constant change a run on a small workload, so a step a
constant relies on cannot stop reading it unnoticed."""

from __future__ import annotations

import ast
import inspect
import json
from dataclasses import fields, replace
from pathlib import Path

import pytest

from flightcheck.reference import Scheduler, SchedulerConfig, TracingScheduler, profiles
from flightcheck.vllm.campaign import with_async_scheduling
from flightcheck.vllm.differential import decisions, profile_for, reference_config, run_reference
from flightcheck.vllm.generate import campaign_workloads
from flightcheck.vllm.workload import workload_from_json

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

VLLM = Path(__file__).resolve().parent.parent / "flightcheck" / "vllm"
HUNT34 = Path(__file__).resolve().parent / "data" / "vllm" / "hunt34"

DRAFTS_0_8 = {"unscheduled_drafts_kept", "drafts_from_every_output", "caches_through_a_negative_count"}
OUTPUTS_0_8 = {"outputs_to_running_by_id", "worker_decides_sampling", "flush_finished_every_schedule"}
# profile -> the constants its released variant switches (and nothing else).
RELEASED_CONSTANTS: dict[str, set[str]] = {
    "vllm-0.8.5": OUTPUTS_0_8 | DRAFTS_0_8,
    "vllm-0.8.4": OUTPUTS_0_8 | DRAFTS_0_8 | {"no_max_model_len_clip", "in_flight_mark_kept_off_running"},
    # 0.33.0's sync `EngineCore.post_step` hands a batch's drafts over at submission.
    # A KV load's error finishes its request after the batch's outputs.
    # A failed sync load's recompute rolls back in place (#49250).
    # A padded admission cut by the long-prefill threshold fails schedule()'s assertion.
    "vllm-0.33": {"outputs_by_id_alone", "worker_decides_sampling", "drafts_handed_over_at_submission",
                  "kv_errors_after_outputs", "kv_rollback_in_place", "padding_asserted_whole"},
    "vllm-0.33-async": {"outputs_by_id_alone", "worker_decides_sampling", "kv_errors_after_outputs",
                        "kv_rollback_in_place", "padding_asserted_whole"},
    # 0.34.0's `Scheduler.update_from_output` still binds by id alone, its
    # model runner still decides what sampled, and its sync `post_step` still
    # hands drafts over at submission.
    "vllm-0.34": {"outputs_by_id_alone", "worker_decides_sampling", "drafts_handed_over_at_submission",
                  "kv_errors_after_outputs", "kv_rollback_in_place", "padding_asserted_whole"},
    "vllm-0.34-async": {"outputs_by_id_alone", "worker_decides_sampling", "kv_errors_after_outputs",
                        "kv_rollback_in_place", "padding_asserted_whole"},
}
# constant -> (released profile, campaign seed, drafts per step, ids reused, workload index):
# a generated workload on which the conforming run changes when that constant
# alone goes back to the reference's value.
CHANGES_A_RUN: dict[str, tuple[str, int, int, bool, int]] = {
    "outputs_to_running_by_id": ("vllm-0.8.5", 0, 0, False, 22),
    "worker_decides_sampling": ("vllm-0.8.5", 0, 0, False, 58),
    "flush_finished_every_schedule": ("vllm-0.8.5", 0, 0, False, 41),
    "drafts_from_every_output": ("vllm-0.8.5", 0, 2, False, 31),
    "unscheduled_drafts_kept": ("vllm-0.8.5", 0, 2, False, 10),
    # r1 resumed holding 3 drafts, given 2 tokens (tests/test_vllm_negative_slice_084.py)
    "caches_through_a_negative_count": ("vllm-0.8.4", 376, 3, True, 149),
    "no_max_model_len_clip": ("vllm-0.8.4", 0, 2, False, 7),
    "in_flight_mark_kept_off_running": ("vllm-0.8.4", 0, 0, False, 31),
    "outputs_by_id_alone": ("vllm-0.33", 0, 0, True, 0),
    "drafts_handed_over_at_submission": ("vllm-0.33", 0, 2, False, 0),
}

# The held drafts' rule is vLLM 0.8.x's in the profiles themselves, the
# reference's as the spec's (`Profile.held_drafts_left_uncached`): constant ->
# a generated workload (as above) on which the conforming run changes when
# that constant alone goes back to 0.33's rule (off).
HELD_DRAFTS_0_8: dict[str, tuple[str, int, int, bool, int]] = {
    "drafts_kept_through_preemption": ("vllm-0.8.5", 1, 2, False, 3),
    "held_drafts_left_uncached": ("vllm-0.8.4", 3, 2, False, 7),
}

# constant -> (released profile, workload): the same on a replay workload (not
# a campaign's). The padding's assertion: the hunt's smallest workload
# (tests/test_vllm_hunt34_cases.py), where vLLM 0.34 raises in schedule().
# A KV connector's constants, on a workload with a connector: a sync
# load fails under the fail policy while b finishes in the same batch; the
# order their blocks are freed in shows in c's table.
_KV_FAIL = {"hit": 4, "async": False, "load_steps": 1, "fail_from_block": 0, "fail_whole": False, "send_steps": 1}
CHANGES_A_KV_RUN: dict[str, tuple[str, dict]] = {
    "kv_errors_after_outputs": ("vllm-0.34", {
        "name": "kv-error-order", "seed": 0,
        "config": {"num_stages": 1, "max_num_batched_tokens": 32, "max_num_seqs": 4, "block_size": 4,
                   "num_blocks": 9, "max_model_len": 32, "long_prefill_token_threshold": 0,
                   "prefix_caching": False,
                   "kv_connector": {"consumer": True, "producer": False, "load_failure_policy": "fail",
                                    "max_inflight_loads": None}},
        "requests": [{"id": "a", "prompt_len": 8, "max_tokens": 2, "kv": _KV_FAIL},
                     {"id": "b", "prompt_len": 8, "max_tokens": 1},
                     {"id": "c", "prompt_len": 16, "max_tokens": 1, "arrival_step": 2}]}),
    # the kv campaign's workload 4 under async scheduling: a sync load fails
    # (recompute) with the request's placeholders out (#49250)
    "kv_rollback_in_place": ("vllm-0.34-async", with_async_scheduling(
        campaign_workloads(0, 5, family="kv-connector", mid_step_inputs=True)[4])),
    "padding_asserted_whole": ("vllm-0.34", json.loads(
        (HUNT34 / "prefix-hit-padded-past-long-prefill-threshold.workload.json").read_text())),
}


def switched(profile: profiles.Profile, other: profiles.Profile) -> set[str]:
    return {f.name for f in fields(profile) if getattr(profile, f.name) != getattr(other, f.name)}


def test_every_profile_has_a_released_variant_that_switches_exactly_its_constants():
    assert set(profiles.RELEASED) == set(profiles.PROFILES) == set(RELEASED_CONSTANTS)
    for name, released in profiles.RELEASED.items():
        assert switched(released, profiles.PROFILES[name]) == RELEASED_CONSTANTS[name], name
        # Off in the profile, on in the release: the reference carries the fix.
        assert all(getattr(released, c) and not getattr(profiles.PROFILES[name], c)
                   for c in RELEASED_CONSTANTS[name]), name


def test_every_released_constant_is_shown_to_change_a_run():
    assert set().union(*RELEASED_CONSTANTS.values()) == set(CHANGES_A_RUN) | set(CHANGES_A_KV_RUN)


@pytest.mark.parametrize("version, async_scheduling", [("0.8.5", False), ("0.8.4", False),
                                                      ("0.33.0", False), ("0.33.0", True)])
def test_the_differentials_conforming_configuration_is_the_released_profile(version, async_scheduling):
    raw = campaign_workloads(0, 1)[0]
    name = profile_for(version, async_scheduling)
    config = reference_config(workload_from_json(raw), name, as_released=True)
    assert config.version_profile == profiles.RELEASED[name]
    assert reference_config(workload_from_json(raw), name).version_profile == profiles.PROFILES[name]


def test_the_conforming_run_is_the_plain_traced_reference_under_the_released_profile(monkeypatch):
    built: list[tuple[type, bool]] = []
    init = TracingScheduler.__init__

    def recording_init(self, config, trace):
        built.append((type(self), config.as_released))
        init(self, config, trace)
    monkeypatch.setattr(TracingScheduler, "__init__", recording_init)
    raw = campaign_workloads(0, 1)[0]
    run_reference(raw, "vllm-0.8.5", vllm_outputs=True)
    run_reference(raw, "vllm-0.8.5")
    assert built == [(TracingScheduler, True), (TracingScheduler, False)]


def test_the_vllm_bridge_neither_subclasses_the_scheduler_nor_patches_it():
    """The deviations are the reference's own constants: no module of the
    bridge that uses the reference subclasses one of its classes or assigns
    to a reference scheduler's attribute (vLLM's own scheduler, driven by
    the recorder and the replay, is another matter)."""
    for path in sorted(VLLM.glob("*.py")):
        tree = ast.parse(path.read_text())
        reference_names = {alias.asname or alias.name for node in ast.walk(tree)
                           if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                               "flightcheck.reference") for alias in node.names}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(base) for base in node.bases}
                assert not bases & reference_names, f"{path.name}: {node.name}"
            if reference_names and isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    text = ast.unparse(target)
                    assert "kv_cache_manager." not in text and "scheduler._" not in text, \
                        f"{path.name}:{node.lineno}: {text}"


def test_as_released_is_refused_for_an_unknown_profile():
    with pytest.raises(ValueError, match="released variant"):
        SchedulerConfig(profile="vllm-9", as_released=True)
    assert SchedulerConfig(as_released=True).version_profile is profiles.RELEASED["vllm-0.8.5"]


def _conforming(raw: dict, name: str) -> tuple[list, str]:
    run = run_reference(raw, name, vllm_outputs=True)
    return decisions(run.events), run.ending


@pytest.mark.parametrize("constant", sorted(CHANGES_A_RUN))
def test_each_released_constant_changes_the_conforming_run(constant, monkeypatch):
    name, seed, spec_tokens, reuse_ids, index = CHANGES_A_RUN[constant]
    raw = campaign_workloads(seed, index + 1, reuse_ids=reuse_ids, spec_tokens=spec_tokens)[index]
    released = profiles.RELEASED[name]
    as_released = _conforming(raw, name)
    monkeypatch.setitem(profiles.RELEASED, name,
                        replace(released, **{constant: getattr(profiles.PROFILES[name], constant)}))
    assert _conforming(raw, name) != as_released, f"{constant} changes nothing on {raw['name']}"


@pytest.mark.parametrize("constant", sorted(HELD_DRAFTS_0_8))
def test_each_held_drafts_constant_changes_the_conforming_run(constant, monkeypatch):
    name, seed, spec_tokens, reuse_ids, index = HELD_DRAFTS_0_8[constant]
    raw = campaign_workloads(seed, index + 1, reuse_ids=reuse_ids, spec_tokens=spec_tokens)[index]
    as_released = _conforming(raw, name)
    monkeypatch.setitem(profiles.RELEASED, name, replace(profiles.RELEASED[name], **{constant: False}))
    assert _conforming(raw, name) != as_released, f"{constant} changes nothing on {raw['name']}"


def test_the_held_drafts_constants_are_the_specs_in_every_profile():
    from flightcheck.spec import profiles as spec_profiles
    for name, profile in profiles.PROFILES.items():
        rule = spec_profiles.PROFILES[name].held_drafts_left_uncached
        assert [getattr(profile, c) for c in HELD_DRAFTS_0_8] == [rule, rule], name
        assert [getattr(profiles.RELEASED[name], c) for c in HELD_DRAFTS_0_8] == [rule, rule], name


@pytest.mark.parametrize("constant", sorted(CHANGES_A_KV_RUN))
def test_each_kv_released_constant_changes_the_conforming_run(constant, monkeypatch):
    name, raw = CHANGES_A_KV_RUN[constant]
    released = profiles.RELEASED[name]
    as_released = _conforming(raw, name)
    monkeypatch.setitem(profiles.RELEASED, name,
                        replace(released, **{constant: getattr(profiles.PROFILES[name], constant)}))
    assert _conforming(raw, name) != as_released, f"{constant} changes nothing on {raw['name']}"


def test_0_33s_released_constants_change_the_async_run_too(monkeypatch):
    raw = with_async_scheduling(campaign_workloads(0, 1, reuse_ids=True)[0])
    as_released = _conforming(raw, "vllm-0.33-async")
    monkeypatch.setitem(profiles.RELEASED, "vllm-0.33-async", profiles.PROFILES["vllm-0.33-async"])
    assert _conforming(raw, "vllm-0.33-async") != as_released


def test_the_scheduler_copies_every_released_constant_once():
    """Each constant is read from the profile by `Scheduler.__init__` alone
    (the steps test the copy), so a released profile reaches every step; the
    draft rules and the released rules in the helpers it calls for them
    (drafts.py, `_read_release_rules`)."""
    reads = {node.attr for reader in (Scheduler.__init__, Scheduler._read_draft_rules, Scheduler._read_release_rules)
             for node in ast.walk(ast.parse(inspect.getsource(reader).strip()))
             if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
             and node.value.id == "profile"}
    assert set().union(*RELEASED_CONSTANTS.values()) <= reads
