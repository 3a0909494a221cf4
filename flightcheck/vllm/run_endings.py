"""How a replay's busy loop reads an idle engine (engine.py `run_busy_loop`):
the requests still unfinished, an idle that only the next input ends (a
stall: vLLM's ground truth, replay.py `findings`), and how a run ends that
idles with no input to come. Standard library only.

An idle beside a streaming session parked for input (WAITING_FOR_STREAMING_REQ)
is read by the rule of check-trace's L2 (spec/deadlock.py), on vLLM's own
state: it is the session's client's, not a stall, when nothing but parked
sessions is unfinished (vLLM 0.33.0/0.34.0 scheduler.py
`get_num_unfinished_requests` subtracts `num_waiting_for_streaming_input`,
so the engine does not step for them), or when nothing runs and what the
parked sessions hold is what stops the waiting loop (`session_idles.py`).
Any other idle is a stall, a session alive or not."""

from __future__ import annotations

from typing import Any

from .compat import queued_requests
from .session_idles import PARKED, parked_sessions_hold_the_way


def stalled_until_input(scheduler: Any, since: int, until: int) -> list[dict]:
    """An idle that only the next input ends: nothing in flight, no transfer
    or grammar to settle, requests unfinished, the scheduler not paused,
    yet schedule() formed nothing for the busy loop's IDLE_STEPS_FOR_STUCK
    steps. Without that input the run would have ended `stuck` (check-trace's
    L2, no deadlock, names it): one stall, or none where the idle is the
    environment's (the pause state; the client of a parked session, module
    docstring). `unfinished` lists what vLLM counts unfinished (the parked
    sessions left out), `parked` the parked sessions beside them."""
    inner = getattr(scheduler, "scheduler", scheduler)     # the reference's side wraps its scheduler
    pause = getattr(inner, "pause_state", None)            # vLLM 0.33/0.34 and the reference alike
    if pause is not None and getattr(pause, "name", "UNPAUSED") != "UNPAUSED":
        return []
    requests = getattr(inner, "requests", {})
    parked = sorted(req_id for req_id, r in requests.items() if getattr(r.status, "name", "") == PARKED)
    unfinished = [req_id for req_id in unfinished_requests(scheduler) if req_id not in parked]
    if not unfinished or (parked and parked_sessions_hold_the_way(inner)):
        return []
    return [{"step": since, "until": until, "unfinished": unfinished, **({"parked": parked} if parked else {})}]


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
