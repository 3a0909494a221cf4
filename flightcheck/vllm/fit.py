"""`flightcheck vllm fit`: which profile fits a vLLM best, and which
constant a misfit points at.

A seeded campaign (fit_workloads.py) is replayed once through the vLLM at
hand (a release's venv or any interpreter, `--vllm-python`), then judged
under every profile (fit_flips.judged_profiles). A workload agrees with a
profile when both hold:

* **batches**: the reference scheduler under that profile, driven by the
  replay's engine loop and fabricated model (reference_run.py), makes
  vLLM's decisions event for event (differential.py `decisions`: every
  entry, block, preemption, token applied or dropped, finish, abort) and
  ends as vLLM's run ended, either as the project models it or as the
  version was released (`vllm_outputs=True`, the differential's conforming
  run: the named deviations switched to vLLM's behaviour); where vLLM
  crashed, up to the crash, as the differential compares;
* **verdict**: check-trace under that profile says of vLLM's trace what
  vLLM's own state says (campaign.py `verdict`: accepted exactly when the
  ground truth shows nothing wrong).

A misfit's first divergence is the first decision the reference makes
otherwise (`batches`), else check-trace's wrong verdict (`verdict`).
`explained_by` names the constants whose other value, tried one at a time
(fit_flips.py), removes that divergence: the reference (for batches) or the
checker (for a verdict) under the trial profile agrees with vLLM at that
point, or first departs later. `closest` is the profile with the highest
agreement; several with the same agreement are a tie, reported as a list
(`closest` is then a list, `tied` true).
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from flightcheck.reference import profiles as reference_profiles

from . import ASYNC_RECORDER
from .campaign import DISAGREEMENTS, verdict, with_async_scheduling
from .differential import decisions, first_difference, read_trace, run_reference
from .fit_flips import Flip, flips, judged_profiles, trial
from .fit_workloads import all_families, fit_workloads
from .replay import ReplayError, ReplayWorker

Say = Callable[[str], None]


@dataclass(frozen=True)
class Replayed:
    """One workload as vLLM ran it."""
    raw: dict[str, Any]
    result: dict[str, Any]
    trace: Path
    decisions: list[tuple[Any, ...]]


@dataclass(frozen=True)
class Divergence:
    workload: str
    kind: str                     # "batches" or "verdict"
    where: int                    # the decision's index, or the trace line check-trace rejected (0: none)
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"workload": self.workload, "kind": self.kind, "at": self.where, "detail": self.detail}


# ---------------------------------------------------------------------------
# One workload under one profile
# ---------------------------------------------------------------------------

def _at(events: list[tuple[Any, ...]], index: int) -> str:
    return repr(events[index]) if index < len(events) else "(nothing: the run ended)"


def batch_divergence(item: Replayed, profile: str) -> Divergence | None:
    """Where the reference under `profile` first decides otherwise than vLLM
    (None: it agrees); of the modelled and the released run, the one that
    follows vLLM longer."""
    theirs, ending = item.decisions, item.result["ending"]
    best: Divergence | None = None
    for released in (False, True):
        if released and profile not in reference_profiles.RELEASED:
            break
        try:
            run = run_reference(item.raw, profile, vllm_outputs=released)
        except Exception as err:                  # a trial profile may trip the reference's own checks
            found = Divergence(item.raw["name"], "batches", 0, f"the reference raised {type(err).__name__}: {err}")
        else:
            ours = decisions(run.events, block_offset=1)
            if ending == "exception":
                ours = ours[:len(theirs)]          # vLLM's run stops at its crash
            gap = first_difference(theirs, ours)
            if gap is None and (run.ending == ending or ending == "exception"):
                return None
            if gap is None:
                found = Divergence(item.raw["name"], "batches", len(theirs),
                                   f"the runs ended {ending} (vLLM) and {run.ending} (reference)")
            else:
                found = Divergence(item.raw["name"], "batches", gap,
                                   f"event {gap}: vLLM {_at(theirs, gap)}, reference {_at(ours, gap)}")
        if best is None or found.where > best.where:
            best = found
    return best


def verdict_divergence(item: Replayed, profile: str) -> Divergence | None:
    """check-trace's verdict on vLLM's trace under `profile` against vLLM's
    ground truth (None: they agree)."""
    from flightcheck.verification.traces.check import MalformedTrace, check_trace
    try:
        check = check_trace(item.trace, profile=profile).to_json()
    except MalformedTrace as err:
        check = {"ok": False, "malformed": str(err)}
    except Exception as err:                      # a trial profile may not suit the checker
        check = {"ok": False, "malformed": f"{type(err).__name__}: {err}"}
    category, detail = verdict(item.result, check)
    if category not in DISAGREEMENTS:
        return None
    line = int(check.get("line") or 0)
    said = f"{check.get('property')} at line {line}: {check.get('message')}" if line else detail
    return Divergence(item.raw["name"], "verdict", line, f"{category}: {said}")


def divergence(item: Replayed, profile: str) -> Divergence | None:
    """The first divergence of a workload under `profile`: batches first,
    then the verdict (None: the workload agrees)."""
    return batch_divergence(item, profile) or verdict_divergence(item, profile)


# campaign.verdict's category for a run check-trace accepted and vLLM's state shows wrong.
MISSED = "accepted, MISSED bug"
# Workloads that agreed under the profile, re-checked under a changed checker
# (a verdict divergence): a change that makes the checker reject correct runs
# too explains nothing.
CONTROLS = 3


def removes(flip: Flip, item: Replayed, profile: str, seen: Divergence,
            controls: tuple[Replayed, ...] = ()) -> bool:
    """Whether the profile with `flip` applied no longer diverges at `seen`:
    it agrees, or first departs later, on the same side; for a verdict, the
    changed checker also keeps agreeing on `controls`."""
    with trial(profile, flip) as name:
        if seen.kind == "batches":
            now = batch_divergence(item, name)
        else:
            now = verdict_divergence(item, name)
            if any(verdict_divergence(control, name) is not None for control in controls):
                return False
    if now is None:
        return True
    if seen.kind == "verdict" and (seen.where == 0 or now.where == 0):
        return False                              # a missed bug, or a verdict without a line: no "later"
    return now.where > seen.where


def explained_by(item: Replayed, profile: str, seen: Divergence,
                 controls: tuple[Replayed, ...] = ()) -> list[Flip]:
    """The single-constant changes that remove the divergence `seen`
    (`controls`: agreeing workloads a changed checker must keep agreeing on)."""
    if seen.kind == "verdict" and seen.detail.startswith(MISSED):
        # check-trace accepted a run vLLM's own state shows wrong: a changed
        # checker that rejects it may do so for any other reason, so no
        # constant is credited with the bug.
        return []
    side = "reference" if seen.kind == "batches" else "spec"
    return [flip for flip in flips(side, profile) if removes(flip, item, profile, seen, controls)]


# ---------------------------------------------------------------------------
# A profile over the campaign
# ---------------------------------------------------------------------------

@dataclass
class ProfileFit:
    name: str
    agreeing: int = 0
    judged: int = 0
    misfits: list[str] = field(default_factory=list)
    first_divergence: Divergence | None = None
    explained_by: list[Flip] = field(default_factory=list)
    # Over the first `explain` misfits: how many each constant explains.
    explained_counts: Counter[str] = field(default_factory=Counter)
    explained_of: int = 0

    @property
    def agreement(self) -> float:
        return self.agreeing / self.judged if self.judged else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "agreement": round(self.agreement, 4), "agreeing": self.agreeing,
                "workloads": self.judged, "misfits": self.misfits,
                "first_divergence": None if self.first_divergence is None else self.first_divergence.to_json(),
                "explained_by": sorted({flip.constant for flip in self.explained_by}),
                "explained_by_values": [f"{flip.constant}={flip.value!r} ({flip.side})"
                                        for flip in self.explained_by],
                "explained_misfits": dict(self.explained_counts.most_common()),
                "explained_of": self.explained_of}


def judge(items: list[Replayed], profile: str, explain: int) -> ProfileFit:
    """Every workload under `profile`; the first `explain` misfits explained."""
    fit = ProfileFit(profile, judged=len(items))
    seen = [(item, divergence(item, profile)) for item in items]
    controls = tuple(item for item, found in seen if found is None)[:CONTROLS]
    fit.agreeing = sum(found is None for _, found in seen)
    for item, found in seen:
        if found is None:
            continue
        fit.misfits.append(item.raw["name"])
        first = fit.first_divergence is None
        if first:
            fit.first_divergence = found
        if fit.explained_of >= explain:
            continue
        flips_found = explained_by(item, profile, found, controls)
        if first:
            fit.explained_by = flips_found
        fit.explained_of += 1
        fit.explained_counts.update({flip.constant for flip in flips_found})
    return fit


def closest(fits: list[ProfileFit]) -> list[str]:
    """The profiles with the highest agreement (several: a tie)."""
    best = max(fit.agreement for fit in fits)
    return [fit.name for fit in fits if fit.agreement == best]


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class FitOptions:
    seed: int = 0
    workloads: int = 40
    async_scheduling: bool = False
    explain: int = 5                  # misfits explained per profile (the first is always)
    profiles: tuple[str, ...] = ()    # () = every judged profile


def replay_campaign(worker: ReplayWorker, options: FitOptions, scratch: Path, say: Say) -> list[Replayed]:
    """The campaign through vLLM, once. A workload the worker refuses is left
    out (said on stderr); a dead worker ends the run (ReplayError)."""
    raws = fit_workloads(options.seed, options.workloads)
    if options.async_scheduling:
        raws = [with_async_scheduling(raw) for raw in raws]
    cls = ASYNC_RECORDER if options.async_scheduling else None
    items = []
    for index, raw in enumerate(raws):
        say(f"fit: replaying {index + 1}/{len(raws)}: {raw['name']}")
        trace = scratch / f"{index}.jsonl"
        try:
            result = worker.replay(raw, trace=str(trace), scheduler_cls=cls)
        except ReplayError as err:
            if "failed in the worker" not in str(err):
                raise
            say(f"fit: left out {raw['name']}: {err}")
            continue
        items.append(Replayed(raw, result, trace, decisions(read_trace(trace))))
    return items


def run_fit(worker: ReplayWorker, options: FitOptions, say: Say) -> dict[str, Any]:
    """The fit report (`flightcheck vllm fit --json`)."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="flightcheck-fit-") as scratch:
        items = replay_campaign(worker, options, Path(scratch), say)
        if not items:
            raise ReplayError("fit: vLLM replayed none of the workloads")
        fits = []
        for name in options.profiles or tuple(judged_profiles()):
            began = time.monotonic()
            fits.append(judge(items, name, options.explain))
            say(f"fit: {name}: {fits[-1].agreeing}/{len(items)} agree ({time.monotonic() - began:.0f} s)")
    best = closest(fits)
    families = Counter(item.raw["name"].rsplit("-", 2)[0].removeprefix("fit-") for item in items)
    return {"closest": best[0] if len(best) == 1 else best, "tied": len(best) > 1,
            "profiles": [fit.to_json() for fit in fits],
            "vllm_version": worker.version, "async_scheduling": options.async_scheduling,
            "seed": options.seed, "workloads": len(items), "families": dict(families),
            "family_list": [family.name for family in all_families()],
            "seconds": round(time.monotonic() - started, 1)}


def report_lines(report: dict[str, Any]) -> list[str]:
    """The text report (from the JSON one): the closest profile first, then each profile."""
    best = report["closest"]
    out = [f"vLLM {report['vllm_version']}{' (async scheduling)' if report['async_scheduling'] else ''}: "
           f"{report['workloads']} workloads (seed {report['seed']}); closest: "
           + (f"a tie of {', '.join(best)}" if report["tied"] else best)]
    for fit in report["profiles"]:
        out.append(f"{fit['name']}: {fit['agreeing']}/{fit['workloads']} workloads agree "
                   f"({fit['agreement']:.0%})")
        first = fit["first_divergence"]
        if first is None:
            continue
        out.append(f"  first divergence ({first['kind']}, {first['workload']}): {first['detail']}")
        named = fit["explained_by"]
        out.append(f"  explained by: {', '.join(named) if named else 'no single profile constant'}")
        if fit["explained_of"] > 1:
            counts = ", ".join(f"{c} {n}" for c, n in fit["explained_misfits"].items())
            out.append(f"  over the first {fit['explained_of']} misfits: {counts or 'none explained'}")
    return out
