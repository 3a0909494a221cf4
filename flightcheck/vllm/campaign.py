"""The long differential campaign against vLLM (issue 19 point 3):

    python -m flightcheck.vllm.campaign --workloads 300 --seed 1
    python -m flightcheck.vllm.campaign --workloads 300 --versions 0.8.4 --json results.json
    python -m flightcheck.vllm.campaign --workloads 200 --versions 0.33.0 --reuse-ids
    python -m flightcheck.vllm.campaign --workloads 300 --versions 0.33.0 --async
    python -m flightcheck.vllm.campaign --workloads 40 --all-features --spec-tokens 2 --stages 1
    python -m flightcheck.vllm.campaign --workloads 300 --versions 0.34.0 [--async] [--reuse-ids]
    python -m flightcheck.vllm.campaign --workloads 300 --kv-connector [--versions 0.34.0]
    flightcheck vllm campaign --workloads 100 --vllm-python ~/src/vllm/.venv/bin/python

`flightcheck vllm campaign` takes the same options (`add_options`,
campaign_options.py) and runs the same function (`run_campaign`).
`--vllm-python PATH` runs the vLLM of any interpreter in place of
`--versions` (flightcheck/commands/vllm_campaign.py,
docs/vllm-fit.md): its version is read from it, and one with no tables of its
own runs as the nearest known release, said on stderr, with that release's
profile for the reference and check-trace.

For each vLLM version (one replay worker each) and each generated workload
(generate.py; workload i of seed S is a function of S and i alone):

1. the replay runs it through vLLM's real scheduler and records the trace
   and the ground truth from vLLM's own state (replay.py);
2. the reference runs it under that version's profile, and the two traces
   are compared batch by batch (differential.py): identical, a named
   deviation and nothing else, or an unexplained divergence (a failure);
3. check-trace's verdict on vLLM's trace (the function `flightcheck
   check-trace` runs) is compared with the ground truth: accepted where vLLM
   did nothing wrong, rejected where it did;
4. every reference mutant runs on the workloads where the correct reference
   equals vLLM, until one diverges from vLLM (the mutant is flagged).

`--async` (vLLM 0.33.0, 0.34.0): every workload runs with async scheduling,
vLLM's `AsyncScheduler` recorded by `RecordingAsyncScheduler` with the V2
model runner's settings (queue K + 1, decode stagger K), against the
reference's `vllm-0.33-async` (`vllm-0.34-async`) profile; the entries'
output placeholders are compared too. `--mid-step-inputs` (the default when
every version runs 0.34's engine loop) places arrivals and aborts, one in
two, while a step waits for a batch's output (`arrival_via`/`abort_via`
"wait", workload.py).
`--keep-disagreements DIR` keeps every trace on which check-trace and vLLM's
ground truth disagree. `--kv-connector`: the kv-connector family (a
fabricated KV connector, flightcheck/vllm/README.md "A KV connector") on
0.33.0 and 0.34.0, each sync and async; the differential of a connector
workload runs only where the reference has a connector, else it is reported
as not run.

Every failure prints its seed and index. Exit 0 when no comparison is
unexplained, 1 otherwise, 2 without a venv.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from flightcheck.output_files import write_text
from flightcheck.verification import executors
from flightcheck.verification.mutants.patch import MutantNoLongerApplies
from flightcheck.verification.mutants.reference import MUTANTS

from . import ASYNC_RECORDER
from .differential import (Comparison, ReferenceRun, compare, decisions, first_difference, profile_for,
                           read_trace, run_reference)
from .campaign_options import add_options
from .generate import campaign_workloads
from .features import all_features_versions
from .kv_workload import has_kv_connector
from .lookahead_workload import with_lookahead
from .replay import Interpreter, ReplayError, ReplayWorker, findings, probe_interpreter, use_interpreter
from .versions import UnknownRelease, kv_connector_versions, release

# Mutants that need what a default replay never produces: draft tokens
# (speculative decoding only with `--spec-tokens K`: there
# `rejections_not_subtracted` is flagged; `rejections_subtracted_after_reset`
# changes only the output of a request preempted while its drafts were in
# flight, which vLLM 0.8.x drops, walking `running`), a worker that samples every
# chunk (vLLM's runner never does), or a worker that reads a batch after the
# next schedule() overwrote a shared snapshot (the replay's model reads each
# batch when it is submitted, as vLLM's executor does), or a request id
# re-added after an abort (a workload names each request once).
NEEDS_WHAT_VLLM_REPLAY_LACKS = {
    "rejections_not_subtracted": "spec-decode drafts (--spec-tokens)",
    "rejections_subtracted_after_reset": "spec-decode drafts and a preempted request's output applied",
    "final_chunk_from_live_counter": "a worker that samples every chunk",
    "shared_snapshot": "a worker that reads a batch after the next schedule()",
    "output_bound_by_name": "a request id re-added after an abort",
}


@dataclass
class VersionReport:
    version: str
    workloads: int = 0
    identical: int = 0
    deviations: Counter[str] = field(default_factory=Counter)
    unexplained: list[str] = field(default_factory=list)
    coverage: Counter[str] = field(default_factory=Counter)
    endings: Counter[str] = field(default_factory=Counter)
    verdicts: Counter[str] = field(default_factory=Counter)
    verdict_details: Counter[str] = field(default_factory=Counter)
    mutants_flagged: dict[str, str] = field(default_factory=dict)
    # The workloads behind each named deviation (names, for the record).
    deviation_workloads: dict[str, list[str]] = field(default_factory=dict)
    # Identical batch for batch, yet vLLM's own state shows a bug (0.33: a
    # reused id's old batch drove a counter negative without applying a token).
    identical_with_vllm_state_bug: list[str] = field(default_factory=list)
    async_scheduling: bool = False
    seconds: float = 0.0
    # Workloads with a KV connector where the reference has none to compare
    # with (reference_run.SUPPORTS_KV_CONNECTOR): replayed, verdicts taken,
    # no differential (never counted as identical).
    differential_not_run: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "async_scheduling": self.async_scheduling,
                "seconds": round(self.seconds, 1), "workloads": self.workloads, "identical": self.identical,
                "deviations": dict(self.deviations), "unexplained": self.unexplained,
                "coverage": dict(self.coverage), "endings": dict(self.endings),
                "check_trace_vs_ground_truth": dict(self.verdicts),
                "check_trace_details": dict(self.verdict_details),
                "mutants_flagged": self.mutants_flagged,
                "deviation_workloads": self.deviation_workloads,
                "identical_with_vllm_state_bug": self.identical_with_vllm_state_bug,
                **({"differential_not_run": self.differential_not_run} if self.differential_not_run else {})}

    def lines(self) -> list[str]:
        mode = " (async scheduling)" if self.async_scheduling else ""
        out = [f"vLLM {self.version}{mode}: {self.workloads} workloads in {self.seconds:.0f} s; reference identical on "
               f"{self.identical}; named deviations {dict(self.deviations)}; unexplained "
               f"{len(self.unexplained)}",
               f"  endings {dict(self.endings)}; coverage {dict(self.coverage)}",
               f"  identical but vLLM's own state shows a bug: {len(self.identical_with_vllm_state_bug)}",
               f"  check-trace vs ground truth: {dict(self.verdicts)}"]
        if self.differential_not_run:
            out.insert(1, f"  differential NOT RUN on {self.differential_not_run} workloads with a KV connector "
                          f"(the reference has no connector yet)")
        for detail, count in self.verdict_details.most_common():
            out.append(f"    {count:4d}  {detail}")
        for mutant, where in sorted(self.mutants_flagged.items()):
            out.append(f"  mutant {mutant}: {where}")
        out.extend(f"  UNEXPLAINED {item}" for item in self.unexplained)
        return out


def verdict(result: dict[str, Any], check: dict[str, Any]) -> tuple[str, str]:
    """check-trace's verdict against vLLM's ground truth: (category, detail)."""
    bugs = findings(result)
    if "malformed" in check:
        return "malformed", f"malformed: {check['malformed'][:90]}"
    if check["ok"]:
        if not bugs:
            return "accepted, correct run", "accepted"
        # check-trace lists what the trace could not show; a miss whose
        # trace it named something unchecked for is told apart
        noted = " (named unchecked)" if check.get("unchecked") else ""
        return "accepted, MISSED bug", f"missed{noted}: {bugs[0][:90]}"
    said = f"{check['property']} at line {check['line']}"
    if bugs:
        return "rejected, real bug", f"bug ({bugs[0].split(' (step')[0][:60]}): rejected, {check['property']}"
    return "rejected, FALSE", f"false rejection: {said.split(' at line')[0]}"


# Verdicts where check-trace and vLLM's ground truth disagree.
DISAGREEMENTS = frozenset({"rejected, FALSE", "accepted, MISSED bug", "malformed"})


def check_verdict(trace: Path, profile: str | None = None) -> dict[str, Any]:
    """What `flightcheck check-trace --json` says of a trace (`--profile
    profile` when given: a vLLM version with no profile of its own), read as
    the command reads it, line by line (verification/traces/stream.py): a
    violation before a line the format refuses is the verdict. (vLLM 0.33
    and 0.34 with drafts and a reused id: an older request's rejected drafts
    rolled back the new request's num_computed_tokens below 0 in
    `update_from_output`, and its next schedule entry starts there, after the
    complete event that check-trace rejects as S7.)"""
    from flightcheck.verification.traces.stream import MalformedTrace, check_lines, open_lines
    try:
        lines = open_lines(str(trace))
    except MalformedTrace as err:
        return {"ok": False, "malformed": str(err)}
    with lines:
        final = list(check_lines(lines, profile))[-1]
    if final.result is None:
        return {"ok": False, "malformed": final.malformed or ""}
    return final.result.to_json()


def with_async_scheduling(raw: dict[str, Any]) -> dict[str, Any]:
    """The workload with vLLM 0.33's async scheduling switched on."""
    return {**raw, "config": {**raw["config"], "async_scheduling": True}}


def run_version(version: str, workloads: list[dict[str, Any]], seed: int, mutants: bool,
                say: Callable[[str], None], async_scheduling: bool = False,
                keep_disagreements: Path | None = None) -> VersionReport:
    """One version's campaign in this process, workload after workload (the
    command runs the same steps as tasks of an executor: `_run_versions`)."""
    started = time.monotonic()
    report = VersionReport(version, async_scheduling=async_scheduling)
    if async_scheduling:
        workloads = [with_async_scheduling(raw) for raw in workloads]
    compared: list[Compared] = []
    with ReplayWorker(version) as worker:
        for index, raw in enumerate(workloads):
            replayed = replay_workload(worker, ReplayJob(version, async_scheduling, index, raw, seed,
                                                         keep_disagreements))
            tally_workload(report, replayed, seed, say)
            if replayed.compared is not None:
                compared.append(replayed.compared)
    if mutants:
        report.mutants_flagged = flag_mutants(profile_for(version, async_scheduling), compared)
    report.seconds = time.monotonic() - started
    return report


@dataclass(frozen=True)
class ReplayJob:
    """One workload of one version and mode: a campaign task's input (`raw`
    already with async scheduling where `async_scheduling`)."""
    version: str
    async_scheduling: bool
    index: int
    raw: dict[str, Any]
    seed: int
    keep_disagreements: Path | None = None
    python: Path | None = None            # --vllm-python's interpreter, else the release's venv


@dataclass
class Replayed:
    """What one workload gave: vLLM's result, the differential (None where it
    does not run) and check-trace's verdict against the ground truth."""
    index: int
    raw: dict[str, Any]
    result: dict[str, Any]
    comparison: Comparison | None
    compared: Compared | None
    category: str
    detail: str
    seconds: float


def replay_workload(worker: ReplayWorker, job: ReplayJob) -> Replayed:
    """Replay one workload on `worker`, compare it with the reference, and
    judge check-trace's verdict; its trace kept where they disagree."""
    started = time.monotonic()
    profile = profile_for(job.version, job.async_scheduling)
    scheduler_cls = ASYNC_RECORDER if job.async_scheduling else None
    comparison = compared = None
    with tempfile.TemporaryDirectory() as scratch:
        trace = Path(scratch) / f"{job.index}.jsonl"
        result = worker.replay(job.raw, trace=str(trace), scheduler_cls=scheduler_cls)
        events = read_trace(trace)
        if differential_runs(job.raw):
            comparison, reference = compare_workload(job.raw, result, events, profile)
            compared = Compared(job.raw, decisions(events), reference)
        # an unreleased vLLM (--vllm-python) is checked under its release's profile
        unreleased = worker.version.split("+", 1)[0] != job.version
        category, detail = verdict(result, check_verdict(trace, profile if unreleased else None))
        if job.keep_disagreements is not None and category in DISAGREEMENTS:
            # the trace and its workload, to look at after the scratch folder is gone
            job.keep_disagreements.mkdir(parents=True, exist_ok=True)
            stem = f"{job.version}{'-async' if job.async_scheduling else ''}-seed{job.seed}-{job.index}"
            shutil.copy(trace, job.keep_disagreements / f"{stem}.jsonl")
            (job.keep_disagreements / f"{stem}.workload.json").write_text(json.dumps(job.raw))
    return Replayed(job.index, job.raw, result, comparison, compared, category, detail,
                    time.monotonic() - started)


def tally_workload(report: VersionReport, replayed: Replayed, seed: int, say: Callable[[str], None]) -> None:
    """One replayed workload in its version's report (in workload order)."""
    report.workloads += 1
    report.endings[replayed.result["ending"]] += 1
    # vLLM 0.34's engine handed an input over while it waited for a batch's output
    if replayed.result.get("inputs_during_wait"):
        report.coverage["input_during_wait"] += 1
    if replayed.comparison is not None:
        _tally(report, replayed.comparison, replayed.raw, replayed.result, f"seed {seed} index {replayed.index}",
               say)
    else:
        report.differential_not_run += 1
    report.verdicts[replayed.category] += 1
    report.verdict_details[replayed.detail] += 1


def differential_runs(raw: dict[str, Any]) -> bool:
    """Whether the reference can run the workload: any without a KV
    connector, and one with a connector once the reference has one
    (`reference_run.SUPPORTS_KV_CONNECTOR`)."""
    from . import reference_run

    return not has_kv_connector(raw) or bool(getattr(reference_run, "SUPPORTS_KV_CONNECTOR", False))


def _tally(report: VersionReport, comparison: Comparison, raw: dict[str, Any], result: dict[str, Any],
           where: str, say: Callable[[str], None]) -> None:
    """One workload's differential in the version's report."""
    report.coverage.update(k for k, v in comparison.coverage.items() if v)
    if comparison.equal:
        report.identical += 1
        if findings(result):
            report.identical_with_vllm_state_bug.append(f"{raw['name']}: {findings(result)[0]}")
    elif comparison.explained:
        report.deviations[comparison.deviation or "?"] += 1
        report.deviation_workloads.setdefault(comparison.deviation or "?", []).append(raw["name"])
    else:
        failure = f"{where} ({raw['name']}): {comparison.describe()}"
        report.unexplained.append(failure)
        say(f"FAIL vLLM {report.version} {failure}")


def compare_workload(raw: dict[str, Any], result: dict[str, Any], events: list[dict[str, Any]],
                     profile: str) -> tuple[Comparison, list[tuple[Any, ...]]]:
    """The comparison of one replayed workload, and the reference's decisions."""
    reference = run_reference(raw, profile)
    ours = decisions(reference.events, block_offset=1)
    conforming: ReferenceRun | None = None
    if ours != decisions(events):
        conforming = run_reference(raw, profile, vllm_outputs=True)
    return compare(raw["name"], result, events, reference, conforming,
                   lambda order: run_reference(raw, profile, vllm_outputs=True, kv_error_order=order)), ours


@dataclass(frozen=True)
class Compared:
    """One workload's decisions on both sides, kept for the mutants."""
    raw: dict[str, Any]
    vllm: list[tuple[Any, ...]]
    reference: list[tuple[Any, ...]]


def flag_mutants(profile: str, compared: list[Compared]) -> dict[str, str]:
    """For each mutant, the first workload that tells it from the correct
    reference by vLLM: the mutant diverges from vLLM where the correct
    reference agrees, or, where the correct reference deviates from vLLM
    (a named deviation: vLLM's own bug), the mutant follows vLLM further
    (it reproduces that bug)."""
    flagged: dict[str, str] = {}
    for mutant in MUTANTS:
        flagged[mutant] = "not flagged" + (f" (needs {NEEDS_WHAT_VLLM_REPLAY_LACKS[mutant]})"
                                           if mutant in NEEDS_WHAT_VLLM_REPLAY_LACKS else "")
        for item in compared:
            name = item.raw["name"]
            try:
                ours = decisions(run_reference(item.raw, profile, mutant=mutant).events, block_offset=1)
            except MutantNoLongerApplies:
                raise                             # a stale mutant is an error, never a flag
            except Exception as err:              # a mutant may trip the reference's own checks
                flagged[mutant] = f"flagged on {name}: the mutant raised {type(err).__name__}"
                break
            correct_gap = first_difference(item.vllm, item.reference)
            mutant_gap = first_difference(item.vllm, ours)
            if correct_gap is None and mutant_gap is not None:
                flagged[mutant] = f"flagged on {name}: diverges from vLLM at event {mutant_gap}"
                break
            if correct_gap is not None and (mutant_gap is None or mutant_gap > correct_gap):
                flagged[mutant] = (f"flagged on {name}: reproduces vLLM's own bug (the correct reference "
                                   f"deviates at event {correct_gap}, the mutant "
                                   f"{'never' if mutant_gap is None else f'at {mutant_gap}'})")
                break
    return flagged


def run_campaign(args: argparse.Namespace, error: Callable[[str], None]) -> int:
    """The campaign the options ask for; `error` refuses an option (exit 2)."""
    if args.keep_disagreements is not None and args.keep_disagreements.exists() \
            and not args.keep_disagreements.is_dir():
        error(f"--keep-disagreements {args.keep_disagreements}: not a directory")
    if args.spec_tokens < 0:
        error("--spec-tokens must be >= 0")
    refused = executors.configure_from(args)
    if refused:
        print(refused, file=sys.stderr)
        return 2
    if args.kv_connector:
        if args.family not in (None, "kv-connector"):
            error("--kv-connector runs the kv-connector family: no other --family")
        args.family = "kv-connector"
    if args.all_features and (args.family or args.kv_connector):
        error("--all-features already turns on every feature: no --family or --kv-connector beside it")
    versions = (args.versions or _default_versions(args)).split(",")
    interpreter: Interpreter | None = None
    try:
        if args.vllm_python:
            interpreter = probe_interpreter(args.vllm_python)
            versions = [interpreter.release]
            if not interpreter.is_release:
                print(f"vLLM {interpreter.version} has no tables of its own: it runs as vLLM "
                      f"{interpreter.release} (that release's engine loop and profile)", file=sys.stderr)
        rows = [release(version) for version in versions]
    except (ReplayError, UnknownRelease) as err:
        print(err, file=sys.stderr)
        return 2
    if args.family == "kv-connector" and not all(row.has_kv_connector_api for row in rows):
        print(f"a KV connector needs vLLM {' or '.join(kv_connector_versions())} (asked: {', '.join(versions)})",
              file=sys.stderr)
        return 2
    mid_step_inputs = args.mid_step_inputs
    if mid_step_inputs is None:
        mid_step_inputs = all(row.engine_loop == "0.34" for row in rows)

    def workloads(version: str) -> list[dict[str, Any]]:
        return with_lookahead(campaign_workloads(
            args.seed, args.workloads, args.reuse_ids, args.spec_tokens, args.family, mid_step_inputs=mid_step_inputs,
            features_of=release(version).version if args.all_features else None,
            stages=getattr(args, "stages", None)), getattr(args, "lookahead", False))
    before = executors.counts()
    try:
        with use_interpreter(interpreter) if interpreter else nullcontext():
            reports = _run_versions(args, versions, workloads, interpreter)
    except (ReplayError, executors.ExecutorUnavailable, executors.TaskLost) as err:
        print(err, file=sys.stderr)
        return 2
    if args.json:
        try:                   # whole or not at all (output_files.write_whole)
            stages = {"stages": args.stages} if getattr(args, "stages", None) is not None else {}
            write_text(args.json, json.dumps({"seed": args.seed, **stages, **executors.ran_since(before),
                                              "reports": [r.to_json() for r in reports]}, indent=1))
        except OSError as err:
            print(f"flightcheck: error: --json {args.json}: {err.strerror or err}; the report was not written "
                  f"(a file there before is as it was); the campaign itself finished", file=sys.stderr)
            return 1
    return 1 if any(r.unexplained for r in reports) else 0


def _default_versions(args: argparse.Namespace) -> str:
    if args.all_features:
        return ",".join(all_features_versions())
    return ",".join(kv_connector_versions()) if args.kv_connector else "0.8.5,0.8.4"


def _run_versions(args: argparse.Namespace, versions: list[str],
                  workloads: Callable[[str], list[dict[str, Any]]],
                  interpreter: Interpreter | None) -> list[VersionReport]:
    """Every version and mode's campaign: one task per workload on the
    executor (verification/executors), then one per version and mode
    flagging the mutants; each report folded in workload order."""
    # --kv-connector, --all-features: each version sync and async (only async with --async)
    both = getattr(args, "kv_connector", False) or getattr(args, "all_features", False)
    modes = [False, True] if both and not args.async_scheduling else [args.async_scheduling]
    runs = [(version, mode, workloads(version)) for version in versions for mode in modes]
    python = interpreter.python if interpreter is not None else None
    tasks = [executors.Task((run, index), replay_task,
                            (ReplayJob(version, mode, index, with_async_scheduling(raw) if mode else raw, args.seed,
                                       args.keep_disagreements, python),),
                            f"vLLM {version}{' async' if mode else ''} workload {index}")
             for run, (version, mode, loads) in enumerate(runs) for index, raw in enumerate(loads)]
    jobs = getattr(args, "jobs", 1)
    replayed = iter(executors.run_tasks(tasks, jobs, executors.progress_printer("flightcheck vllm campaign")))
    reports, compared = [], []
    for version, mode, loads in runs:                    # the results come by (run, workload)
        report = VersionReport(version, async_scheduling=mode)
        mine = [next(replayed) for _ in loads]
        for each in mine:
            tally_workload(report, each, args.seed, lambda line: print(line, flush=True))
            report.seconds += each.seconds
        reports.append(report)
        compared.append([each.compared for each in mine if each.compared is not None])
    if not args.no_mutants:
        flags = executors.run_tasks([executors.Task((run,), flag_task, (profile_for(version, mode), compared[run]),
                                                    f"mutants of vLLM {version}{' async' if mode else ''}")
                                     for run, (version, mode, _) in enumerate(runs)], jobs)
        for report, (flagged, seconds) in zip(reports, flags):
            report.mutants_flagged, report.seconds = flagged, report.seconds + seconds
    for report in reports:
        if interpreter is not None and not interpreter.is_release:
            report.version = f"{interpreter.version} (as {interpreter.release})"
        print("\n".join(report.lines()), flush=True)
    return reports


def replay_task(job: ReplayJob) -> Replayed:
    """A campaign task: one workload, on the replay worker this process keeps for its version."""
    from .worker_cache import replay_worker
    return replay_workload(replay_worker(job.version, job.python), job)


def flag_task(profile: str, compared: list[Compared]) -> tuple[dict[str, str], float]:
    """A campaign task: one version and mode's mutants flagged, and the seconds it took."""
    started = time.monotonic()
    return flag_mutants(profile, compared), time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flightcheck.vllm.campaign",
                                     description="the differential campaign against vLLM")
    add_options(parser)
    args = parser.parse_args(argv)
    return run_campaign(args, parser.error)


if __name__ == "__main__":
    sys.exit(main())
