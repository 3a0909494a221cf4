"""The differential against vLLM (issue 19 point 3): Hypothesis generates
workloads (flightcheck/vllm/generate.py: K 2-4, tight and roomy pools,
shared prefixes, thresholds, aborts while batches are in flight, EOS); each
runs through vLLM's real scheduler (0.8.5 and 0.8.4) and through our
reference under the same profile, and the two are compared batch by batch
(entries with start, n, samples, cached and block ids; preemptions; the
tokens applied; finishes). Every difference must be a named deviation
(reference/README.md) and, with it switched to vLLM's behaviour, the only
one. Every reference mutant that the replay can exercise diverges from vLLM
on some workload where the correct reference does not.

Budget: about two minutes with both workers (one per version, shared by the
module). Long campaigns: `python -m flightcheck.vllm.campaign --workloads N`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Sequence, TypeVar

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from flightcheck.verification.mutants.reference import MUTANTS
from flightcheck.vllm.campaign import NEEDS_WHAT_VLLM_REPLAY_LACKS, Compared, compare_workload, flag_mutants
from flightcheck.vllm.campaign import main as campaign_main
from flightcheck.vllm.differential import (DEVIATIONS, decisions, profile_for, read_trace,
                                           run_reference)
from flightcheck.vllm.generate import campaign_workloads, generate_workload

from .vllm_support import DATA, Workers, workers

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("both_checkers")]

T = TypeVar("T")
VERSIONS = ("0.8.5", "0.8.4")
README = Path(__file__).resolve().parent.parent / "reference" / "README.md"


class HypothesisPicker:
    """generate.py's choices, drawn by Hypothesis (so failures shrink)."""

    def __init__(self, data: st.DataObject) -> None:
        self._data = data

    def integer(self, low: int, high: int) -> int:
        return self._data.draw(st.integers(low, high))

    def choice(self, options: Sequence[T]) -> T:
        return self._data.draw(st.sampled_from(list(options)))


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


def replay_and_compare(running: Workers, version: str, raw: dict[str, Any], tmp: Path) -> Any:
    trace = tmp / f"{raw['name']}-{version}.jsonl"
    result = running[version].replay(raw, trace=str(trace))
    return compare_workload(raw, result, read_trace(trace), profile_for(version))[0]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_reference_equals_vllm_batch_for_batch_but_for_named_deviations(
        running: Workers, version: str, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp(f"differential-{version}")
    running[version]                              # start the worker outside Hypothesis' clock
    seen: dict[str, int] = {"identical": 0}

    @settings(max_examples=30, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(st.data())
    def check(data: st.DataObject) -> None:
        raw = generate_workload(HypothesisPicker(data), "hypothesis", data.draw(st.integers(0, 10**6)))
        note(json.dumps(raw))
        comparison = replay_and_compare(running, version, raw, tmp)
        assert comparison.explained, comparison.describe()
        key = "identical" if comparison.equal else str(comparison.deviation)
        seen[key] = seen.get(key, 0) + 1

    check()
    assert seen["identical"] > 0, seen


def test_every_deviation_is_documented_by_name_in_the_reference_readme():
    text = README.read_text()
    for name in DEVIATIONS:
        assert f"`{name}`" in text, name


def test_a_campaign_workload_is_a_function_of_its_seed_and_index():
    assert campaign_workloads(3, 5) == campaign_workloads(3, 5)
    assert campaign_workloads(3, 5)[4] != campaign_workloads(4, 5)[4]


def test_the_differential_flags_every_mutant_the_replay_can_exercise(running: Workers, tmp_path: Path):
    """On generated workloads and on the committed ones that show vLLM's own
    bugs (tests/data/vllm/workloads.json): each mutant diverges from vLLM
    where the correct reference agrees, or reproduces a bug of vLLM's where
    the correct reference deviates by name."""
    committed = json.loads((DATA / "workloads.json").read_text())
    flagged: dict[str, str] = {}
    for version in VERSIONS:
        compared = []
        for raw in [*committed, *campaign_workloads(7, 30)]:
            trace = tmp_path / f"{raw['name']}-{version}.jsonl"
            running[version].replay(raw, trace=str(trace))
            events = read_trace(trace)
            compared.append(Compared(raw, decisions(events), decisions(
                run_reference(raw, profile_for(version)).events, block_offset=1)))
        for mutant, where in flag_mutants(profile_for(version), compared).items():
            if where.startswith("flagged") or mutant not in flagged:
                flagged[mutant] = f"{version}: {where}"
    print(json.dumps(flagged, indent=1))
    missed = {mutant: flagged[mutant] for mutant in MUTANTS
              if mutant not in NEEDS_WHAT_VLLM_REPLAY_LACKS and "flagged on" not in flagged[mutant]}
    assert not missed, missed


def test_the_campaign_refuses_a_keep_folder_that_is_a_file_before_any_replay(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    with pytest.raises(SystemExit) as exc:
        campaign_main(["--keep-disagreements", str(not_a_folder), "--workloads", "1"])
    assert exc.value.code == 2
    assert "not a directory" in capsys.readouterr().err
