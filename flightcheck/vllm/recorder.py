"""The recorder a deployment installs: vLLM's V1 `Scheduler` with
`RecordingMixin` in front (recording.py says what it writes and why it
changes no decision).

    FLIGHTCHECK_TRACE=/var/log/vllm-trace-{pid}.jsonl \
    vllm serve MODEL --pipeline-parallel-size 2 \
        --scheduler-cls flightcheck.vllm.recorder.RecordingScheduler

vLLM's engine core resolves `scheduler_cls` by its qualified name
(`EngineCore.__init__`, `resolve_obj_by_qualname`), so nothing in vLLM is
patched. This module imports vLLM: only vLLM's process (or the replay worker,
which runs in a vLLM venv) imports it. A later vLLM with another scheduler
class (0.33's `AsyncScheduler`) gets its recorder here as one more class
with the same mixin.
"""

from __future__ import annotations

import vllm
from vllm.v1.core.sched.scheduler import Scheduler

from .recording import RecordingMixin

QUALIFIED_NAME = "flightcheck.vllm.recorder.RecordingScheduler"


class RecordingScheduler(RecordingMixin, Scheduler):
    """vLLM's synchronous V1 scheduler, recording every call to a trace."""

    vllm_version = vllm.__version__
