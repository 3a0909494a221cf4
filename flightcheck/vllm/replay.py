"""The main environment's side of a replay: find the vLLM venv of a version,
start the replay worker in it, send it workloads, read results.

The main environment has no vLLM (vLLM's pins want a CUDA torch), so the
worker runs with the venv's interpreter (`scripts/build-vllm-venv.sh` builds
it). It sees only the `flightcheck` package, through a private directory on
its PYTHONPATH holding a link to it: never the main environment's
site-packages, whose z3, hypothesis or numpy must not leak into vLLM's.
Importing vLLM costs 10-100 s (89 s measured on a loaded 2-core machine),
so one worker replays many workloads.
Standard library only.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import flightcheck
from flightcheck import children

from . import SUPPORTED_VERSIONS, versions

CACHE_ENV = "FLIGHTCHECK_VLLM_CACHE"
PYTHON_ENV = "FLIGHTCHECK_VLLM_PYTHON_{}"   # e.g. FLIGHTCHECK_VLLM_PYTHON_0_8_5: an explicit interpreter


class ReplayError(RuntimeError):
    """The worker could not be started or died."""


def venv_python(version: str) -> Path:
    """Where `scripts/build-vllm-venv.sh VERSION` puts the venv's python."""
    explicit = os.environ.get(PYTHON_ENV.format(version.replace(".", "_")))
    if explicit:
        return Path(explicit)
    cache = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "flightcheck")
    return Path(cache) / f"vllm-{version}" / "bin" / "python"


def missing_venv_message(version: str) -> str:
    return (f"no vLLM {version} venv at {venv_python(version).parent.parent}: build it with "
            f"`scripts/build-vllm-venv.sh {version}` (about 2 minutes)")


class ReplayWorker:
    """A running `python -m flightcheck.vllm.replay_worker` in a vLLM venv
    (or another worker module of this package that speaks the same way: a
    `{"ready": VERSION}` line, then one JSON answer per JSON command line,
    such as `cost_worker`)."""

    def __init__(self, version: str, python: Path | None = None,
                 module: str = "flightcheck.vllm.replay_worker") -> None:
        """`python`: an explicit interpreter (`--vllm-python`): any vLLM it
        imports is accepted, `version` being the known release the caller
        mapped it to (`Interpreter.release`); `self.version` becomes what
        the worker reports, and a worker that dies before it is ready is
        one line (`vLLM does not import ...`)."""
        self.version = version
        if python is None and version in _INTERPRETERS:
            python = _INTERPRETERS[version].python
        explicit = python is not None
        python = python or venv_python(version)
        if not python.exists():
            raise ReplayError(f"no interpreter at {python}" if explicit else missing_venv_message(version))
        self._scratch = tempfile.TemporaryDirectory(prefix="flightcheck-replay-")
        package_link = Path(self._scratch.name) / "flightcheck"
        package_link.symlink_to(Path(flightcheck.__file__).resolve().parent, target_is_directory=True)
        self._stderr_path = Path(self._scratch.name) / "worker-stderr.txt"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env["PYTHONPATH"] = self._scratch.name
        self._stderr = open(self._stderr_path, "w")
        self._process = children.register(subprocess.Popen(     # killed with the command on Ctrl-C
            [str(python), "-m", module], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._stderr, env=env, text=True, bufsize=1))
        try:
            ready = self._read()
        except ReplayError:
            if not explicit:
                raise
            last = (self.stderr_tail(1) or f"exit status {self._process.returncode}").strip()
            self.close()
            raise ReplayError(f"vLLM does not import with {python}: {last}") from None
        if explicit and "ready" in ready:
            self.version = ready["ready"]
        elif ready.get("ready") != version:
            self.close()
            message = ready.get("error") or f"the worker runs vLLM {ready.get('ready')}, not {version}: {ready}"
            raise ReplayError(f"{python}: {message}" if explicit else message)

    def _read(self) -> dict[str, Any]:
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            self._process.wait()
            raise ReplayError(f"the vLLM {self.version} replay worker exited ({self._process.returncode}); "
                              f"its last output:\n{self.stderr_tail()}")
        return json.loads(line)

    def stderr_tail(self, lines: int = 20) -> str:
        self._stderr.flush()
        return "\n".join(self._stderr_path.read_text().splitlines()[-lines:])

    def replay(self, workload: dict[str, Any], trace: str | None = None, recorder: bool = True,
               scheduler_cls: str | None = None) -> dict[str, Any]:
        """Replay one workload (raw JSON, as workload.read_workloads returns it).
        `scheduler_cls`: the qualified name of the scheduler class (default:
        the synchronous recorder, or vLLM's plain scheduler without one).
        The workload is validated here first (ReplayError, one line naming
        the key), so no bad value reaches the worker from any caller."""
        from .workload import WorkloadError, workload_from_json

        try:
            workload_from_json(workload)
        except WorkloadError as err:
            raise ReplayError(f"workload {str(workload.get('name', '?'))[:80]!r}: {err}") from None
        job: dict[str, Any] = {"workload": workload, "trace": None if trace is None else str(Path(trace).resolve()),
                               "recorder": recorder}
        if scheduler_cls is not None:
            job["scheduler_cls"] = scheduler_cls
        result = self.call(job)
        if "error" in result:
            raise ReplayError(f"replay of {workload.get('name', '?')} failed in the worker: {result['error']}")
        return result

    def call(self, command: dict[str, Any]) -> dict[str, Any]:
        """Send one command line, read its answer line."""
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(command) + "\n")
        self._process.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self._process.stdin is not None and not self._process.stdin.closed:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._stderr.close()
        self._scratch.cleanup()

    def __enter__(self) -> "ReplayWorker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------
# A developer's own interpreter (`--vllm-python PATH`)
# ---------------------------------------------------------------------------

# Reads vLLM's version without importing vLLM (10-100 s): the file
# `vllm.__version__` comes from (`vllm/_version.py`, written by the build's
# version tool), else the installed distribution's metadata.
_PROBE = r"""
import importlib.metadata, importlib.util, json, pathlib, re, sys
spec = importlib.util.find_spec("vllm")
if spec is None or not spec.submodule_search_locations:
    print(json.dumps({"error": "No module named 'vllm'"}))
else:
    version = None
    # where the import system would load vllm._version from (a finder of the
    # interpreter's own may answer for it), found without importing vllm
    where = list(spec.submodule_search_locations)
    specs = (f.find_spec("vllm._version", where) for f in sys.meta_path if hasattr(f, "find_spec"))
    module = next((s for s in specs if s is not None), None)
    source = pathlib.Path(module.origin if module is not None and module.origin else "/nonexistent")
    if source.exists():
        found = re.search(r"__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)", source.read_text())
        version = found and found.group(1)
    if version is None:
        try:
            version = importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            pass
    print(json.dumps({"version": version or "unknown"}))
"""


@dataclass(frozen=True)
class Interpreter:
    """A Python where vLLM imports: its version and the known release
    (`SUPPORTED_VERSIONS`) whose profile and engine loop stand for it."""
    python: Path
    version: str
    release: str

    @property
    def is_release(self) -> bool:
        """Whether it is that release (a local part such as "+cpu" aside)."""
        return self.version.split("+", 1)[0] == self.release


def nearest_release(version: str, known: tuple[str, ...] = SUPPORTED_VERSIONS) -> str | None:
    """The known release that stands for `version` (versions.nearest_release:
    its own, else the newest listed release not newer than it), or None for
    a version older than all of them, unreadable, or not among `known`."""
    try:
        found = versions.nearest_release(version).version
    except versions.UnknownRelease:
        return None
    return found if found in known else None


# Release -> the interpreter that stands for it while `use_interpreter` runs.
_INTERPRETERS: dict[str, Interpreter] = {}


@contextmanager
def use_interpreter(interpreter: Interpreter) -> Iterator[None]:
    """While the block runs, a `ReplayWorker` of `interpreter.release`
    starts `interpreter.python` instead of the release's venv (the campaign's
    `--vllm-python`: its code asks for workers by release)."""
    before = _INTERPRETERS.get(interpreter.release)
    _INTERPRETERS[interpreter.release] = interpreter
    try:
        yield
    finally:
        if before is None:
            _INTERPRETERS.pop(interpreter.release, None)
        else:
            _INTERPRETERS[interpreter.release] = before


def probe_interpreter(python: str | Path, known: tuple[str, ...] = SUPPORTED_VERSIONS) -> Interpreter:
    """The vLLM an interpreter has, read without importing vLLM;
    ReplayError (one line) for a missing interpreter, no vLLM, or a version
    that is no version."""
    path = Path(python).expanduser()
    if not path.exists():
        raise ReplayError(f"--vllm-python {python}: no such file")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    try:
        done = subprocess.run([str(path), "-c", _PROBE], capture_output=True, text=True, timeout=120, env=env)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ReplayError(f"--vllm-python {python}: cannot run it ({err})") from None
    answer = done.stdout.strip().splitlines()[-1:] if done.returncode == 0 else []
    if not answer:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise ReplayError(f"--vllm-python {python}: not a Python that runs ({last})")
    probed = json.loads(answer[0])
    if "error" in probed:
        raise ReplayError(f"--vllm-python {python}: vLLM does not import there ({probed['error']})")
    release = nearest_release(probed["version"], known)
    if release is None:
        raise ReplayError(f"--vllm-python {python}: vLLM {probed['version']} predates every release flightcheck "
                          f"has tables for ({', '.join(known)}), or is no version")
    return Interpreter(path, probed["version"], release)


def findings(result: dict[str, Any]) -> list[str]:
    """What vLLM's own state showed to be wrong in a run (empty: nothing)."""
    truth = result.get("ground_truth") or {}
    found = _livelock_findings(truth)
    found.extend(_ending_findings(result))
    for stale in truth.get("stale_tokens", []):
        found.append(f"batch {stale['batch']}'s token was appended to {stale['req']} after it was "
                     f"{stale['why']} (step {stale['step']})")
    for partial in truth.get("partial_chunk_tokens", []):
        found.append(f"batch {partial['batch']}'s token was appended to {partial['req']} for a chunk ending at "
                     f"{partial['end']}, short of its known tokens when scheduled (step {partial['step']})")
    for negative in truth.get("negative_counters", []):
        found.append(f"{negative['req']}'s {negative['counter']} went negative ({negative['value']}) at step "
                     f"{negative['step']}")
    for drift in truth.get("in_flight_counter_mismatches", []):
        found.append(f"{drift['req']}'s num_in_flight_tokens ({drift['num_in_flight_tokens']}) disagrees with the "
                     f"tokens of its batches in flight ({drift['in_flight']}) at step {drift['step']}")
    for breach in truth.get("placeholder_mismatches", []):
        found.append(f"{breach['req']}'s output placeholders ({breach['placeholders']}) break "
                     f"`{breach['rule']}` at step {breach['step']}")
    for leftover in truth.get("leftover_drafts", []):
        found.append(f"{leftover['req']}'s {leftover['drafts']} drafts {leftover['why']} were scheduled at step "
                     f"{leftover['step']} (vLLM 0.33 clears them; outside the spec's model)")
    for double in truth.get("double_samples", []):
        # vLLM #52071 (open; fix proposed in PR #52179): only AsyncScheduler sets
        # `next_decode_eligible_step`, which 0.33.0/0.34.0 `Scheduler.schedule`
        # reads to keep a request's decodes `pp_size` steps apart
        found.append(f"batch {double['batch']} samples {double['req']} while batch {double['in_flight']}, which "
                     f"samples it too, is in flight: one position sampled twice, vLLM #52071 (step {double['step']})")
    for negative in truth.get("negative_schedules", []):
        found.append(f"{negative['req']} was scheduled {negative['n']} tokens at step {negative['step']}")
    # (drafts_held_at_admission is no finding by itself: it names the cause
    # of a later crash or smaller hit, for the differential.)
    for beyond in truth.get("beyond_max_model_len", []):
        found.append(f"{beyond['req']} was scheduled up to position {beyond['end']}, past max_model_len, at step "
                     f"{beyond['step']}")
    for heap in truth.get("priority_heaps_out_of_order", []):
        found.append(f"{heap['req']}'s input left the priority queue {heap['queue']} out of heap order "
                     f"({', '.join(heap['order'])}; step {heap['step']})")
    for lost in truth.get("session_inputs_lost", []):
        found.append(f"{lost['req']}'s input was queued onto its finished request ({lost['status']}, its blocks "
                     f"held for the KV connector), where it never runs (step {lost['step']})")
    for seats in truth.get("session_seats_overcounted", []):
        found.append(f"{seats['running']} running requests and {seats['parked']} sessions waiting for input hold "
                     f"more than max_num_seqs = {seats['max_num_seqs']} seats (a session stopped while preempted "
                     f"counts a seat it gave up; step {seats['step']})")
    found.extend(f"{bound['req']} was finished with an error for an earlier request's grammar under its id (step "
                 f"{bound['step']})" for bound in truth.get("grammar_errors_bound_by_id", []))
    found.extend(_unwritten_kv_findings(truth))
    found.extend(_idle_findings(result))
    for gated in result.get("gated_completions", []):
        if gated.get("would_schedule"):
            found.append(f"the engine completed a batch at step {gated['step']} because scheduled_req_ids held "
                         f"{gated['stale']} with no batch in flight; without them schedule() forms a batch "
                         f"(step {gated['step']})")
    found.extend(_kv_connector_findings(truth))
    found.extend(_in_flight_set_findings(truth))
    return found


def _livelock_findings(truth: dict[str, Any]) -> list[str]:
    """A request preempted twice in a row from one state (ground_truth.py
    `_fc_check_livelock`), with the blocks of its sequence without and with
    the lookahead slots."""
    return [f"a livelock: {loop['req']} was preempted {loop['repeats']} times in a row from one state of every "
            f"request (no token, input or finish between); its {loop['num_tokens']} tokens fit "
            f"{loop['blocks_of_sequence']} blocks, with {loop['num_lookahead_tokens']} lookahead slots "
            f"{loop['blocks_with_lookahead']} (step {loop['step']})" for loop in truth.get("admission_livelocks", [])]


def _unwritten_kv_findings(truth: dict[str, Any]) -> list[str]:
    """A prefix hit on a block no batch or load had wholly written
    (unwritten_kv_recording.py); `blocks_cached_unwritten` is no finding by
    itself: it names the cause of such a hit."""
    found = []
    for hit in truth.get("hits_on_unwritten_kv", []):
        cacher = hit["cached_by"] or {}
        found.append(f"{hit['req']}'s prefix hit of {hit['hit']} tokens takes block {hit['block']} (its block "
                     f"{hit['index']}), of whose tokens batches have written {hit['written']} "
                     f"(hit_on_unwritten_kv; cached by {cacher.get('req', 'unknown')} at step "
                     f"{cacher.get('step', '?')}; step {hit['step']})")
    return found


def _ending_findings(result: dict[str, Any]) -> list[str]:
    """A run that did not end `done`; not a `stuck` end that only the clients
    of sessions parked for input can end (run_endings.py `left_to_clients`:
    their wait, not a stall; vLLM 0.33.0/0.34.0 `get_num_unfinished_requests`
    leaves the parked sessions out)."""
    if result["ending"] == "done" or (result["ending"] == "stuck" and result.get("left_to_clients")):
        return []
    detail = result.get("exception") or ", ".join(result.get("unfinished") or [])
    return [f"the run ended {result['ending']}"
            + (f" with {result['batches_in_flight']} batches in flight" if result["batches_in_flight"] else "")
            + (f" ({detail})" if detail else "")]


def _in_flight_set_findings(truth: dict[str, Any]) -> list[str]:
    """vLLM 0.8.4's `scheduled_req_ids` against the batches in flight: a
    finding where it lacks a request whose batch is in flight (a stale
    completion removed it: `Scheduler.schedule`'s running loop no longer
    skips the request, which is scheduled twice or preempted, or the run
    crashes). An extra id alone is none: 0.8.4 reads the set in two places
    only, the running loop's skip (`Scheduler.schedule`), which never meets
    an extra id (it belongs to a request preempted with its batch in flight,
    left in `waiting` by `update_from_output`, which walks `running` only,
    or finished since), and `get_num_unscheduled_requests`, the gate of
    `EngineCore.step_with_batch_queue`. What a gate the id closed changed is
    named by its own findings: a completion where `schedule()` forms a batch
    (`gated_completions`), an idle only an input ends (`stalls`), a run that
    ends `stuck`. A drift that healed before any of these (the request
    resumed: seeds 305, 315 and 328 of the 0.8.4 hunt) changed nothing
    vLLM did, as the positional ground truth says
    (verification/traces/ground_truth.py)."""
    return [f"scheduled_req_ids disagrees with the batches in flight at step {mismatch['step']}: "
            f"extra {mismatch['extra']}, missing {mismatch['missing']}"
            for mismatch in truth.get("in_flight_set_mismatches", []) if mismatch.get("missing")]


def _idle_findings(result: dict[str, Any]) -> list[str]:
    """What the engine copy saw idle: a stall only an input ended (run_endings.py
    `stalled_until_input`), a wait for input with batches in flight."""
    found = []
    for stall in result.get("stalls", []):
        beside = f" (beside {', '.join(stall['parked'])}, parked for input)" if stall.get("parked") else ""
        found.append(f"schedule() formed nothing from step {stall['step']} with nothing in flight and "
                     f"{', '.join(stall['unfinished'])} unfinished{beside}, until an input at step {stall['until']} "
                     f"(without it the run ends stuck; step {stall['step']})")
    for wait in result.get("waits_in_flight", []):
        found.append(f"the engine waited for input with {wait['batches_in_flight']} batches in flight from step "
                     f"{wait['step']} to step {wait['until']} (step {wait['step']})")
    return found


def _kv_connector_findings(truth: dict[str, Any]) -> list[str]:
    """What vLLM's own state showed to be wrong around its KV connector."""
    found = []
    for freed in truth.get("kv_blocks_freed_under_transfer", []):
        found.append(f"{freed['req']} ({freed['why']}) references blocks {freed['blocks']} that are back in the "
                     f"free pool (step {freed['step']})")
    for leak in truth.get("kv_blocks_leaked_at_end", []):
        found.append(f"the run ended with {leak['blocks']} blocks not returned and requests {leak['requests']} "
                     f"still kept (step {leak['step']})")
    for kept in truth.get("kv_rollback_placeholders", []):
        found.append(f"{kept['req']}'s rollback to {kept['computed']} tokens after its failed KV load keeps "
                     f"{kept['placeholders']} output placeholders (vLLM #49250; step {kept['step']})")
    for held in truth.get("kv_holder_base_counts_later_batches", []):
        found.append(f"{held['req']}, sharing the invalid blocks of a failed KV load, was set back to "
                     f"{held['computed']} tokens, counting its batches {held['batches']} still in flight "
                     f"(step {held['step']})")
    for read in truth.get("kv_computed_on_invalid_kv", []):
        found.append(f"{read['req']} was scheduled @{read['start']} on blocks {read['blocks']}, whose KV a load "
                     f"reported invalid (step {read['reported']}) and no batch has recomputed since "
                     f"(computed_on_invalid_kv, vLLM #37827; step {read['step']})")
    for late in truth.get("kv_superseded_tokens", []):
        found.append(f"batch {late['batch']}'s token was appended to {late['req']}, though a failed KV load "
                     f"rolled it back while the batch was in flight (step {late['step']})")
    return found
