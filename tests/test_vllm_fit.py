"""`flightcheck vllm fit` and `--vllm-python` (issue 35 point 3): a
developer's own vLLM, fitted to the profiles.

Fast (default suite, no vLLM): the release a version maps to, the trial
profiles behind `explained_by`, fit's judging on a "vLLM" that is the
reference with one constant changed (so the answer is known), the overlay
edit, and the one-line refusals of a bad interpreter.

Slow, marked `vllm` (the venvs of scripts/build-vllm-venv.sh): fit on the
0.33.0 venv (closest: vllm-0.33) and on the 0.34.0 venv once the bridge
runs 0.34; and on copies of a release with one rule changed, built by
flightcheck/vllm/overlay.py in a temporary directory (no venv copied): one
whose rule is a profile constant (`threshold_needs_company` must be named in
`explained_by`) and one whose rule is not (LIFO admission: the first
divergence must show a later arrival admitted first). Timings measured on the
shared 2-core machine are in docs/vllm-fit.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from flightcheck.reference import profiles as reference_profiles
from flightcheck.spec import profiles as spec_profiles
from flightcheck.vllm.differential import decisions, run_reference
from flightcheck.vllm.fit import FitOptions, Replayed, closest, judge, run_fit
from flightcheck.vllm.fit_flips import Flip, flips, judged_profiles, trial
from flightcheck.vllm.fit_workloads import all_families, fit_workloads
from flightcheck.vllm.overlay import EDITS, OverlayError, edited_source, make_overlay
from flightcheck.vllm.replay import ReplayWorker, nearest_release, venv_python

from .vllm_support import require_venv

pytestmark = pytest.mark.usefixtures("both_checkers")

ROOT = Path(__file__).resolve().parent.parent
KNOWN = ("0.8.5", "0.8.4", "0.33.0", "0.34.0")


# ---------------------------------------------------------------------------
# Fast
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("version, release", [
    ("0.33.0", "0.33.0"), ("0.33.0+cpu", "0.33.0"), ("0.34.1.dev5+g62d4bc3", "0.34.0"),
    ("0.34.0rc1", "0.34.0"), ("0.20.1", "0.8.5"), ("0.8.4.post1", "0.8.4"),
    ("1.0.0", "0.34.0"), ("0.1.0", None), ("dev", None)])
def test_a_version_runs_as_its_release_or_the_newest_known_below_it(version: str, release: str | None) -> None:
    assert nearest_release(version, KNOWN) == release


def test_a_trial_changes_one_constant_and_is_gone_after() -> None:
    flip = Flip("reference", "threshold_needs_company", False)
    assert flip in flips("reference", "vllm-0.33")
    assert Flip("spec", "threshold_needs_company", False) in flips("spec", "vllm-0.33")
    assert Flip("reference", "num_preallocate_tokens", 0) in flips("reference", "vllm-0.8.4")
    before = (dict(reference_profiles.PROFILES), dict(reference_profiles.RELEASED), dict(spec_profiles.PROFILES))
    with trial("vllm-0.33", flip) as name:
        assert name == "vllm-0.33"                                                # in force under its own name
        assert reference_profiles.PROFILES[name].threshold_needs_company is False
        assert reference_profiles.RELEASED[name].threshold_needs_company is False
        assert reference_profiles.RELEASED[name].outputs_by_id_alone is True      # the released variant kept
        assert reference_profiles.PROFILES[name] == replace(before[0][name], threshold_needs_company=False)
        assert spec_profiles.PROFILES[name] is before[2][name]                    # the other side untouched
    assert (reference_profiles.PROFILES, reference_profiles.RELEASED, spec_profiles.PROFILES) == before


def _as_vllm(raw: dict[str, Any], profile: str, scratch: Path) -> Replayed:
    """The reference under `profile` standing in for a vLLM run: its trace
    (in the trace format check-trace reads), its decisions with vLLM's block
    ids, a clean ending and no finding."""
    run = run_reference(raw, profile, vllm_outputs=profile in reference_profiles.RELEASED)
    trace = scratch / f"{raw['name']}.jsonl"
    trace.write_text("".join(json.dumps(event) + "\n" for event in run.events))
    return Replayed(raw, {"ending": run.ending, "ground_truth": {}, "batches_in_flight": 0}, trace,
                    decisions(run.events, block_offset=1))


def test_fit_puts_a_vllm_closest_to_the_profile_it_follows(tmp_path: Path) -> None:
    """A "vLLM" that is the reference under vllm-0.33 as released agrees
    with that profile on every workload, and only a profile with the same
    rules (vllm-0.34 until 0.34's own constants land) does as well: a tie."""
    items = [_as_vllm(raw, "vllm-0.33", tmp_path) for raw in fit_workloads(0, 8)]
    fits = [judge(items, name, explain=1) for name in judged_profiles()]
    best = closest(fits)
    assert "vllm-0.33" in best
    assert [fit.agreement for fit in fits if fit.name == "vllm-0.33"] == [1.0]
    rules = {name: replace(reference_profiles.RELEASED[name], name="") for name in judged_profiles()}
    assert all(rules[name] == rules["vllm-0.33"] for name in best), best


def test_fit_names_the_constant_a_vllm_changed(tmp_path: Path) -> None:
    """A "vLLM" that is 0.33 with the threshold's company test dropped (the
    reference under vllm-0.33 with threshold_needs_company off): fit finds
    vllm-0.33 short of full agreement on the lone long prompts, and names
    that constant, and only it, for every misfit it explains."""
    raws = fit_workloads(0, 8)
    with trial("vllm-0.33", Flip("reference", "threshold_needs_company", False)) as changed:
        items = [_as_vllm(raw, changed, tmp_path) for raw in raws]
    fit = judge(items, "vllm-0.33", explain=8)
    assert 0 < fit.agreement < 1
    first = fit.first_divergence
    assert first is not None and first.kind == "batches" and first.workload.startswith("fit-lone-long-prefill")
    assert {flip.constant for flip in fit.explained_by} == {"threshold_needs_company"}
    assert dict(fit.explained_counts) == {"threshold_needs_company": len(fit.misfits)}
    unexplained = judge(items, "vllm-0.33", explain=0)            # --explain 0: divergences only
    assert unexplained.first_divergence == first and unexplained.explained_by == []
    assert unexplained.explained_of == 0


def test_a_missed_bug_is_a_verdict_divergence_credited_to_no_constant(tmp_path: Path) -> None:
    """Batches agree, but vLLM's own state shows a bug check-trace accepted:
    the workload misfits on its verdict, and no constant is credited (a
    checker changed to reject it might reject it for anything)."""
    item = _as_vllm(fit_workloads(0, 1)[0], "vllm-0.33", tmp_path)
    buggy = Replayed(item.raw, {**item.result, "ground_truth": {"stale_tokens": [
        {"batch": 1, "req": "r1", "why": "preempted and resumed", "step": 3}]}}, item.trace, item.decisions)
    fit = judge([buggy], "vllm-0.33", explain=1)
    assert fit.agreement == 0 and fit.first_divergence is not None
    assert fit.first_divergence.kind == "verdict" and fit.first_divergence.detail.startswith("accepted, MISSED bug")
    assert fit.explained_by == []


def test_fit_workloads_come_from_one_list_of_families() -> None:
    families = all_families()
    raws = fit_workloads(3, 2 * len(families))
    assert [raw["name"].rsplit("-", 2)[0] for raw in raws] == [f"fit-{f.name}" for f in families] * 2
    assert raws == fit_workloads(3, 2 * len(families))                    # a function of the seed
    for raw in raws:
        run_reference(raw, "vllm-0.33")                                    # every one suits the reference


def test_an_overlay_edit_changes_one_fragment_in_one_function() -> None:
    source = "class Scheduler:\n    def schedule(self):\n        x = num_eligible_reqs > 1\n\n" \
             "    def other(self):\n        y = num_eligible_reqs > 1\n"
    edited = edited_source(source, EDITS["threshold-without-company"])
    assert "x = True" in edited and "y = num_eligible_reqs > 1" in edited
    with pytest.raises(OverlayError, match="no function"):
        edited_source("class Other:\n    pass\n", EDITS["threshold-without-company"])
    with pytest.raises(OverlayError, match="0 occurrences"):
        edited_source(source, EDITS["lifo-admission"].__class__(
            "m", "Scheduler.other", "missing", "", "r"))


@pytest.mark.parametrize("python, says", [
    ("/nonexistent/bin/python", "no such file"),
    (sys.executable, "vLLM does not import there (No module named 'vllm')"),
    ("/bin/false", "not a Python that runs")])
def test_a_bad_interpreter_is_refused_in_one_line(python: str, says: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from flightcheck.cli import main

    workload = tmp_path / "w.json"
    workload.write_text(json.dumps(fit_workloads(0, 1)[0]))
    for argv in (["fit", "--vllm-python", python], ["replay", str(workload), "--vllm-python", python],
                 ["campaign", "--vllm-python", python, "--workloads", "1"]):
        assert main(["vllm", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and says in err, (argv, err)


def test_flightcheck_vllm_campaign_takes_the_campaign_modules_options() -> None:
    import argparse

    from flightcheck.cli import build_parser
    from flightcheck.vllm.campaign import add_options

    argv = ["--workloads", "3", "--seed", "2", "--versions", "0.33.0", "--reuse-ids", "--json", "out.json",
            "--vllm-python", "/x/bin/python", "--no-mutants"]
    module = argparse.ArgumentParser()
    add_options(module)
    ours = vars(build_parser().parse_args(["vllm", "campaign", *argv]))
    theirs = vars(module.parse_args(argv))
    assert {key: ours[key] for key in theirs} == theirs


# ---------------------------------------------------------------------------
# Slow: vLLM's real scheduler
# ---------------------------------------------------------------------------

def _bridge_runs(version: str) -> bool:
    """Whether the bridge supports `version` (its replay worker has a loop for it)."""
    from flightcheck.vllm import SUPPORTED_VERSIONS
    return version in SUPPORTED_VERSIONS


def _base(version: str) -> Path:
    require_venv(version)
    if not _bridge_runs(version):
        pytest.skip(f"the replay bridge does not run vLLM {version} on this branch yet")
    return venv_python(version)


def _fit(python: Path, release: str, workloads: int) -> dict[str, Any]:
    with ReplayWorker(release, python) as worker:
        return run_fit(worker, FitOptions(seed=0, workloads=workloads), lambda line: None)


@pytest.fixture(scope="module")
def overlays(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("overlays")


def _profile(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(fit for fit in report["profiles"] if fit["name"] == name)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version, profile", [("0.33.0", "vllm-0.33"), ("0.34.0", "vllm-0.34")])
def test_a_release_is_closest_to_its_own_profile(version: str, profile: str) -> None:
    """Alone: the `mid-step-inputs` family (0.34's engine takes inputs while
    it waits for a batch's output) and the `unchunked` one (chunked prefill
    off, the generator's) tell 0.33 from 0.34; the other release's profile
    misfits on the unchunked workloads on the one constant that says so."""
    report = _fit(_base(version), version, 16)
    assert (report["closest"], report["tied"]) == (profile, False), report["closest"]
    assert _profile(report, profile)["agreement"] == 1.0
    other = _profile(report, {"vllm-0.33": "vllm-0.34", "vllm-0.34": "vllm-0.33"}[profile])
    assert other["agreement"] < 1 and "threshold_needs_chunked_prefill" in other["explained_misfits"], other


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version, profile", [("0.34.0", "vllm-0.34"), ("0.33.0", "vllm-0.33")])
def test_a_changed_profile_constant_is_named(version: str, profile: str, overlays: Path) -> None:
    python = make_overlay(_base(version), overlays / f"threshold-{version}", [EDITS["threshold-without-company"]])
    report = _fit(python, version, 16)
    fit = _profile(report, profile)
    assert fit["agreement"] < 1
    assert fit["explained_by"] == ["threshold_needs_company"], fit
    assert fit["first_divergence"]["workload"].startswith("fit-lone-long-prefill")


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version, profile", [("0.34.0", "vllm-0.34"), ("0.33.0", "vllm-0.33")])
def test_a_changed_rule_outside_the_profiles_shows_in_the_first_divergence(version: str, profile: str,
                                                                          overlays: Path) -> None:
    python = make_overlay(_base(version), overlays / f"lifo-{version}", [EDITS["lifo-admission"]])
    report = _fit(python, version, 16)
    fit = _profile(report, profile)
    assert fit["agreement"] < 1 and fit["explained_by"] == [], fit
    first = fit["first_divergence"]
    assert first["kind"] == "batches" and first["detail"].split(": vLLM ('schedule'")[0].startswith("event"), first
    # vLLM admitted the last of the burst first; the reference, its first
    theirs, ours = first["detail"].split(", reference ")
    assert theirs.split("(('")[1].split("'")[0] != ours.split("(('")[1].split("'")[0], first


@pytest.mark.vllm
@pytest.mark.slow
def test_an_unreleased_build_runs_as_its_release_with_a_note(overlays: Path, tmp_path: Path) -> None:
    """A build reporting 0.33.1.dev3 (no tables of its own) replays as vLLM
    0.33.0 (its engine loop; check-trace under vllm-0.33), said on stderr."""
    python = make_overlay(_base("0.33.0"), overlays / "dev", [], version="0.33.1.dev3+gfit")
    workloads = tmp_path / "w.json"
    workloads.write_text(json.dumps(fit_workloads(0, 2)))
    done = subprocess.run([sys.executable, "-m", "flightcheck.cli", "vllm", "replay", str(workloads),
                           "--vllm-python", str(python), "--check", "--json"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "vLLM 0.33.1.dev3+gfit has no tables of its own: it runs as vLLM 0.33.0" in done.stderr
    report = json.loads(done.stdout)
    assert (report["vllm_version"], report["runs_as"]) == ("0.33.1.dev3+gfit", "0.33.0")
    assert [(w["vllm_version"], w["check"]["ok"], w["check"]["profile"]) for w in report["workloads"]] == \
        [("0.33.1.dev3+gfit", True, "vllm-0.33")] * 2


@pytest.mark.vllm
@pytest.mark.slow
def test_a_vllm_that_does_not_import_is_refused_in_one_line(overlays: Path) -> None:
    """Found by the probe, but its scheduler does not import: exit 2, one line."""
    broken = EDITS["lifo-admission"].__class__(
        "vllm.v1.core.sched.scheduler", "Scheduler._enqueue_waiting_request",
        "self.waiting.add_request(request)", "self.waiting.add_request(request", "a syntax error")
    python = make_overlay(_base("0.33.0"), overlays / "broken", [broken])
    done = subprocess.run([sys.executable, "-m", "flightcheck.cli", "vllm", "fit", "--vllm-python", str(python)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 2
    refusal = [line for line in done.stderr.splitlines() if not line.startswith("fit: ")]
    assert len(refusal) == 1 and "vLLM does not import with" in refusal[0] and "SyntaxError" in refusal[0], \
        done.stderr
