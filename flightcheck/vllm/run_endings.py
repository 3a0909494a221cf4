"""How a replay's busy loop reads an idle engine (engine.py `run_busy_loop`):
the requests still unfinished, an idle that only the next input ends (a
stall: vLLM's ground truth, replay.py `findings`; one shorter than the idle
count is judged by a replay without that input, `short_idle`), and how a
run ends that idles with no input to come. Standard library only."""

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


def short_idle(scheduler: Any, batches_formed: int, since: int, until: int) -> list[dict]:
    """An idle shorter than the busy loop's count that an input ends, where
    `stalled_until_input` would judge a longer one: a stall only if vLLM,
    given no input from `until` on, would never have formed a batch again.
    The idle count cannot tell (a prefill cadence or a decode stagger idles
    a step or two and goes on), so the replay asks vLLM itself: it runs the
    workload again with the inputs cut at `until` (replay_worker.py
    `_stays_idle`). `batches` is how many batches vLLM had formed by then.
    (vLLM 0.33.0 async, --all-features --spec-tokens 3 seed 103 index 27:
    Finding 6's never-admitted load idled two steps before its abort.)"""
    return [{**stall, "batches": batches_formed} for stall in stalled_until_input(scheduler, since, until)]


def stays_idle(idle: dict, rerun: dict[str, Any], batches: list[dict[str, int]]) -> bool:
    """Whether the replay with the inputs from `idle`'s end on cut
    (replay_worker.py `_stays_idle`) shows vLLM idle for good: it ended
    `stuck` having formed the run's batches up to the idle and no more (a
    replay is deterministic: the same batches up to there say it is the
    same run). `batches`: the run's, as the engine formed them."""
    return rerun["ending"] == "stuck" and rerun["batches"] == batches[:idle["batches"]]


def idle_an_input_ends(engine: Any, inputs: Any, step: int, idle: int) -> list[dict]:
    """An idle of fewer steps than the busy loop's count, with nothing in
    flight, that an input due now is about to end (`short_idle`), read before
    the input changes the scheduler (engine.py `run_busy_loop`)."""
    if not idle or not inputs.due(step) or engine.batches_in_flight():
        return []
    return short_idle(engine.scheduler, len(engine.batches), step - idle, step)


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
