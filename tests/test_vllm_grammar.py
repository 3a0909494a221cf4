"""Structured output against vLLM's real scheduler (docs/request-states.md,
"Structured output"): the workload key and its compile clock, the campaign
feature, the reference's reading, check-trace's grammar events; and, in the
vLLM venvs (slow), the differential and check-trace's verdicts on
structured workloads (with and without drafts, inputs during waits) under
0.33.0 and 0.34.0, sync and async."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flightcheck.verification.traces.check import check_events
from flightcheck.verification.traces.schema import SchemaError, validate_event
from flightcheck.vllm import features
from flightcheck.vllm.differential import decisions, run_reference
from flightcheck.vllm.generate import RandomPicker, campaign_workloads, hash_seed
from flightcheck.vllm.grammar_generate import with_grammars
from flightcheck.vllm.grammar_workload import CompileClock, GrammarSpec
from flightcheck.vllm.workload import WorkloadError, workload_from_json

WORKLOAD = {"name": "grammar-basic", "seed": 1,
            "config": {"num_stages": 2, "max_num_seqs": 4, "block_size": 4, "max_model_len": 64,
                       "max_num_batched_tokens": 32, "num_blocks": 32, "prefix_caching": False},
            "requests": [{"id": "a", "prompt_len": 6, "max_tokens": 4, "grammar": {"compile_steps": 2, "fails": False}},
                         {"id": "b", "prompt_len": 5, "max_tokens": 3},
                         {"id": "c", "prompt_len": 4, "max_tokens": 3, "grammar": {"compile_steps": 1, "fails": True}}]}


def test_the_grammar_key_is_read_and_checked() -> None:
    w = workload_from_json(WORKLOAD)
    assert [s.grammar for s in w.requests] == [GrammarSpec(2, False), None, GrammarSpec(1, True)]
    for bad in ({"compile_steps": -1}, {"compile_steps": 1, "fails": "yes"}, {"steps": 1}, 3):
        raw = json.loads(json.dumps(WORKLOAD))
        raw["requests"][0]["grammar"] = bad
        with pytest.raises(WorkloadError):
            workload_from_json(raw)


def test_the_compile_clock_settles_after_the_calls_it_was_given() -> None:
    clock = CompileClock()
    clock.arrive("a", GrammarSpec(2, False))
    clock.arrive("c", GrammarSpec(0, True))
    assert clock.tick() == [("c", True)]
    assert clock.tick() == []
    assert clock.tick() == [("a", False)] and clock.pending() == 0


def test_the_feature_is_registered_and_meets_a_kv_connector() -> None:
    assert "grammar" in [f.name for f in features.registered()]
    assert {"0.33.0", "0.34.0"} <= set(features.features_of("0.34.0")[-1].versions)
    plain = campaign_workloads(5, 1)[0]
    with_grammars(RandomPicker(hash_seed(5, 0)), plain)
    assert any("grammar" in r for r in plain["requests"])
    grammar = next(f for f in features.registered() if f.name == "grammar")
    assert grammar.excludes == ()          # grammar + kv-connector meet (docs/request-states.md)
    met = 0
    for seed in range(40):
        drawn = features.with_features(RandomPicker(seed), campaign_workloads(seed, 1)[0], "0.34.0")
        met += {"grammar", "kv-connector"} <= set(drawn["features"])
        assert ("grammar" in drawn["features"]) == any("grammar" in r for r in drawn["requests"])
    assert met > 0


@pytest.mark.parametrize("profile", ["vllm-0.34", "vllm-0.34-async", "vllm-0.33", "vllm-0.33-async"])
def test_the_reference_waits_for_grammars_and_fails_a_broken_one(profile: str) -> None:
    raw = json.loads(json.dumps(WORKLOAD))
    if profile.endswith("async"):
        raw["config"]["async_scheduling"] = True
    run = run_reference(raw, profile)
    ours = decisions(run.events, block_offset=1)
    assert ("finish", "c", "error") in ours and ("finish", "a", "length") in ours
    first_a = next(i for i, d in enumerate(ours) if d[0] == "schedule" and any(e[0] == "a" for e in d[1]))
    first_b = next(i for i, d in enumerate(ours) if d[0] == "schedule" and any(e[0] == "b" for e in d[1]))
    assert first_b < first_a                              # a waited for its grammar; b did not
    assert not any(d[0] == "schedule" and any(e[0] == "c" for e in d[1]) for d in ours)


# One request alone, whose grammar compiles over more schedule() calls than the
# replay's idle count allows (engine.py IDLE_STEPS_FOR_STUCK): vLLM's loop spins
# on has_requests() until the Future settles, so the run is not stuck.
SLOW_COMPILE = {"name": "grammar-slow-compile", "seed": 1,
                "config": {"num_stages": 2, "max_num_seqs": 4, "block_size": 2, "max_model_len": 16,
                           "max_num_batched_tokens": 16, "num_blocks": 11, "prefix_caching": False},
                "requests": [{"id": "r0", "prompt_len": 1, "max_tokens": 2,
                              "grammar": {"compile_steps": 8, "fails": False}}]}


@pytest.mark.parametrize("profile", ["vllm-0.34", "vllm-0.34-async", "vllm-0.33", "vllm-0.33-async"])
def test_a_grammar_still_compiling_is_not_an_idle_engine(profile: str) -> None:
    raw = json.loads(json.dumps(SLOW_COMPILE))
    raw["config"]["async_scheduling"] = profile.endswith("async")
    run = run_reference(raw, profile)
    assert run.ending == "done"
    assert ("finish", "r0", "length") in decisions(run.events, block_offset=1)
    assert check_events(run.events).ok


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.usefixtures("both_checkers")
@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_vllm_waiting_for_a_slow_grammar_is_a_correct_run_not_stuck(version: str) -> None:
    from flightcheck.vllm.campaign import run_version

    from .vllm_support import require_venv
    require_venv(version)
    for async_scheduling in (False, True):
        report = run_version(version, [json.loads(json.dumps(SLOW_COMPILE))], 1, False, lambda line: None,
                             async_scheduling)
        assert not report.unexplained and set(report.verdicts) == {"accepted, correct run"}, report.verdicts


TRACE = [
    {"ev": "config", "num_stages": 2, "max_num_batched_tokens": 32, "block_size": 4, "num_blocks": 32,
     "max_model_len": 64, "vllm_version": "0.34.0", "structured_output": True},
    {"ev": "arrive", "req": "a", "prompt_len": 6, "max_tokens": 1, "structured": True},
    {"ev": "arrive", "req": "c", "prompt_len": 4, "max_tokens": 1, "structured": True},
    {"ev": "grammar_compiled", "req": "a"},
    {"ev": "grammar_failed", "req": "c"},
    {"ev": "schedule", "batch": 1, "entries": [{"req": "a", "start": 0, "n": 6}]},
    {"ev": "complete", "batch": 1, "tokens": {"a": [7]}},
    {"ev": "finish", "req": "a", "reason": "length"},
    {"ev": "finish", "req": "c", "reason": "error"},
    {"ev": "end"},
]


def test_a_grammar_error_recorded_after_an_empty_batchs_noted_completion_waits_for_a_later_update() -> None:
    """vLLM 0.34.0 async (--all-features seed 1 index 2): empty batches 1
    and 2 complete (steps 2, 4), then empty call 3 meets r4's failed grammar
    (step 5) and r2 is scheduled in 3-token chunks (r4 still counts for the
    long-prefill threshold) before empty batch 3's update finishes r4. The
    checker queues its own copies of those empty batches late: completing
    one must not finish r4 (a false schedule_decision, r2 @0+8, before)."""
    trace = Path(__file__).parent / "data" / "vllm" / "grammar" / "034_async_error_recorded_after_a_noted_completion.jsonl"
    events = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
    assert check_events(events).ok


@pytest.mark.usefixtures("both_checkers")
def test_check_trace_reads_grammar_events() -> None:
    assert check_events([dict(e) for e in TRACE]).ok
    early = [dict(e) for e in TRACE]
    early[3], early[5] = early[5], early[3]               # scheduled before its grammar compiled
    assert not check_events(early).ok


def test_grammar_events_need_structured_output_in_the_config() -> None:
    config = {k: v for k, v in TRACE[0].items() if k != "structured_output"}
    with pytest.raises(SchemaError):
        validate_event({"ev": "grammar_compiled", "req": "a"}, config)
    with pytest.raises(SchemaError):
        validate_event(dict(TRACE[1]), config)
    validate_event({"ev": "finish", "req": "c", "reason": "error"}, TRACE[0])


def _grammar_workloads() -> list[dict]:
    found = []
    for k in (0, 2):
        for i, w in enumerate(campaign_workloads(23, 12, spec_tokens=k, mid_step_inputs=True)):
            with_grammars(RandomPicker(hash_seed(99, i)), w)
            found.append(w)
    return found


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.usefixtures("both_checkers")
@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_structured_workloads_differential_and_verdicts_against_vllm(version: str) -> None:
    from flightcheck.vllm.campaign import DISAGREEMENTS, run_version

    from .vllm_support import require_venv
    require_venv(version)
    workloads = _grammar_workloads()
    for async_scheduling in (False, True):
        report = run_version(version, workloads, 23, False, lambda line: None, async_scheduling)
        assert report.workloads == 24 and not report.unexplained, report.unexplained
        disagreements = {k: n for k, n in report.verdicts.items() if k in DISAGREEMENTS}
        assert not disagreements, (version, async_scheduling, dict(report.verdict_details))


# vLLM's `update_draft_token_ids_in_output` on one structured request whose
# grammar (our stand-in manager) allows only the first of its two drafts.
_DRAFT_PROBE = """
import json
from types import SimpleNamespace
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import DraftTokenIds
scheduler = object.__new__(Scheduler)
scheduler.requests = {"r": SimpleNamespace(is_finished=lambda: False, use_structured_output=True)}
scheduler.structured_output_manager = SimpleNamespace(validate_tokens=lambda request, tokens: tokens[:1])
output = SimpleNamespace(scheduled_spec_decode_tokens={"r": [-1, -1]}, num_invalid_spec_tokens=None)
scheduler.update_draft_token_ids_in_output(DraftTokenIds(["r"], [[5, 6]]), output)
print(json.dumps([output.scheduled_spec_decode_tokens["r"], output.num_invalid_spec_tokens]))
"""


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize(("version", "profile", "expected"), [
    ("0.33.0", "vllm-0.33-async", [[5, -1], {"r": 1}]),     # the illegal draft padded to -1, counted
    ("0.34.0", "vllm-0.34-async", [[5, 6], {}]),            # passed to the worker as it is
])
def test_which_vllm_checks_drafts_against_the_grammar_is_the_profiles_constant(version, profile, expected):
    """`Profile.scheduler_validates_drafts`, read in vLLM itself: 0.33's
    scheduler marks a grammar-illegal draft, 0.34's leaves it to the sampler."""
    import subprocess

    from flightcheck.spec.profiles import PROFILES
    from flightcheck.vllm.replay import venv_python

    from .vllm_support import require_venv
    require_venv(version)
    proc = subprocess.run([str(venv_python(version)), "-c", _DRAFT_PROBE], capture_output=True, text=True,
                          timeout=300)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == expected, proc.stderr[-2000:]
    assert PROFILES[profile].scheduler_validates_drafts == (version == "0.33.0")
