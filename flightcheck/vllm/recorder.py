"""The recorder a deployment installs: vLLM's V1 `Scheduler` with
`RecordingMixin` in front (recording.py says what it writes and why it
changes no decision), and before them `RaisedRecording`, whose `raised`
event ends the trace where vLLM raises in a scheduler call
(raised_recording.py).

    FLIGHTCHECK_TRACE=/var/log/vllm-trace-{pid}.jsonl \
    vllm serve MODEL --pipeline-parallel-size 2 \
        --scheduler-cls flightcheck.vllm.recorder.RecordingScheduler

or, to have it checked as it runs, streamed to `flightcheck monitor`
(sinks.py; README.md, "Streaming the trace"):

    FLIGHTCHECK_TRACE_SINK=unix:/run/fc/engine-{pid}.sock vllm serve MODEL ...

vLLM's engine core resolves `scheduler_cls` by its qualified name
(`EngineCore.__init__`, `resolve_obj_by_qualname`), so nothing in vLLM is
patched. This module imports vLLM: only vLLM's process (or the replay worker,
which runs in a vLLM venv) imports it.

vLLM 0.33: `RecordingScheduler` records the synchronous `Scheduler` and
refuses to start when the engine runs async scheduling (`RecordingMixin.
__init__`: a `--scheduler-cls` replaces the `AsyncScheduler` that
`get_scheduler_cls` would pick). `RecordingAsyncScheduler` records vLLM
0.33's `AsyncScheduler` (v1/core/sched/async_scheduler.py) for an engine with
async scheduling, the default for single-node pipeline parallelism with the
V2 model runner; it writes the async trace keys (`async_scheduling`,
`batch_queue_depth`, `decode_stagger`, per-entry `placeholders`:
docs/trace-format.md) and refuses an engine without async scheduling:

    vllm serve MODEL --pipeline-parallel-size 2 \
        --scheduler-cls flightcheck.vllm.recorder.RecordingAsyncScheduler
"""

from __future__ import annotations

import vllm
from vllm.v1.core.sched.scheduler import Scheduler

from .kv_invalid_recording import InvalidKVRecordingMixin
from .kv_recording import KVRecordingMixin
from .raised_recording import RaisedRecording
from .recording import RecordingMixin
from .unwritten_kv_recording import UnwrittenKVRecordingMixin

QUALIFIED_NAME = "flightcheck.vllm.recorder.RecordingScheduler"


def _release(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


class RecordingScheduler(RaisedRecording, UnwrittenKVRecordingMixin, InvalidKVRecordingMixin, KVRecordingMixin,
                         RecordingMixin, Scheduler):
    """vLLM's synchronous V1 scheduler, recording every call to a trace."""

    vllm_version = vllm.__version__
    # Whose engine queues 0-token batches (EngineCore.step_with_batch_queue):
    # read in 0.8.4 and 0.8.5 (no: an empty output is dropped) and in 0.33.0
    # (yes: it takes a queue slot and reaches update_from_output).
    queues_empty_batches = _release(vllm.__version__) >= (0, 33)


try:                                       # vLLM 0.33; 0.8.x has no AsyncScheduler
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
except ImportError:  # pragma: no cover - depends on the venv's vLLM
    AsyncScheduler = None  # type: ignore[assignment,misc]

if AsyncScheduler is not None:
    class RecordingAsyncScheduler(RaisedRecording, UnwrittenKVRecordingMixin,  # type: ignore[misc]
                                  InvalidKVRecordingMixin, KVRecordingMixin,
                                  RecordingMixin, AsyncScheduler):  # type: ignore[valid-type]
        """vLLM 0.33's `AsyncScheduler` (output placeholders, the decode
        stagger), recording every call to a trace."""

        vllm_version = vllm.__version__
        queues_empty_batches = True
        records_async_scheduling = True
