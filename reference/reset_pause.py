"""Reset and pause, as vLLM 0.33 and 0.34's `Scheduler` has them (a mixin of
scheduler.py's Scheduler; the profile's `reset_drops_running_output` and
`pause_states`).

* `reset_prefix_cache(reset_running_requests)`: with running requests
  reset, each is popped from the tail of `running` and preempted with its
  tokens in flight dropped (`_preempt_request(drop_stale_output=True)`):
  blocks freed, back to the head of `waiting` (under the priority policy
  at its place in the heap's order), a new incarnation, its stale
  share the tokens in flight, in drop mode, no placeholders. Then the pool
  forgets every cached hash, if no block is held (else False; with running
  requests reset it raises: while a streaming session between turns holds
  blocks, sessions.py, or, with a KV connector, a parked load, a held send
  or a table a preemption put behind the step fence, kv_transfer.py).
  With `reset_connector` the KV connector's own cache is reset after the
  pool's (`reset_connector_cache`, whose False would make the call's
  result False; a no-op success without a connector): the fabricated
  connector forgets the offers of the requests it has not served
  (connector.py `reset_cache`).
* `set_pause_state`: PAUSED_ALL gives `schedule()` no token budget and no
  waiting loop; PAUSED_NEW looks only at `kv_holding_waiting` in the
  waiting loop (a streaming session's next turn, a landed KV load; no
  admission from `waiting`, a preempted request included, and no load
  started: kv_waiting.py); `get_num_unfinished_requests` counts accordingly, and with it
  `has_requests` (the engine must still complete the batches in flight).
"""

from __future__ import annotations

import enum
from collections import deque
from typing import Any

from .request import Request


class PauseState(enum.IntEnum):
    """vLLM's `PauseState` (vllm/v1/core/sched/interface.py)."""

    UNPAUSED = 0
    PAUSED_NEW = 1
    PAUSED_ALL = 2


class ResetPause:
    """The reset and the pause of scheduler.py's Scheduler (a mixin)."""

    running: list[Request]
    waiting: deque[Request]
    kv_cache_manager: Any
    kv_holding_waiting: Any
    _stale_output_counters: bool
    _priority: bool
    num_waiting_for_streaming_input: int
    connector: Any                    # kv_transfer.py: the fabricated connector, or None
    requests: dict[str, Request]

    def _init_reset_pause(self, profile: Any) -> None:
        self._has_reset, self._has_pause = profile.reset_drops_running_output, profile.pause_states
        self.pause_state = PauseState.UNPAUSED

    def set_pause_state(self, pause_state: PauseState | int) -> None:
        if not self._has_pause:
            raise NotImplementedError("this vLLM version has no pause states")
        self.pause_state = PauseState(pause_state)

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        """The prefix cache forgotten; the running requests first preempted
        (their output in flight dropped) when asked; then, when asked, the
        connector's cache (vLLM 0.33/0.34 `Scheduler.reset_prefix_cache`:
        `reset_connector_cache() and reset_successful`, after the raise).
        False: a block is held (or the connector's reset failed)."""
        if reset_running_requests:
            if not self._has_reset:
                raise NotImplementedError("this vLLM version cannot reset running requests")
            while self.running:
                self._preempt_dropping_output(self.running.pop())
            if self._priority:                                   # `prepend_request` pushes on the heap
                self._order_waiting()                            # type: ignore[attr-defined]
        reset = self.kv_cache_manager.reset_prefix_cache()
        if reset_running_requests and not reset:
            raise RuntimeError("the prefix cache could not be reset with every running request preempted")
        if reset_connector and self.connector is not None:
            reset = self.connector.reset_cache(self.requests.values()) and reset
        return reset

    def _preempt_dropping_output(self, request: Request) -> None:
        self._preempt(request)                                   # type: ignore[attr-defined]
        if self._stale_output_counters:
            request.drop_stale_output = True
            request.num_stale_output_tokens = request.num_in_flight_tokens
        self._reset_placeholders(request)                        # type: ignore[attr-defined]

    # -- schedule()'s and the engine's view of the pause

    def _runs_running_loop(self) -> bool:
        """PAUSED_ALL: `token_budget = 0`, so the running loop schedules nothing."""
        return self.pause_state != PauseState.PAUSED_ALL

    def _runs_waiting_loop(self) -> bool:
        """The waiting loop runs but under PAUSED_ALL; under PAUSED_NEW it
        looks only at the requests holding KV blocks (`_takes_waiting_queue`;
        `kv_holding_waiting`: without a KV connector, streaming sessions
        between turns)."""
        return self.pause_state != PauseState.PAUSED_ALL

    def _takes_waiting_queue(self) -> bool:
        """The waiting loop goes on to `waiting` only UNPAUSED (vLLM: PAUSED_NEW
        admits only the requests holding KV blocks)."""
        return self.pause_state == PauseState.UNPAUSED

    def get_num_unfinished_requests(self) -> int:
        """0 under PAUSED_ALL; running and KV-holding requests under
        PAUSED_NEW; less, in both, the streaming sessions parked for input
        (vLLM 0.33's and 0.34's `Scheduler.get_num_unfinished_requests`
        subtracts `num_waiting_for_streaming_input` from the waiting count,
        so an engine with only parked sessions has no request: its
        `has_requests()` is false and it queues no empty batch)."""
        if self.pause_state == PauseState.PAUSED_ALL:
            return 0
        holding = len(self.kv_holding_waiting or ())
        waiting = holding if self.pause_state == PauseState.PAUSED_NEW else len(self.waiting) + holding
        return len(self.running) + waiting - self.num_waiting_for_streaming_input
