"""How a replay's busy loop reads an idle engine (engine.py `run_busy_loop`):
the requests still unfinished, an idle that only the next input ends (a
stall: vLLM's ground truth, replay.py `findings`), and how a run ends that
idles with no input to come. Standard library only."""

from __future__ import annotations

from typing import Any

from .compat import queued_requests


def stalled_until_input(scheduler: Any, since: int, until: int) -> list[dict]:
    """An idle that only the next input ends: nothing in flight, no transfer
    or grammar to settle, requests unfinished, the scheduler not paused and
    no streaming session waiting for its client, yet schedule() formed
    nothing for the busy loop's IDLE_STEPS_FOR_STUCK steps. Without that
    input the run would have ended `stuck` (check-trace's L2, no deadlock,
    names it): one stall, or none where the idle is the environment's
    (the pause state, a streaming session: none is judged while one lives)."""
    unfinished = unfinished_requests(scheduler)
    inner = getattr(scheduler, "scheduler", scheduler)     # the reference's side wraps its scheduler
    pause = getattr(inner, "pause_state", None)            # vLLM 0.33/0.34 and the reference alike
    if not unfinished or (pause is not None and getattr(pause, "name", "UNPAUSED") != "UNPAUSED"):
        return []
    requests = getattr(inner, "requests", {})
    if any(getattr(r.status, "name", "") == "WAITING_FOR_STREAMING_REQ" or getattr(r, "resumable", False)
           for r in requests.values()):
        # a session between turns may hold its seat or LoRA slot in ways not
        # read here (an --all-features run, seed 108 index 76, idled on one
        # that check-trace's L2 calls a wait for input): not judged, nor is
        # any run of a workload with sessions (engine.py; seed 109 index 11,
        # --stages 1 async, idled so before its session arrived: open)
        return []
    return [{"step": since, "until": until, "unfinished": unfinished}]


def idle_ending(scheduler: Any, batches_in_flight: int) -> tuple[str, list[str]]:
    """How a run ends that is idle with nothing in flight and no input to
    come: `done` or `stuck`, and the requests left unfinished."""
    unfinished = unfinished_requests(scheduler)
    if not unfinished and batches_in_flight == 0:
        # 0.8.4 flushes finished ids only in schedule(), which its gate no
        # longer calls: has_requests() stays true and the engine spins idle
        # until the next input. Nothing is left.
        return "done", []
    return "stuck", unfinished


def unfinished_requests(scheduler: Any) -> list[str]:
    """Every request still in a queue: 0.33 and 0.34 keep a request that
    holds blocks (a parked or resumed streaming session, a finished KV load)
    in `kv_holding_waiting`, and 0.34 an async load in `async_kv_waiting`."""
    queues = [scheduler.waiting] + [getattr(scheduler, name) for name in ("kv_holding_waiting", "async_kv_waiting")
                                    if getattr(scheduler, name, None) is not None]
    waiting = [r for queue in queues for r in queued_requests(queue)]
    return sorted(r.request_id for r in waiting + list(scheduler.running))
