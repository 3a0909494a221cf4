"""The Ray executor: each task a Ray task on a cluster, with its resources
declared (`Task.cpus`: one CPU for a Z3 query or a fuzz run, so Ray runs as
many at once on a node as it has cores).

Ray is the optional `cluster` extra (`pip install -e '.[cluster]'`) and is
imported only here, only when `--executor ray` is asked for. Without
`--ray-address` the command starts a Ray instance on this machine and it ends
with the command; with one it joins that cluster (`auto`: the one
`ray start` runs on this machine). Every node needs flightcheck installed
where its Python imports it (docs/cluster.md).

Tasks are submitted with Ray's own retries off (`max_retries=0`): the
executor resubmits a task lost with its worker or node itself
(`Executor._run_again`), so the number retried is counted exactly and
reported. A task's exception comes back as Ray's RayTaskError around it;
the executor raises the task's own exception (`cause`), as the local
executor does. On a Ctrl-C every pending task is cancelled (`ray.cancel`,
force: its worker is killed) before the KeyboardInterrupt goes on.
"""

from __future__ import annotations

import importlib.util
import logging
import signal
import socket
from typing import Any

from .executor import Executor, ExecutorUnavailable, Task, call

# Ray's wait in slices, so the main thread gets back to Python (and sees a
# Ctrl-C) at least this often.
WAIT_SLICE_S = 0.5


def ray_missing() -> str | None:
    """Why `--executor ray` cannot run here, in one line; None if it can."""
    if importlib.util.find_spec("ray") is None:
        return ("--executor ray needs Ray, the optional cluster extra: pip install -e '.[cluster]' "
                "(or pip install 'flightcheck[cluster]')")
    return None


def _ray() -> Any:
    import ray
    return ray


def connect(address: str | None) -> None:
    """Join the cluster at `address`, or start a new Ray instance here (None); a
    no-op when this process is connected already. Ray's own processes start
    with SIGINT blocked (a terminal's Ctrl-C is the command's to answer), and
    the command's signal handlers are kept."""
    ray = _ray()
    if ray.is_initialized():
        return
    if address is not None:
        _answers(address)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    # Ray's start-up notices (token authentication on, say) would land among
    # the command's progress lines: docs/cluster.md says what they would.
    logging.getLogger("ray").setLevel(logging.ERROR)
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        # "local": a new instance even where `ray start` left a cluster's
        # address behind (Ray would join it, or wait minutes for a dead one)
        ray.init(address=address or "local", include_dashboard=False, log_to_driver=False,
                 logging_level=logging.ERROR, configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise ExecutorUnavailable(f"--executor ray: no Ray cluster at {address or 'a local instance'}: "
                                  f"{str(err).splitlines()[0] if str(err) else type(err).__name__}") from err
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        for signum, handler in handlers.items():
            if handler is not None and signal.getsignal(signum) is not handler:
                signal.signal(signum, handler)


def _answers(address: str, timeout_s: float = 5.0) -> None:
    """A `HOST:PORT` address that no server answers is one line at once
    (Ray itself would retry for minutes); `auto` and `ray://` are left to Ray."""
    host, colon, port = address.rpartition(":")
    if not colon or "//" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise ExecutorUnavailable(f"--executor ray: no Ray cluster answers at {address}: "
                                  f"{err.strerror or err}") from None


class RayExecutor(Executor):
    name = "ray"

    def __init__(self, address: str | None) -> None:
        connect(address)
        ray = _ray()
        self._ray = ray
        self._remote = ray.remote(call)
        self._lost = (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                      ray.exceptions.LocalRayletDiedError, ray.exceptions.ObjectLostError,
                      ray.exceptions.OwnerDiedError)

    def _submit(self, task: Task) -> Any:
        options = {"num_cpus": task.cpus, "max_retries": 0, "retry_exceptions": False}
        if task.label:
            options["name"] = task.label
        return self._remote.options(**options).remote(task.function, task.args)

    def _wait(self, handles: list[Any]) -> list[tuple[Any, str, Any]]:
        ready: list[Any] = []
        while not ready:
            ready, _ = self._ray.wait(handles, num_returns=1, timeout=WAIT_SLICE_S)
        outcomes = []
        for ref in ready:
            try:
                outcomes.append((ref, "ok", self._ray.get(ref)))
            except self._ray.exceptions.RayTaskError as err:
                cause = getattr(err, "cause", None)
                outcomes.append((ref, "error", cause if isinstance(cause, Exception) else err))
            except self._lost:
                outcomes.append((ref, "lost", None))
        return outcomes

    def _cancel(self, handles: list[Any]) -> None:
        for ref in handles:
            try:
                self._ray.cancel(ref, force=True)
            except Exception:                   # noqa: BLE001 (finished meanwhile, or its node is gone)
                pass
