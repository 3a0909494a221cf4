"""vLLM raising inside a scheduler call of its engine's: the recorder's last
event (docs/trace-format.md, `raised`).

Where vLLM raises inside `schedule()`, `update_from_output()` or
`finish_requests()` (vLLM 0.33 and 0.34 `Scheduler.schedule`'s `assert
num_new_tokens == 1 + self.num_spec_tokens` on a padded admission that the
long-prefill threshold cut, 0.34.0 scheduler.py:1643; vLLM 0.8.x
`BlockPool.cache_full_blocks`, `KVCacheManager.allocate_slots`, `assert
num_new_tokens > 0` in `Scheduler.schedule`), its engine core dies of it
(vLLM 0.34 `EngineCoreProc.run_engine_core` logs it and shuts down). The
trace would stop before that call's events and read as a run cut short,
which check-trace accepts as a prefix. `RaisedRecording`, in front of the
other recorder mixins (recorder.py), writes one `raised` event after
whatever that call's hooks wrote (the `complete` of an update vLLM raised
in: recording.py), then lets the exception go on.

It is written once, for the call the engine made (a `finish_requests` that
vLLM's `update_from_output` calls raises through that update), and only if
the exception came out of vLLM: a frame of the `vllm` package lies between
the hook and the raise (vLLM's own assertion, or an error of a component
it called). An error the recorder raised itself, after vLLM's call returned,
is not vLLM's: no event.

`add_request` is not watched: vLLM's `Scheduler.add_request` raises only on
a live duplicate id (`assert ... "duplicate request id"`), an input its
front end never sends (a workload's error: generate.py aborts a request
before its id is reused); its arrival is not written, so no legal trace
shows it.

Standard library only: this module never imports vLLM.
"""

from __future__ import annotations

import traceback
from types import TracebackType
from typing import Any


def raised_from_vllm(err: BaseException) -> bool:
    """Whether some frame between the catching hook and the raise runs vLLM's code."""
    tb: TracebackType | None = err.__traceback__
    while tb is not None:
        module = str(tb.tb_frame.f_globals.get("__name__", ""))
        if module == "vllm" or module.startswith("vllm."):
            return True
        tb = tb.tb_next
    return False


def raised_event(call: str, err: BaseException) -> dict[str, Any]:
    """The `raised` event: the call, the exception's type and the first line
    of its message, and where it was raised (a bare assert's message is
    empty: the innermost line says which one failed)."""
    message = str(err).strip().split("\n", 1)[0]
    event: dict[str, Any] = {"ev": "raised", "in": call,
                             "error": f"{type(err).__name__}: {message}" if message else type(err).__name__}
    frames = traceback.extract_tb(err.__traceback__)
    if frames:
        last = frames[-1]
        path = last.filename.split("site-packages/")[-1]
        event["at"] = f"{path}:{last.lineno} in {last.name}: {(last.line or '').strip()}"
    return event


class RaisedRecording:
    """Put in front of the recorder's other mixins: `class R(RaisedRecording, KVRecordingMixin, RecordingMixin, Scheduler)`."""

    _fc_open_calls = 0                   # the watched calls under way (nested: vLLM calls finish_requests itself)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        return self._fc_watch("schedule", super().schedule, *args, **kwargs)  # type: ignore[misc]

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        return self._fc_watch("update_from_output", super().update_from_output,  # type: ignore[misc]
                              scheduler_output, model_runner_output)

    def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
        return self._fc_watch("finish_requests", super().finish_requests,  # type: ignore[misc]
                              request_ids, finished_status)

    def _fc_watch(self, call: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        self._fc_open_calls += 1
        try:
            return method(*args, **kwargs)
        except Exception as err:
            if self._fc_open_calls == 1 and raised_from_vllm(err):
                if call == "schedule":
                    self.flightcheck_step += 1     # type: ignore[attr-defined]  # (an update counts its own)
                self._fc_write(raised_event(call, err))      # type: ignore[attr-defined]
            raise
        finally:
            self._fc_open_calls -= 1
