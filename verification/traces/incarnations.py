"""An older incarnation's output under a reused request id, for replay.py's
TraceChecker (a mixin; docs/trace-format.md, "A request id reused is a new
incarnation").

vLLM 0.33 and 0.34 look a batch's output up by id (`self.requests.get(req_id)`
in `Scheduler.update_from_output`), so an output of an aborted request's
batch still in flight settles the counters of the newer request that took
its id: its in-flight counter (`num_in_flight_tokens -= n`) and, while that
request has a stale share from a preemption (`_preempt_request`, a reset's
`reset_prefix_cache` included), its stale counter (`num_stale_output_tokens
-= n`, then `assert num_stale_output_tokens >= 0`). The spec binds an output
to its own incarnation, whose slot is finished, so it drops the output and
moves no counter. A trace carries no counters; what shows the binding is
what the writer says of the completion:

* the older entry neither returned a token nor is listed in `dropped`: the
  spec's by-name rule settles the newer request's in-flight counter by
  tokens none of its batches carried (IF1);
* the older entry is listed in `stale` (the vLLM recorder's key: the output
  was counted against a preempted request's stale share): the only share it
  can have been counted against is the newer request's, drained by tokens
  none of its batches carried (IF2), whether or not the output was then
  dropped. An incarnation's own output never reaches here: its request is
  the name's holder.
"""

from __future__ import annotations

from typing import Callable

from flightcheck.spec import Config, State
from flightcheck.spec.state import Entry


class IncarnationOutputs:
    """A mixin of replay.py's TraceChecker (it reads the checker's state,
    configuration and request slots)."""

    state: State
    cfg: Config
    slot: dict[str, int]
    _name: Callable[[int], str]
    _violation: Callable[[str, str], Exception]

    def _check_older_incarnation(self, e: Entry, returned: bool, dropped: bool, stale: bool) -> None:
        """A completing entry whose name a newer incarnation holds (vLLM 0.33
        and 0.34 `Scheduler.update_from_output`, looked up by id): rejected
        where the trace shows the output bound to the newer one's counters."""
        if not self._name_held_by_another(e.req):
            return
        name = self._name(e.req)
        holder = self.state.requests[self.slot[name]]
        if not returned and not dropped:
            # No token to show, and still the bug: a scheduler that dropped the
            # output says so in `dropped`.
            raise self._violation(
                "IF1_in_flight_counter",
                f"an older {name}'s batch ({e.n} tokens, no token sampled) completes while a newer {name} holds "
                f"the name: looked up by name, the newer one's in-flight counter drops to "
                f"{holder.num_in_flight - e.n}, which its own batches in flight do not account for (not listed "
                f"in `dropped`)")
        if stale:
            left = holder.num_stale - e.n
            below = (" (below 0: vLLM asserts `num_stale_output_tokens >= 0` in update_from_output)"
                     if left < 0 else "")
            raise self._violation(
                "IF2_stale_counter",
                f"an older {name}'s batch ({e.n} tokens) completes while a newer {name} holds the name, and the "
                f"trace counts its output against a preempted request's stale share (`stale`): the newer one's "
                f"share ({holder.num_stale} tokens) drops to {left}{below}, by tokens none of its own batches "
                f"carried")

    def _name_held_by_another(self, r: int) -> bool:
        """Whether r's name is held now by another, unfinished incarnation
        (the name was reused while r's batches were in flight), under a
        profile that looks outputs up by name (vLLM 0.33): that request is
        where vLLM binds r's output, counters included."""
        if not self.cfg.rules.stale_output_counters:
            return False
        holder = self.slot.get(self._name(r))
        return holder is not None and holder != r and self.state.requests[holder].status.is_active
