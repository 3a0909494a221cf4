"""`flightcheck vllm replay WORKLOAD.json`: drive vLLM's real scheduler.

    flightcheck vllm replay workload.json --trace run.jsonl --check
    flightcheck vllm replay campaign.jsonl --vllm-version 0.8.4 --trace traces/ --json
    flightcheck vllm replay workload.json --vllm-version 0.33.0 --async --trace run.jsonl
    flightcheck vllm replay workload.json --vllm-python ~/src/vllm/.venv/bin/python --check

Every workload in the file (one object, a list, or JSON Lines) is replayed
through vLLM's own V1 scheduler, in the vLLM venv of that version (built by
`scripts/build-vllm-venv.sh VERSION`), driven by our copy of the engine's
batch-queue loop and a fabricated model; the scheduler is the recorder a
deployment installs, so each run writes a trace. `--check` runs check-trace
on each trace. `--async` (vLLM 0.33.0, 0.34.0) runs every workload with async
scheduling (`config.async_scheduling`), vLLM's `AsyncScheduler` recorded by
`RecordingAsyncScheduler`, with the V2 model runner's settings (batch queue
K + 1, decode stagger K); a workload that sets `async_scheduling` itself gets
the same recorder. While vLLM loads (about a minute) stderr says so, then
when it is ready, and which workload runs (with --json or off a terminal);
stdout carries only the results. Exit codes: 0 every run ended cleanly with
nothing wrong in vLLM's own state (and, with --check, every trace legal); 1 a
finding; 2 bad arguments or input, or no venv for the version.

`--vllm-python PATH`, `flightcheck vllm campaign` and `flightcheck vllm fit`
(a developer's own vLLM) are vllm_campaign.py's; docs/vllm-fit.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .common import Parser, bad
from .outputs import Claim, Output, OutputRefused, claim, reason, refuse_clashes
from .vllm_campaign import add_subcommands, check_profile, replay_identity, resolve_interpreter

if TYPE_CHECKING:
    from flightcheck.vllm.replay import Interpreter, ReplayWorker


def add_parser(sub) -> None:
    from flightcheck.vllm import DEFAULT_VERSION, SUPPORTED_VERSIONS

    vllm = sub.add_parser("vllm", help="record and replay vLLM's real scheduler (needs a vLLM venv)")
    actions = vllm.add_subparsers(dest="vllm_command", required=True, parser_class=Parser)
    replay = actions.add_parser("replay", help="replay workloads through vLLM's real V1 scheduler")
    replay.add_argument("workload", help="a workload JSON file (one object, a list, or JSON Lines)")
    replay.add_argument("--vllm-version", default=DEFAULT_VERSION, choices=SUPPORTED_VERSIONS,
                        help=f"the vLLM whose scheduler runs (default {DEFAULT_VERSION})")
    replay.add_argument("--trace", metavar="OUT", help="write the trace here (a directory when the file "
                        "holds several workloads: OUT/NAME.jsonl)")
    replay.add_argument("--async", dest="async_scheduling", action="store_true",
                        help="vLLM 0.33.0 or 0.34.0: run with async scheduling (AsyncScheduler, V2 model runner: "
                             "queue K + 1, decode stagger K), recorded by RecordingAsyncScheduler")
    replay.add_argument("--kv-connector", nargs="?", const="{}", metavar="JSON",
                        help="vLLM 0.33.0 or 0.34.0: a fabricated KV connector for every workload without one "
                             "(JSON of its fields, default a consumer with recompute; requests offer what "
                             "their 'kv' says: flightcheck/vllm/kv_workload.py)")
    replay.add_argument("--check", action="store_true", help="also run check-trace on every trace")
    replay.add_argument("--json", action="store_true", help="print machine-readable results")
    replay.set_defaults(func=run)
    add_subcommands(actions, replay)          # --vllm-python, `campaign`, `fit` (vllm_campaign.py)


def _trace_paths(args: argparse.Namespace, raws: list[dict[str, Any]], scratch: str) -> list[str | None]:
    """One trace path per workload; a scratch file when only --check wants it."""
    if args.trace is None:
        return [str(Path(scratch) / f"{i}.jsonl") if args.check else None for i in range(len(raws))]
    directory, paths = _named_traces(args, raws)
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
    return list(paths)


def _named_traces(args: argparse.Namespace, raws: list[dict[str, Any]]) -> tuple[Path | None, list[str]]:
    """Where --trace puts each workload's trace: (the directory holding
    them, None for one file; the paths)."""
    if len(raws) == 1 and not Path(args.trace).is_dir():
        return None, [args.trace]
    names = [str(raw.get("name", f"{Path(args.workload).stem}-{i}")) for i, raw in enumerate(raws)]
    directory = Path(args.trace)
    if len(set(names)) != len(names):
        names = [f"{i:04d}-{name}" for i, name in enumerate(names)]
    return directory, [str(directory / f"{name}.jsonl") for name in names]


def _claim_traces(args: argparse.Namespace, raws: list[dict[str, Any]]) -> Claim:
    """--trace checked before vLLM loads (outputs.py): no trace on the
    workload file or the interpreter; one file, or a directory of them."""
    if args.trace is None:
        return Claim()
    inputs = [("the workload file", args.workload), ("--vllm-python", getattr(args, "vllm_python", None))]
    directory, paths = _named_traces(args, raws)
    if directory is None:
        return claim([Output("--trace", args.trace, grows=True)], inputs)
    if directory.exists() and not directory.is_dir():
        raise OutputRefused(f"--trace {args.trace}: not a directory, and {len(raws)} workloads need one "
                            f"(a trace each, OUT/NAME.jsonl)")
    refuse_clashes([Output("--trace", path) for path in paths], [(flag, p) for flag, p in inputs if p])
    return Claim()


def _check(path: str, profile: str | None = None) -> dict[str, Any]:
    from flightcheck.verification.traces.check import MalformedTrace, check_trace

    try:
        return check_trace(path, profile).to_json()
    except MalformedTrace as err:
        return {"ok": False, "malformed": str(err)}


def _describe_check(check: dict[str, Any]) -> str:
    if "malformed" in check:
        return f"check-trace: malformed ({check['malformed']})"
    if check["ok"]:
        return f"check-trace: legal ({check['events']} events)"
    # the line in the trace file, as check-trace itself says it
    return f"check-trace: line {check['line']} violates {check['property']}: {check['message']}"


def run(args: argparse.Namespace) -> int:
    from flightcheck.vllm.kv_workload import has_kv_connector
    from flightcheck.vllm.replay import ReplayError
    from flightcheck.vllm.versions import kv_connector_versions
    from flightcheck.vllm.workload import WorkloadError, read_workloads

    try:
        raws = read_workloads(args.workload, _connector_option(args))
    except WorkloadError as err:
        return bad(str(err))
    refused = resolve_interpreter(args)         # --vllm-python: sets args.vllm_version to its release
    if refused:
        return bad(refused)
    if any(has_kv_connector(raw) for raw in raws) and args.vllm_version not in kv_connector_versions():
        return bad(f"a KV connector needs --vllm-version {' or '.join(kv_connector_versions())} (vLLM "
                   f"{args.vllm_version} has no connector API the replay drives)")
    if args.async_scheduling:
        from flightcheck.vllm.versions import async_versions

        if args.vllm_version not in async_versions():
            return bad(f"--async needs --vllm-version {' or '.join(async_versions())} (vLLM {args.vllm_version} "
                       f"has no AsyncScheduler the replay drives)")
        raws = [{**raw, "config": {**raw.get("config", {}), "async_scheduling": True}} for raw in raws]
    try:
        claimed = _claim_traces(args, raws)
    except OutputRefused as err:
        return bad(str(err))
    with claimed, tempfile.TemporaryDirectory(prefix="flightcheck-vllm-") as scratch:
        try:
            traces = _trace_paths(args, raws, scratch)
        except OSError as err:
            return bad(f"--trace {args.trace}: {reason(err)}")
        try:
            with _start_worker(args.vllm_version, args.interpreter) as worker:
                reports, failed = _replay_all(args, worker, raws, traces)
        except ReplayError as err:
            return bad(str(err))
    if args.json:
        print(json.dumps({**replay_identity(args), "workloads": reports}, indent=1))
    return 1 if failed else 0


def _connector_option(args: argparse.Namespace) -> Any:
    """`--kv-connector [JSON]`: what gives each workload without a connector
    that one (None without the option); bad JSON is a WorkloadError."""
    from flightcheck.input_files import InputFileError, parse_json
    from flightcheck.vllm.kv_workload import with_default_connector
    from flightcheck.vllm.workload import WorkloadError

    if args.kv_connector is None:
        return None
    try:
        connector = parse_json(args.kv_connector, "--kv-connector")
    except json.JSONDecodeError as err:
        raise WorkloadError(f"--kv-connector: not JSON ({err.msg})") from None
    except InputFileError as err:             # nested too deeply, an integer of 4,300+ digits
        raise WorkloadError(str(err)) from None
    if not isinstance(connector, dict):
        raise WorkloadError("--kv-connector: a JSON object of the connector's fields")
    return lambda raw: with_default_connector(raw, connector)


def _progress(message: str) -> None:
    """A status line on stderr (stdout keeps the results; with --json, only JSON)."""
    print(message, file=sys.stderr, flush=True)


def _start_worker(version: str, interpreter: "Interpreter | None" = None) -> "ReplayWorker":
    """The replay worker, saying on stderr that vLLM loads and when it is
    ready: importing vLLM takes 10-100 s, with nothing else to show for it.
    `interpreter`: `--vllm-python`'s, standing for the release `version`."""
    from flightcheck.vllm.replay import ReplayWorker, venv_python

    python = venv_python(version) if interpreter is None else interpreter.python
    shown = version if interpreter is None else interpreter.version
    if python.exists():                    # else ReplayWorker refuses at once, naming the build script
        _progress(f"loading vLLM {shown} with {python} (importing vLLM takes about a minute)...")
    started = time.monotonic()
    worker = ReplayWorker(version, None if interpreter is None else python)
    _progress(f"vLLM {worker.version} ready after {time.monotonic() - started:.0f} s")
    return worker


def _replay_all(args: argparse.Namespace, worker: "ReplayWorker", raws: list[dict[str, Any]],
                traces: list[str | None]) -> tuple[list[dict[str, Any]], bool]:
    """Replay every workload: the results, and whether any showed a finding."""
    from flightcheck.vllm import ASYNC_RECORDER
    from flightcheck.vllm.replay import findings

    # Text results on a terminal already show each workload as it ends.
    announce = args.json or not sys.stdout.isatty()
    failed = False
    reports = []
    for number, (raw, trace) in enumerate(zip(raws, traces), 1):
        if announce:
            _progress(f"replaying {number}/{len(raws)}: {raw.get('name', Path(args.workload).stem)}")
        is_async = bool(raw.get("config", {}).get("async_scheduling"))
        result = worker.replay(raw, trace=trace, scheduler_cls=ASYNC_RECORDER if is_async else None)
        result["findings"] = findings(result)
        if args.check and trace is not None:
            result["check"] = _check(trace, check_profile(args))
            failed |= not result["check"]["ok"]
        if args.trace is None:
            result["trace"] = None          # the scratch file is gone after this run
        failed |= bool(result["findings"])
        reports.append(result)
        if not args.json:
            _print(result)
    return reports, failed


def _print(result: dict[str, Any]) -> None:
    print(f"{result['name']}: vLLM {result['vllm_version']}, {len(result['batches'])} batches, "
          f"{result['steps']} engine steps, ended {result['ending']}")
    for finding in result["findings"]:
        print(f"  vLLM: {finding}")
    if "check" in result:
        print(f"  {_describe_check(result['check'])}")
    if result.get("trace"):
        print(f"  trace: {result['trace']}")
    sys.stdout.flush()
