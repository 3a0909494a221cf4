"""flightcheck's bridge to the real vLLM: a recorder for deployments
(`recorder.RecordingScheduler`, named in vLLM's `--scheduler-cls`) and a
replay that drives vLLM's own scheduler on workloads (`flightcheck vllm
replay`). See README.md beside this file.

This package is the only code in flightcheck that imports vLLM, and it does so
lazily: importing `flightcheck.vllm` imports no vLLM; `recorder`,
`replay_worker` and `cost_worker` do, and they run inside a vLLM venv built
by `scripts/build-vllm-venv.sh`.
"""

RECORDER = "flightcheck.vllm.recorder.RecordingScheduler"
# vLLM 0.33's AsyncScheduler with the recorder in front (async scheduling).
ASYNC_RECORDER = "flightcheck.vllm.recorder.RecordingAsyncScheduler"
# The supported releases: the table in versions.py.
from .versions import DEFAULT_VERSION, SUPPORTED_VERSIONS  # noqa: E402

__all__ = ["ASYNC_RECORDER", "DEFAULT_VERSION", "RECORDER", "SUPPORTED_VERSIONS"]
