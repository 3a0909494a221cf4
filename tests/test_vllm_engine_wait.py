"""vLLM 0.34's engine loop in the replay (engine.py `BatchQueueEngineV034`):
`EngineCoreProc._wait_for_output` handles ADD and ABORT while a step waits
for its oldest batch's output, so an input marked `via "wait"` lands
between that step's `schedule()` and the batch's `update_from_output`; on
0.33's loop (which handles no input while it waits) the same input is
handled after the step. Shown on the reference's side of the replay (the
same engine copy and input queue drive vLLM's scheduler), whose traces
check-trace accepts under the 0.34 profiles. No vLLM needed.

Also the release table (versions.py): every release's profiles exist, its
pins file is there, and the venv build script reads the table.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from flightcheck.reference.profiles import PROFILES as REFERENCE_PROFILES
from flightcheck.spec.profiles import PROFILES as SPEC_PROFILES
from flightcheck.verification.traces.check import check_trace
from flightcheck.vllm.generate import campaign_workloads
from flightcheck.vllm.reference_run import profile_for, run_reference
from flightcheck.vllm.versions import RELEASES, UnknownRelease, nearest_release, release
from flightcheck.vllm.workload import WorkloadError, workload_from_json

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

REPO = Path(__file__).resolve().parent.parent

WORKLOAD: dict[str, Any] = {
    "name": "wait", "seed": 0,
    "config": {"num_stages": 2, "max_num_batched_tokens": 8, "max_num_seqs": 4, "block_size": 4,
               "num_blocks": 40, "max_model_len": 64},
    "requests": [{"id": "a", "prompt_len": 6, "max_tokens": 4},
                 {"id": "b", "prompt_len": 3, "max_tokens": 2, "arrival_step": 2, "arrival_via": "wait"},
                 {"id": "c", "prompt_len": 3, "max_tokens": 8, "arrival_step": 1, "abort_step": 4,
                  "abort_via": "wait"}]}


def _order(events: list[dict[str, Any]]) -> list[str]:
    """The trace's decisions as short words: s1 (schedule batch 1), c1
    (complete batch 1), +b (b arrives), -c (c aborted)."""
    words = []
    for event in events:
        kind = event["ev"]
        if kind == "schedule" and event.get("batch") is not None:
            words.append(f"s{event['batch']}")
        elif kind == "complete":
            words.append(f"c{event['batch']}")
        elif kind == "arrive":
            words.append(f"+{event['req']}")
        elif kind == "abort":
            words.append(f"-{event['req']}")
    return words


def test_inputs_during_the_wait_land_between_schedule_and_that_steps_completion_on_0_34_only():
    on_034 = _order(run_reference(WORKLOAD, "vllm-0.34").events)
    on_033 = _order(run_reference(WORKLOAD, "vllm-0.33").events)
    # Step 2 schedules batch 3 and, the queue full, waits for batch 2: b arrives in that wait.
    assert on_034[:8] == ["+a", "s1", "+c", "s2", "c1", "s3", "+b", "c2"]
    # 0.33 handles no input while it waits: b arrives after the step, before step 3.
    assert on_033[:8] == ["+a", "s1", "+c", "s2", "c1", "s3", "c2", "+b"]
    # c's abort during step 4's wait comes before that step's completion on 0.34, after it on 0.33.
    assert on_034[on_034.index("-c") + 1] == "c4" and on_033[on_033.index("-c") - 1] == "c4"


def test_an_input_marked_for_a_wait_in_a_step_that_waits_for_nothing_comes_after_that_step():
    """Three stages: step 1 queues an empty batch and returns (the queue
    has room): no wait, so the input is handled from the input queue before
    step 2, as one that arrived after the spin deadline."""
    raw = {**WORKLOAD, "config": {**WORKLOAD["config"], "num_stages": 3},
           "requests": [{"id": "a", "prompt_len": 6, "max_tokens": 2},
                                    {"id": "b", "prompt_len": 3, "max_tokens": 2, "arrival_step": 1,
                                     "arrival_via": "wait"}]}
    plain = {**raw, "requests": [raw["requests"][0], {**raw["requests"][1], "arrival_via": "input",
                                                      "arrival_step": 2}]}
    assert _order(run_reference(raw, "vllm-0.34").events) == _order(run_reference(plain, "vllm-0.34").events)


@pytest.mark.parametrize("profile", ["vllm-0.34", "vllm-0.34-async"])
def test_check_trace_accepts_inputs_during_waits(tmp_path: Path, profile: str):
    async_scheduling = profile.endswith("-async")
    for raw in campaign_workloads(7, 25, reuse_ids=True, mid_step_inputs=True):
        raw = {**raw, "config": {**raw["config"], "async_scheduling": async_scheduling}}
        trace = tmp_path / f"{raw['name']}.jsonl"
        trace.write_text("".join(json.dumps(e) + "\n" for e in run_reference(raw, profile).events))
        verdict = check_trace(trace).to_json()
        assert verdict["ok"], (raw["name"], verdict)


def test_the_workload_format_takes_wait_and_refuses_other_values():
    spec = workload_from_json(WORKLOAD).requests
    assert (spec[1].arrival_during_wait, spec[2].abort_during_wait) == (True, True)
    for key in ("arrival_via", "abort_via"):
        with pytest.raises(WorkloadError, match=key):
            workload_from_json({**WORKLOAD, "requests": [{"prompt_len": 3, "abort_step": 1, key: "later"}]})


def test_mid_step_inputs_leave_the_rest_of_a_seeds_workloads_as_they_were():
    plain = campaign_workloads(4, 30)
    placed = campaign_workloads(4, 30, mid_step_inputs=True)
    strip = [{**r, "requests": [{k: v for k, v in q.items() if k not in ("arrival_via", "abort_via")}
                                for q in r["requests"]], "name": ""} for r in placed]
    assert strip == [{**r, "name": ""} for r in plain]
    assert sum(json.dumps(r).count('"wait"') for r in placed) > 10


def test_every_release_names_existing_profiles_and_pins():
    for row in RELEASES.values():
        for profile in filter(None, (row.profile, row.async_profile)):
            assert profile in REFERENCE_PROFILES and profile in SPEC_PROFILES, profile
        assert (REPO / "flightcheck" / "vllm" / "pins" / row.pins).is_file()
        assert profile_for(row.version) == row.profile
    assert profile_for("0.34.0", async_scheduling=True) == "vllm-0.34-async"
    with pytest.raises(UnknownRelease):
        profile_for("0.99.0")
    assert nearest_release("0.35.0.dev3+g1234").version == "0.34.0" and release("0.8.5").gates_on_unscheduled is False


def test_the_venv_build_script_reads_the_table_and_refuses_an_unknown_release():
    done = subprocess.run(["bash", str(REPO / "scripts" / "build-vllm-venv.sh"), "0.99.0", "/nonexistent/x"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "not a supported release" in done.stderr
    for version, row in RELEASES.items():
        out = subprocess.run(["python3", str(REPO / "flightcheck" / "vllm" / "versions.py"), "pins", version],
                             capture_output=True, text=True, check=True).stdout.strip()
        assert out == row.pins


def test_an_arrival_in_the_last_wait_is_scheduled_not_counted_as_idling():
    # unchunked-7-93: every request but r1 has finished; r1 arrives inside
    # the wait of the run's last (empty) batch under 0.34 async. The replay's
    # engine loop once counted that step as idle and ended the run `stuck`
    # with r1 waiting (engine._step_with_inputs now counts the handover).
    raw = campaign_workloads(7, 94, family="unchunked", mid_step_inputs=True)[93]
    assert any(r.get("arrival_via") == "wait" for r in raw["requests"])
    raw = {**raw, "config": {**raw["config"], "async_scheduling": True}}
    run = run_reference(raw, "vllm-0.34-async")
    assert run.ending == "done"
    assert any(e["ev"] == "schedule" and any(x["req"] == "r1" for x in e["entries"]) for e in run.events)
