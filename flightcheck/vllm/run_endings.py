"""How a replay's busy loop reads an idle engine (engine.py `run_busy_loop`):
the requests still unfinished, an idle that only the next input ends (a
stall: vLLM's ground truth, replay.py `findings`; one shorter than the idle
count is judged by a replay without that input, `short_idle`), and how a
run ends that idles with no input to come. Standard library only.

An idle beside a streaming session parked for input (WAITING_FOR_STREAMING_REQ)
is read by the rule of check-trace's L2 (spec/deadlock.py), on vLLM's own
state: it is the session's client's, not a stall, when nothing but parked
sessions is unfinished (vLLM 0.33.0/0.34.0 scheduler.py
`get_num_unfinished_requests` subtracts `num_waiting_for_streaming_input`,
so the engine does not step for them), or when nothing runs and what the
parked sessions hold is what stops the waiting loop (`session_idles.py`).
Any other idle is a stall, a session alive or not."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .compat import queued_requests

IDLE_STEPS_FOR_STUCK = 4              # steps that neither schedule nor complete, nothing to come
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
    parked = _parked(inner)
    unfinished = [req_id for req_id in unfinished_requests(scheduler) if req_id not in parked]
    if not unfinished or (parked and parked_sessions_hold_the_way(inner)):
        return []
    return [{"step": since, "until": until, "unfinished": unfinished, **({"parked": parked} if parked else {})}]


def left_to_clients(scheduler: Any) -> list[str]:
    """The sessions parked for input whose clients an idle end of the run
    waits on (the module docstring's rule, as `stalled_until_input` reads
    it mid-run): every unfinished request is such a session, or nothing
    runs and what they hold keeps the rest from admission. Empty where no
    session is parked or the idle is a stall beside them. A client that
    never sends the end of its session (session_workload.py `client_ends`)
    ends its run so: vLLM then has nothing else to do, or spins for ever
    on requests only that client's end would admit."""
    inner = getattr(scheduler, "scheduler", scheduler)
    parked = _parked(inner)
    if not parked:
        return []
    unfinished = [req_id for req_id in unfinished_requests(scheduler) if req_id not in parked]
    return parked if not unfinished or parked_sessions_hold_the_way(inner) else []


def _parked(scheduler: Any) -> list[str]:
    """The ids of the sessions parked for input (WAITING_FOR_STREAMING_REQ)."""
    requests = getattr(scheduler, "requests", {})
    return sorted(req_id for req_id, r in requests.items() if getattr(r.status, "name", "") == PARKED)


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
    same run), and that end is no wait of parked sessions' clients
    (`left_to_clients`, as replay.py `findings` reads a `stuck` end: seed
    391 index 30, sync, where a failed grammar's request, unfinished until
    the next update, made the idle before the sessions' inputs look like
    a stall). `batches`: the run's, as the engine formed them."""
    return rerun["ending"] == "stuck" and not rerun.get("left_to_clients") \
        and rerun["batches"] == batches[:idle["batches"]]


@dataclass
class IdleCount:
    """The busy loop's two counts of steps that formed and completed nothing
    (engine.py `run_busy_loop`), each reset by progress and while a KV
    transfer or a grammar is to settle (vLLM spins on has_requests() until
    it does). `steps`, which ends a run `stuck` at IDLE_STEPS_FOR_STUCK,
    counts any input handed over as new work: the steps before an arrival
    must not end the run before the arrival is served (a grammar error's
    finish, seed 51 index 24). `quiet`, where every stall begins and by
    which `idle_an_input_ends` judges, counts the step whose schedule()
    read an input handed over before it and still formed nothing (vLLM
    0.33.0/0.34.0 `EngineCore.step_with_batch_queue` calls `schedule()`
    first whenever `has_requests()`): only an input handed to the step
    itself, after its schedule() (an abort through the aborts queue, an
    arrival inside the wait for output), is new work there. Seed 391 index
    51, 0.33.0: r1 arrived at step 0 and the waiting loop broke on its
    padded admission ("Prefer to not schedule than schedule un-padded",
    `Scheduler.schedule`) from that step on; a connector reset at step 1
    ended the idle, where `steps` was 0, so it went unjudged."""
    steps: int = 0
    quiet: int = 0

    def after_step(self, engine: Any, progressed: bool, handed: bool, handed_in_step: bool) -> None:
        """Count the step just taken: `progressed` (it scheduled or completed
        a batch), `handed` (inputs handed over this turn, before the step's
        schedule() or to the step itself), `handed_in_step` (the latter)."""
        settling = bool(getattr(engine, "transfers_in_flight", lambda: 0)()) or bool(engine.grammars_compiling())
        self.steps = 0 if progressed or handed or settling else self.steps + 1
        self.quiet = 0 if progressed or handed_in_step or settling else (0 if handed else self.quiet) + 1


def idle_an_input_ends(engine: Any, inputs: Any, step: int, idle: IdleCount) -> list[dict]:
    """An idle of fewer steps than the busy loop's count, with nothing in
    flight, that an input due now is about to end (`short_idle`), read before
    the input changes the scheduler (engine.py `run_busy_loop`); it begins at
    the first of its `quiet` steps."""
    if idle.steps >= IDLE_STEPS_FOR_STUCK or not idle.quiet or not inputs.due(step) or engine.batches_in_flight():
        return []
    return short_idle(engine.scheduler, len(engine.batches), step - idle.quiet, step)


def stall_stepped_through(engine: Any, inputs: Any, step: int, idle: IdleCount) -> list[dict]:
    """The stall an input due now ends, stepped through: under async scheduling
    each idle step queues an empty batch (0.33/0.34 `EngineCoreProc.has_work`
    counts the batch queue), so run_busy_loop never fast-forwards past it.
    It begins at the first of its `quiet` steps, as every stall does."""
    if idle.steps < IDLE_STEPS_FOR_STUCK or engine.batches_in_flight() or not engine.busy_while_in_flight \
            or not engine.batch_queue or not inputs.pending or inputs.next_step() > step:
        return []
    return stalled_until_input(engine.scheduler, step - idle.quiet, step)


def idle_ending(scheduler: Any, batches_in_flight: int) -> tuple[str, list[str]]:
    """How a run ends that is idle with nothing in flight and no input to
    come: `done` or `stuck`, and the requests left unfinished (a `stuck`
    that is the wait of parked sessions' clients is told by
    `left_to_clients`: no stall)."""
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
