"""What the vLLM tests share: finding the vLLM venvs, and failing (not
skipping) without them unless FLIGHTCHECK_SKIP_VLLM=1 says so.

The venvs are built by `scripts/build-vllm-venv.sh VERSION` (`.ci/run` does
it before pytest); they live outside the clone, so a test run cannot assume
them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from pathlib import Path

import pytest

from flightcheck.vllm.replay import ReplayWorker, missing_venv_message, venv_python

SKIP_ENV = "FLIGHTCHECK_SKIP_VLLM"
DATA = Path(__file__).resolve().parent / "data" / "vllm"


@dataclass(frozen=True)
class KeptCase:
    """A vLLM run kept under tests/data/vllm: STEM.workload.json (what was
    replayed), STEM.jsonl (vLLM's trace) and STEM.result.json (the replay's
    result, its ground truth among it)."""
    stem: Path

    @property
    def trace(self) -> Path:
        return self.stem.with_suffix(".jsonl")

    def raw(self) -> dict[str, Any]:
        return json.loads(self.stem.with_suffix(".workload.json").read_text())

    def result(self) -> dict[str, Any]:
        return json.loads(self.stem.with_suffix(".result.json").read_text())


def require_venv(version: str) -> None:
    """Skip with the reason when FLIGHTCHECK_SKIP_VLLM=1, else fail: a test
    that needs vLLM never passes silently without it."""
    if venv_python(version).exists():
        return
    if os.environ.get(SKIP_ENV) == "1":
        pytest.skip(f"no vLLM {version} venv, and {SKIP_ENV}=1 asks to skip the vLLM tests")
    pytest.fail(f"{missing_venv_message(version)}; or set {SKIP_ENV}=1 to skip the vLLM tests")


class Workers:
    """One replay worker per vLLM version, started on first use and shared by
    a module's tests (starting one imports vLLM: 10-40 s)."""

    def __init__(self) -> None:
        self._running: dict[str, ReplayWorker] = {}

    def __getitem__(self, version: str) -> ReplayWorker:
        if version not in self._running:
            require_venv(version)
            self._running[version] = ReplayWorker(version)
        return self._running[version]

    def close(self) -> None:
        for running in self._running.values():
            running.close()


def workers() -> Iterator[Workers]:
    """The body of a module-scoped fixture."""
    shared = Workers()
    try:
        yield shared
    finally:
        shared.close()


# `--all-features` workloads that tests replay by (release, seed, index) and that
# the generator draws otherwise since the prefill cadence meets the KV connector
# (flightcheck/vllm/cadence_generate.py): kept as their campaigns drew them.
KEPT_BEFORE_CADENCE_MET_KV = DATA / "pairs" / "kv_pairs_before_cadence_as_drawn.json"


def found_workload(version: str, seed: int, index: int) -> dict[str, Any]:
    """Campaign workload `index` of `seed` on `version`, as the campaign that
    found it drew it: kept, or drawn with streaming sessions apart from the
    KV connector (`drawn_apart`)."""
    kept = json.loads(KEPT_BEFORE_CADENCE_MET_KV.read_text())
    if f"{version}/{seed}/{index}" in kept:
        return kept[f"{version}/{seed}/{index}"]
    return drawn_apart(seed, index + 1, features_of=version)[index]


def drawn_apart(seed: int, count: int, **options: object) -> list[dict]:
    """`campaign_workloads(seed, count, **options)` as the generator drew them
    while streaming sessions were kept apart from the KV connector (before
    the kvsess branch): the (seed, index) pairs the connector pairs' tests
    name were found then (tests/test_session_kv.py has the pair's own), and
    with every session ended (`drawn_before_clients_went_away`)."""
    import dataclasses

    from flightcheck.vllm import session_generate

    met = session_generate.FEATURE
    session_generate.FEATURE = dataclasses.replace(met, excludes=("kv-connector",))
    try:
        return drawn_before_clients_went_away(seed, count, **options)
    finally:
        session_generate.FEATURE = met


def drawn_before_clients_went_away(seed: int, count: int, **options: object) -> list[dict]:
    """`campaign_workloads(seed, count, **options)` as the generator drew them
    before one session in `CLIENT_GOES_AWAY_ONE_IN` lost its end
    (session_generate.py; its own stream, so nothing else moved): the
    (seed, index) pairs tests name were found with every session ended."""
    from flightcheck.vllm import session_generate
    from flightcheck.vllm.generate import campaign_workloads

    share = session_generate.CLIENT_GOES_AWAY_ONE_IN
    session_generate.CLIENT_GOES_AWAY_ONE_IN = 0
    try:
        return campaign_workloads(seed, count, **options)   # type: ignore[arg-type]
    finally:
        session_generate.CLIENT_GOES_AWAY_ONE_IN = share


def replay_kept_async(worker: ReplayWorker, raw: dict[str, Any], kept_trace: Path,
                      trace: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Replay a kept async workload on `worker` into `trace` (vLLM's async
    recorder) and check it makes the kept trace's decisions again: the
    replay's result and its events."""
    from flightcheck.vllm import ASYNC_RECORDER
    from flightcheck.vllm.differential import decisions, read_trace

    result = worker.replay(raw, trace=str(trace), scheduler_cls=ASYNC_RECORDER)
    events = read_trace(trace)
    assert decisions(events) == decisions(read_trace(kept_trace))
    return result, events


def replay_kept_workload(worker: ReplayWorker, case: KeptCase, version: str, asynchronous: bool = False) -> Any:
    """Replay a kept case's workload as its campaign did (`campaign.replay_workload`
    under the workload's own seed): the run, its comparison and its verdict."""
    from flightcheck.vllm.campaign import ReplayJob, replay_workload

    raw = case.raw()
    return replay_workload(worker, ReplayJob(version, asynchronous, 0, raw, raw.get("seed", 0)))


def replay_kept_case(worker: ReplayWorker, case: KeptCase, profile: Any,
                     trace: Path) -> tuple[Any, tuple[str, str]]:
    """Replay an async kept case on `worker` (`replay_kept_async`), compare it
    with the reference under `profile`, and judge its check-trace verdict
    against the replay's ground truth: (the comparison, (category, detail))."""
    from flightcheck.vllm.campaign import check_verdict, compare_workload, verdict

    raw = case.raw()
    result, events = replay_kept_async(worker, raw, case.trace, trace)
    comparison, _ = compare_workload(raw, result, events, profile)
    return comparison, verdict(result, check_verdict(trace))
