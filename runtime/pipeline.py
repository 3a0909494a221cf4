"""The driver's side of the pipeline: an `Executor` over K stage processes.

`submit` copies the batch's snapshot into a `BatchPlan` and isends it to
every stage at once (stages queue plans FIFO), so while stage 1 runs batch n,
stage 0 runs batch n + 1. One receiver thread takes the messages the stages
send back (ready, result, error, bye) and completes the futures in FIFO
order. `result()` waits in short slices and checks, between them, that every
stage process is alive, so a dead stage becomes a `PipelineError` within
about a second, never a hang.

Faults are reported by the stage that failed first, not the one that
noticed: a stage killed by a signal, else a stage that raised an error of its
own, else a stage that vanished without a word (`_first_failure`). From
start-up on the driver watches the stage processes: each checks in at the
driver's store before the collective start, so one that dies while loading
is named within a fraction of a second instead of after the store's timeout.
The stages ignore SIGINT (the driver stops them) and write their output to a
log file that a failure message names, so their tracebacks stay out of the
driver's stderr. A stage dies with the driver, however the driver ends
(lifeline.py); a stage that stops answering (SIGSTOP) is named by the
driver's watch over the stages' heartbeats within 6 s and killed, so it ends
the run as a dead stage does (heartbeat.py). `close()` also reports a stage
that ended abnormally when the run itself had not failed (`stage_failure`).

Launch: `PipelineExecutor.spawn(...)` starts K processes with
torch.multiprocessing (the caller becomes rank 0);
`PipelineExecutor.attach(...)` is for rank 0 under torchrun, where the other
ranks run `stage_main.serve_stage`.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from flightcheck.reference import ModelRunnerOutput, SchedulerOutput

from .local_executor import DoneFuture, empty_output, to_model_runner_output
from .plan import AllTokenIds, BatchPlan, BatchResult, PendingIds
from .heartbeat import HangWatch
from .stage_main import StageSpec, checkin_key
from .stage_processes import reap, start_stages
from .transport import Groups, Outbox, make_groups, recv_object


class PipelineError(RuntimeError):
    """A stage failed, died or stopped answering."""


class StageDied(PipelineError):
    """A stage process ended without reporting an error of its own (killed by
    a signal, or gone without a word): a fault of the run, not of its input."""


# How long to let the other stages' processes settle after a failure is
# noticed, so that the stage that failed first (not one that merely lost its
# peer) is named; a killed stage's neighbours notice within milliseconds.
SETTLE_S = 1.0


class PipelineFuture:
    def __init__(self, executor: "PipelineExecutor", batch_id: int) -> None:
        self._executor, self.batch_id = executor, batch_id
        self._event = threading.Event()
        self._result: BatchResult | None = None
        self._output: ModelRunnerOutput | None = None

    def done(self) -> bool:
        return self._event.is_set()

    def result(self, timeout: float | None = None) -> ModelRunnerOutput:
        if self._output is None:
            self._executor._wait(self, timeout)
            assert self._result is not None
            self._output = to_model_runner_output(self._result)
            self._executor._completed(self)
        return self._output


@dataclass(frozen=True)
class SpawnedStages:
    """The stage processes `PipelineExecutor.spawn` started on this machine,
    the file their stdout and stderr go to, and the watch over their
    heartbeats."""
    processes: list
    log_path: str
    watch: HangWatch | None = None


class PipelineExecutor:
    def __init__(self, groups: Groups, spec: StageSpec, *, spawned: SpawnedStages | None = None,
                 num_spec_tokens: int = 0, stall_timeout: float = 120.0, on_stage_times=None) -> None:
        self.groups, self.num_stages, self.spec = groups, spec.num_stages, spec
        self.processes = spawned.processes if spawned is not None else []
        self.num_spec_tokens = num_spec_tokens
        self.stall_timeout = stall_timeout
        self.on_stage_times = on_stage_times          # callback(batch_id, [(t0, t1, recv)])
        self.stage_info: dict[int, dict] = {}
        self.log_path = spawned.log_path if spawned is not None else None   # the stages' stdout and stderr
        self._watch = spawned.watch if spawned is not None else None   # hung stages (heartbeat.py)
        # A stage that ended abnormally with no failure of the run to show for
        # it (e.g. killed once every result was back), in words: set by close().
        self.stage_failure: str | None = None
        self.feedback = spec.feedback
        # Set by generate(): a resumed request's whole sequence (feedback mode).
        self.all_token_ids: AllTokenIds | None = None
        self._pending_ids = PendingIds()
        self._stage_errors: dict[int, tuple[str, bool]] = {}   # stage -> (traceback, lost peer)
        self._stage_died = False                     # the failure is a stage process's death
        self._outbox = Outbox()
        self._pending: deque[PipelineFuture] = deque()
        self._lock = threading.Lock()
        self._error: str | None = None
        self._ready = threading.Event()
        self._closed = False
        if self._watch is not None:
            self._watch.on_hang = self._hung
        for rank in range(1, self.num_stages + 1):
            self._outbox.send_object(spec, rank, groups.meta)
        self._receiver = threading.Thread(target=self._receive_loop, daemon=True,
                                          name="pipeline-receiver")
        self._receiver.start()
        self._wait_until(self._ready.is_set, "the stages to start")

    # -- launch ------------------------------------------------------------------

    @classmethod
    def spawn(cls, spec: StageSpec, *, act_backend: str = "gloo", init_timeout: float = 120.0,
              **kwargs) -> "PipelineExecutor":
        """Start K stage processes on this machine; this process becomes rank 0."""
        if dist.is_initialized():
            raise PipelineError("torch.distributed is already initialised in this process")
        K = spec.num_stages
        timeout = timedelta(seconds=init_timeout)
        # The driver holds the store, so it can see which stages have reached
        # it while it watches their processes (wait_for_workers=False: the
        # constructor returns at once).
        store = dist.TCPStore("127.0.0.1", 0, K + 1, is_master=True, timeout=timeout,
                              wait_for_workers=False)
        log_fd, log_path = tempfile.mkstemp(prefix="flightcheck-stages-", suffix=".log")
        os.close(log_fd)
        procs: list = []
        watch: HangWatch | None = None
        try:
            heartbeats = start_stages(procs, K, store.port, act_backend, init_timeout, log_path)
            watch = HangWatch(heartbeats, procs)
            _wait_for_checkins(store, procs, init_timeout, log_path)
            dist.init_process_group("gloo", store=dist.PrefixStore("default_pg", store), rank=0,
                                    world_size=K + 1, timeout=timeout)
            groups = make_groups(act_backend)
            return cls(groups, spec, spawned=SpawnedStages(procs, log_path, watch), **kwargs)
        except BaseException as err:
            if watch is not None:
                watch.stop()
            reap(procs)
            if dist.is_initialized():
                dist.destroy_process_group()
            if watch is not None and watch.failure is not None and isinstance(err, Exception):
                # The watch killed a hung stage: its death is what the waits saw.
                raise StageDied(f"{watch.failure} while starting (the stages' output: "
                                f"{log_path})") from err
            if not isinstance(err, PipelineError):
                _remove(log_path)
            raise

    @classmethod
    def attach(cls, spec: StageSpec, *, act_backend: str = "gloo", **kwargs) -> "PipelineExecutor":
        """Rank 0 under torchrun (env:// rendezvous); world size = K + 1."""
        if not dist.is_initialized():
            dist.init_process_group("gloo")
        world = dist.get_world_size()
        if world != spec.num_stages + 1:
            raise PipelineError(f"torchrun started {world} ranks; --pp {spec.num_stages} needs "
                                f"{spec.num_stages + 1} (a driver and one per stage)")
        return cls(make_groups(act_backend), spec, **kwargs)

    # -- Executor ------------------------------------------------------------------

    def submit(self, scheduler_output: SchedulerOutput) -> PipelineFuture | DoneFuture:
        if scheduler_output.total_num_scheduled_tokens == 0:
            # vLLM 0.33 queues empty batches; no stage runs one, its ids go
            # with the next batch.
            self._pending_ids.hold(scheduler_output)
            return DoneFuture(empty_output())
        plan = self._pending_ids.plan(scheduler_output, self.num_spec_tokens,
                                      feedback=self.feedback, all_token_ids=self.all_token_ids)
        future = PipelineFuture(self, plan.batch_id)
        # Not under the lock: a check that finds a dead stage reports it
        # through `_fail`, which takes the lock (a Lock, not reentrant; the
        # driver once hung here for good). A failure noticed between the check
        # and the append still reaches this future: `_wait` checks every slice.
        self._check()
        with self._lock:
            self._pending.append(future)
        self._broadcast(plan)
        return future

    def reset(self) -> None:
        """Drop every request's state on every stage (between runs)."""
        if self._pending:
            raise PipelineError("reset() with batches in flight")
        self._pending_ids.clear()
        self._broadcast(BatchPlan(0, (), (), kind="reset"))

    def _broadcast(self, plan: BatchPlan) -> None:
        try:
            for rank in range(1, self.num_stages + 1):
                self._outbox.send_object(plan, rank, self.groups.meta)
            # Every plan older than those still in flight has been received by
            # all stages, so these waits return at once; a send to a stage that
            # has died fails (below) once gloo sees its connection close.
            self._outbox.wait_oldest(keep=2 * self.num_stages * (len(self._pending) + 2))
        except RuntimeError as err:
            # gloo refuses a send to a stage whose connection has closed (it
            # died after the last check): the same failure, not a traceback.
            self._fail(self._first_failure(
                f"lost contact with the stages ({type(err).__name__}: {err})"))
            self._check()                             # raises the failure just recorded
            raise

    # -- receiving -------------------------------------------------------------------

    def _receive_loop(self) -> None:
        byes = 0
        try:
            while byes < self.num_stages:
                _, (kind, stage, payload) = recv_object(None, self.groups.result)
                if kind == "ready":
                    self.stage_info[stage] = payload
                    if len(self.stage_info) == self.num_stages:
                        self._ready.set()
                elif kind == "result":
                    self._deliver(payload)
                elif kind == "error":
                    detail, lost_peer = payload
                    self._stage_errors[stage] = (detail, lost_peer)
                    self._fail(self._first_failure(
                        f"stage {stage} failed: {detail.strip().splitlines()[-1]}"))
                    return
                elif kind == "bye":
                    byes += 1
        except Exception as err:                       # a peer died: gloo reports a closed pair
            if not self._closed:
                self._fail(self._first_failure(
                    f"lost contact with the stages ({type(err).__name__}: {err})"))

    def _deliver(self, result: BatchResult) -> None:
        with self._lock:
            waiting = [f for f in self._pending if not f.done()]
            if not waiting or waiting[0].batch_id != result.batch_id:
                self._error = (f"batch {result.batch_id} came back out of order "
                               f"(expected {waiting[0].batch_id if waiting else None})")
            else:
                waiting[0]._result = result
                waiting[0]._event.set()

    def _fail(self, message: str) -> None:
        with self._lock:
            if self._error is None:
                self._error = message
        for f in list(self._pending):
            f._event.set()
        self._ready.set()

    def _first_failure(self, noticed: str) -> str:
        """The failure to report, given what was noticed first: the stage
        killed by a signal, else the stage whose own code raised, else a stage
        that exited without a word; else `noticed`. The log is named."""
        if self.processes:
            deadline = time.monotonic() + SETTLE_S
            while (time.monotonic() < deadline
                   and not any(p.exitcode is not None and p.exitcode < 0 for p in self.processes)):
                time.sleep(0.05)
        hang = self._watch.failure if self._watch is not None else None
        message = hang or _describe_dead(self.processes, self._stage_errors) or noticed
        self._stage_died = any(p.exitcode is not None for p in self.processes) and not any(
            not lost_peer for _, lost_peer in self._stage_errors.values())
        if self.log_path is not None:
            message += f" (the stages' output: {self.log_path})"
        return message

    def _hung(self, failure: str) -> None:
        """The watch found a hung stage (it kills it next): the run's failure."""
        self._stage_died = True
        self._fail(f"{failure} (the stages' output: {self.log_path})")

    def _check(self) -> None:
        if self._error is None and self._watch is not None and self._watch.failure is not None:
            self._hung(self._watch.failure)
        if self._error is None and not self._closed and any(
                p.exitcode is not None for p in self.processes):
            self._fail(self._first_failure("a stage exited"))
        if self._error is not None:
            raise (StageDied if self._stage_died else PipelineError)(self._error)

    def _wait_until(self, predicate, what: str, timeout: float | None = None) -> None:
        limit = self.stall_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while not predicate():
            self._check()
            if time.monotonic() > deadline:
                self._fail(f"no answer from the stages within {limit:.0f} s while waiting for {what}")
                raise PipelineError(self._error)
            self._ready.wait(0.05)
        self._check()

    def _wait(self, future: PipelineFuture, timeout: float | None) -> None:
        waited = 0.0
        while not future._event.wait(0.2):
            self._check()
            waited += 0.2
            if timeout is not None and waited >= timeout:
                raise TimeoutError(f"batch {future.batch_id} not back after {timeout} s")
            if waited >= self.stall_timeout:
                self._fail(f"batch {future.batch_id} not back after {self.stall_timeout:.0f} s")
        if future._result is None:
            self._check()
            raise PipelineError(self._error or f"batch {future.batch_id} failed")

    def _completed(self, future: PipelineFuture) -> None:
        with self._lock:
            if self._pending and self._pending[0] is future:
                self._pending.popleft()
            else:
                self._pending.remove(future)
        assert future._result is not None
        if self.on_stage_times is not None:
            self.on_stage_times(future.batch_id, list(future._result.stage_times))

    # -- shutdown ------------------------------------------------------------------

    def close(self, timeout: float = 10.0, *, graceful: bool = True) -> None:
        """Stop the stages (cleanly if they are healthy and `graceful`; at once
        after Ctrl-C) and reap every process. A stage that ended abnormally
        when the run itself had not failed (killed once every result was
        back, say) is put in `stage_failure`, for the caller to report. The
        stages' log is removed after a clean run and kept after a failure,
        whose message names it."""
        if self._closed:
            return
        if self._watch is not None:
            self._watch.stop()
        failed_before = self._error is not None
        healthy = (graceful and self._error is None
                   and all(p.exitcode is None for p in self.processes))
        try:
            if healthy:
                self._broadcast(BatchPlan(0, (), (), kind="stop"))
                self._receiver.join(timeout)
                for p in self.processes:
                    p.join(max(0.1, timeout))
        except Exception:
            pass
        finally:
            self._closed = True
            if graceful and not failed_before:
                ended = _abnormal_end(self.processes) or self._error
                if ended is not None:
                    self.stage_failure = f"{ended} (the stages' output: {self.log_path})"
            reap(self.processes)
            # After a clean stop the receiver has seen every `bye`; otherwise it
            # may sit in a receive that its dead peers never end (it is a daemon).
            self._receiver.join(1.0 if healthy else 0.1)
            if dist.is_initialized():
                try:
                    dist.destroy_process_group()
                except Exception:
                    pass
            if self.log_path is not None and self._error is None and self.stage_failure is None:
                _remove(self.log_path)

    def __enter__(self) -> "PipelineExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _wait_for_checkins(store, procs: list, timeout_s: float, log_path: str) -> None:
    """Wait until every stage has reached the store, watching their
    processes: a stage that dies while starting is named at once."""
    keys = [checkin_key(rank) for rank in range(1, len(procs) + 1)]
    deadline = time.monotonic() + timeout_s
    while not store.check(keys):
        dead = _describe_dead(procs, {})
        if dead is not None:
            raise StageDied(f"{dead} while starting (the stages' output: {log_path})")
        if time.monotonic() > deadline:
            late = [i for i, key in enumerate(keys) if not store.check([key])]
            raise PipelineError(f"stage {late[0]} did not start within {timeout_s:.0f} s "
                                f"(the stages' output: {log_path})")
        time.sleep(0.05)


def _describe_dead(procs: list, stage_errors: dict[int, tuple[str, bool]]) -> str | None:
    """The stage that failed first among those that stopped, in words; None
    when every stage process is alive and none reported an error."""
    for i, p in enumerate(procs):
        if p.exitcode is not None and p.exitcode < 0:
            return _describe_exit(i, p)
    for i, (detail, lost_peer) in sorted(stage_errors.items()):
        if not lost_peer:
            return f"stage {i} failed: {detail.strip().splitlines()[-1]}"
    for i, p in enumerate(procs):
        if p.exitcode is not None and i not in stage_errors:
            return _describe_exit(i, p)
    return None


def _abnormal_end(procs: list) -> str | None:
    """The first stage process that has ended other than cleanly (exit 0), in words."""
    for i, p in enumerate(procs):
        if p.exitcode is not None and p.exitcode != 0:
            return _describe_exit(i, p)
    return None


def _describe_exit(index: int, process) -> str:
    if process.exitcode >= 0:
        return f"stage {index} (pid {process.pid}) exited with code {process.exitcode}"
    try:
        name = signal.Signals(-process.exitcode).name
    except ValueError:
        name = f"signal {-process.exitcode}"
    return f"stage {index} (pid {process.pid}) was killed by {name}"


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass

