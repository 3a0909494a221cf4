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
SUPPORTED_VERSIONS = ("0.8.5", "0.8.4", "0.33.0")
DEFAULT_VERSION = "0.8.5"
