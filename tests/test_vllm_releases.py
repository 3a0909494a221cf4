"""The bridge against each supported vLLM release (versions.py), in its
venv: compat.py finds everything the bridge reads; the recorder imports
(`RecordingScheduler`, and `RecordingAsyncScheduler` where the release has
an `AsyncScheduler`: what a `vllm serve --scheduler-cls` deployment loads);
a replay records a trace check-trace accepts, sync and async, with the
async keys read right (the decode stagger is K on 0.33.0 with the V2
runner and on 0.34.0, which has no other runner: a recorder that read
0.33's `use_v2_model_runner` wrote 0 there). Also: the pins file a release
takes satisfies that release's own Requires-Dist.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flightcheck.verification.traces.check import check_trace
from flightcheck.vllm import ASYNC_RECORDER
from flightcheck.vllm.replay import findings, venv_python
from flightcheck.vllm.versions import RELEASES, SUPPORTED_VERSIONS

from .vllm_support import Workers, require_venv, workers

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("both_checkers")]

PINS = Path(__file__).resolve().parent.parent / "flightcheck" / "vllm" / "pins"
PACKAGE_ROOT = Path(__file__).resolve().parent.parent

WORKLOAD: dict[str, Any] = {
    "name": "bridge", "seed": 1,
    "config": {"num_stages": 3, "max_num_batched_tokens": 8, "max_num_seqs": 3, "block_size": 4,
               "num_blocks": 40, "max_model_len": 64, "prefix_caching": True},
    "prefixes": {"p": 8},
    "requests": [{"id": "a", "prompt_len": 12, "prefix": "p", "max_tokens": 5},
                 {"id": "b", "prompt_len": 9, "prefix": "p", "max_tokens": 4, "arrival_step": 2},
                 {"id": "c", "prompt_len": 5, "max_tokens": 6, "arrival_step": 3, "abort_step": 9}]}


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


def in_venv(version: str, code: str) -> str:
    """Run `code` with the release's venv python, flightcheck on its path."""
    require_venv(version)
    env = {**os.environ, "PYTHONPATH": str(PACKAGE_ROOT), "VLLM_CONFIGURE_LOGGING": "0"}
    done = subprocess.run([str(venv_python(version)), "-c", code], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_compat_finds_everything_and_the_recorders_import(version: str):
    row = RELEASES[version]
    answer = json.loads(in_venv(version, (
        "import json; from flightcheck.vllm import compat, recorder\n"
        f"print(json.dumps([compat.problem(), compat.problem({row.has_async_scheduler}),"
        " hasattr(recorder, 'RecordingAsyncScheduler')]))")))
    assert answer == [None, None, row.has_async_scheduler]


def _replayed(running: Workers, version: str, tmp_path: Path, async_scheduling: bool) -> list[dict[str, Any]]:
    raw = {**WORKLOAD, "config": {**WORKLOAD["config"], "async_scheduling": async_scheduling}}
    trace = tmp_path / f"{version}-{async_scheduling}.jsonl"
    result = running[version].replay(raw, trace=str(trace),
                                     scheduler_cls=ASYNC_RECORDER if async_scheduling else None)
    assert result["ending"] == "done" and not findings(result), result
    checked = check_trace(trace).to_json()
    assert checked["ok"], checked
    return [json.loads(line) for line in trace.read_text().splitlines()]


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_the_recorder_records_a_trace_check_trace_accepts(running: Workers, version: str, tmp_path: Path):
    config = _replayed(running, version, tmp_path, async_scheduling=False)[0]
    assert config["vllm_version"] == version and "async_scheduling" not in config


@pytest.mark.parametrize("version", [v for v in SUPPORTED_VERSIONS if RELEASES[v].has_async_scheduler])
def test_the_async_recorder_reads_the_stagger_and_the_depth(running: Workers, version: str, tmp_path: Path):
    config = _replayed(running, version, tmp_path, async_scheduling=True)[0]
    stages = WORKLOAD["config"]["num_stages"]
    assert (config["async_scheduling"], config["batch_queue_depth"], config["decode_stagger"]) == (
        True, stages + 1, stages)


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_the_pins_satisfy_the_releases_own_requirements(version: str):
    """Every package pinned for a release that the release's wheel requires
    (Requires-Dist, markers evaluated here) is pinned at a version its
    specifier allows."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    require_venv(version)
    metadata = next(venv_python(version).parent.parent.glob(f"lib/python*/site-packages/vllm-{version}.dist-info/"
                                                            "METADATA"))
    pins = {}
    for line in (PINS / RELEASES[version].pins).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, pinned = line.split("==", 1)
            pins[canonicalize_name(name)] = pinned.strip()
    checked, unmet = 0, []
    for line in metadata.read_text().splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = Requirement(line.split(":", 1)[1].strip())
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(requirement.name)
        if name in pins:
            checked += 1
            if not requirement.specifier.contains(pins[name], prereleases=True):
                unmet.append(f"{requirement} (pinned {pins[name]})")
    assert checked > 10 and not unmet


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_the_cost_worker_runs_on_every_release(version: str):
    """benchmarks/scheduler_cost.py's vLLM side builds requests and model
    outputs with each release's arguments (0.34.0 takes no
    `req_id_to_index`, 0.33.0 on no `eos_token_id` on the request)."""
    from flightcheck.vllm.replay import ReplayWorker

    require_venv(version)
    with ReplayWorker(version, module="flightcheck.vllm.cost_worker") as worker:
        assert worker.call({"start": "decode-8", "seed": 1}) == {"running": 8}
        answer = worker.call({"batches": 3})
        assert "error" not in answer and len(answer["records"]) == 3
        assert worker.call({"stop": True}) == {}
