"""`flightcheck vllm campaign` and `flightcheck vllm fit`, and the replay's
`--vllm-python`: a developer's own vLLM.

    flightcheck vllm campaign --workloads 300 --versions 0.33.0 --json results.json
    flightcheck vllm campaign --vllm-python ~/src/vllm/.venv/bin/python --workloads 100
    flightcheck vllm replay workload.json --vllm-python ~/src/vllm/.venv/bin/python --check
    flightcheck vllm fit --vllm-python ~/src/vllm/.venv/bin/python --json

`--vllm-python PATH` takes any interpreter where vLLM imports (a venv of any
release, an editable checkout of a branch); the version is its
`vllm.__version__` (read from vLLM's `_version.py`, or the installed
metadata, without importing vLLM). A version flightcheck has tables for runs
as itself; any other runs as the nearest known release at or below it
(replay.py `nearest_release`): that release's engine loop in the replay,
its profile for the differential and check-trace, with a note on stderr.
A path that is no interpreter, or one where vLLM does not import: exit 2,
one line.

`fit` replays a seeded campaign (flightcheck/vllm/fit_workloads.py) once
and judges it under every profile (flightcheck/vllm/fit.py): per profile the
fraction of workloads whose batches and check-trace verdicts agree with
vLLM, the first divergence, and the profile constants that, changed one at a
time, remove it. Progress goes to stderr; stdout carries the report (with
--json, only the JSON). Exit 0 when it ran, 2 on bad input or no vLLM.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from flightcheck.vllm.workload_limits import MAX_WORKLOADS

from .common import bad, count_int, int_in, seed_int


def add_subcommands(actions: Any, replay: argparse.ArgumentParser) -> None:
    """`--vllm-python` on `replay`; the `campaign` and `fit` subcommands."""
    from flightcheck.vllm import DEFAULT_VERSION, SUPPORTED_VERSIONS
    from flightcheck.vllm.campaign import add_options

    add_interpreter_option(replay)
    campaign = actions.add_parser("campaign", help="the differential campaign against vLLM "
                                  "(python -m flightcheck.vllm.campaign, same options)")
    add_options(campaign)
    campaign.set_defaults(func=lambda args: _run_campaign(args, campaign))
    fit = actions.add_parser("fit", help="which profile fits a vLLM best, and which constant a misfit "
                             "points at")
    add_interpreter_option(fit)
    fit.add_argument("--vllm-version", default=DEFAULT_VERSION, choices=SUPPORTED_VERSIONS,
                     help=f"a release's venv, when no --vllm-python is given (default {DEFAULT_VERSION})")
    fit.add_argument("--async", dest="async_scheduling", action="store_true",
                     help="run vLLM with async scheduling (AsyncScheduler, V2 model runner settings)")
    fit.add_argument("--workloads", type=int_in(1, MAX_WORKLOADS), default=40, metavar="N",
                     help="workloads in the campaign (default 40), drawn in turn from each family")
    fit.add_argument("--seed", type=seed_int, default=0, metavar="S")
    fit.add_argument("--explain", type=count_int, default=5, metavar="M",
                     help="misfits per profile tried one constant at a time (default 5; 0: report "
                          "each profile's first divergence without explained_by)")
    fit.add_argument("--json", action="store_true", help="print the report as JSON")
    fit.set_defaults(func=run_fit)


def add_interpreter_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vllm-python", metavar="PATH",
                        help="any Python where vLLM imports (a venv of any release, an editable checkout); "
                             "its vllm.__version__ replaces --vllm-version, and a version with no tables of "
                             "its own runs as the nearest known release (said on stderr)")


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def resolve_interpreter(args: argparse.Namespace) -> str | None:
    """With `--vllm-python`: probe it, set `args.vllm_version` to the release
    that stands for it and `args.interpreter`; None, or the one-line refusal."""
    from flightcheck.vllm.replay import ReplayError, probe_interpreter

    args.interpreter = None
    if not getattr(args, "vllm_python", None):
        return None
    try:
        interpreter = probe_interpreter(args.vllm_python)
    except ReplayError as err:
        return str(err)
    args.interpreter, args.vllm_version = interpreter, interpreter.release
    if not interpreter.is_release:
        _progress(f"vLLM {interpreter.version} has no tables of its own: it runs as vLLM {interpreter.release} "
                  f"(that release's engine loop and profile)")
    return None


def replay_identity(args: argparse.Namespace) -> dict[str, Any]:
    """The replay's `--json` head: the vLLM version (with `--vllm-python`,
    the interpreter's, its path, and the release it runs as)."""
    interpreter = getattr(args, "interpreter", None)
    if interpreter is None:
        return {"vllm_version": args.vllm_version}
    return {"vllm_version": interpreter.version, "vllm_python": str(interpreter.python),
            "runs_as": interpreter.release}


def check_profile(args: argparse.Namespace) -> str | None:
    """The profile check-trace needs for an unreleased vLLM's traces (their
    `vllm_version` selects none): its release's. None for a release."""
    from flightcheck.vllm.differential import profile_for

    interpreter = getattr(args, "interpreter", None)
    if interpreter is None or interpreter.is_release:
        return None
    return profile_for(interpreter.release, args.async_scheduling)


def _run_campaign(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from flightcheck.vllm.campaign import run_campaign

    from .outputs import Output, OutputRefused, claim

    try:                         # --json is written at the end: refused now, not after the campaign
        claimed = claim([Output("--json", args.json)], [("--vllm-python", args.vllm_python)])
    except OutputRefused as err:
        return bad(str(err))
    with claimed:
        return run_campaign(args, parser.error)


def run_fit(args: argparse.Namespace) -> int:
    from flightcheck.vllm.fit import FitOptions, report_lines
    from flightcheck.vllm.fit import run_fit as fit_campaign
    from flightcheck.vllm.replay import ReplayError, ReplayWorker, venv_python

    refused = resolve_interpreter(args)
    if refused:
        return bad(refused)
    if args.async_scheduling:
        from flightcheck.vllm.differential import profile_for
        try:
            profile_for(args.vllm_version, True)
        except ValueError:
            return bad(f"--async: vLLM {args.vllm_version} has no async scheduling the replay drives")
    python = args.interpreter.python if args.interpreter else None
    options = FitOptions(seed=args.seed, workloads=args.workloads, async_scheduling=args.async_scheduling,
                         explain=args.explain)
    try:
        _progress(f"fit: loading vLLM with {python or venv_python(args.vllm_version)} (about a minute)...")
        with ReplayWorker(args.vllm_version, python) as worker:
            report = fit_campaign(worker, options, _progress)
    except ReplayError as err:
        return bad(str(err).splitlines()[0])
    if args.interpreter is not None:
        report["vllm_python"] = str(args.interpreter.python)
        report["release"] = args.interpreter.release
    print(json.dumps(report, indent=1) if args.json else "\n".join(report_lines(report)), flush=True)
    return 0
