"""What a serving benchmark sends: requests with a prompt length, an output
length and a send time (seconds from the benchmark's start).

Every dataset loader and generator returns a `Workload`; the arrival process
(`arrivals.py`) stamps the send times, so a dataset says only *what* is asked
and the arrival process only *when*, as in vLLM's benchmark_serving.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


class WorkloadError(ValueError):
    """Bad benchmark input: the message names the file and line, or the
    accepted values, so the user can fix it without reading the code."""


@dataclass(frozen=True)
class RequestSpec:
    req_id: str
    prompt_len: int          # tokens sent
    output_len: int          # max_tokens; generation stops there (no EOS in a simulation)
    send_time: float = 0.0   # seconds after the benchmark starts

    def __post_init__(self) -> None:
        if self.prompt_len < 1 or self.output_len < 1:
            raise WorkloadError(f"request {self.req_id!r}: prompt_len and output_len must be "
                                f">= 1, got {self.prompt_len} and {self.output_len}")


@dataclass(frozen=True)
class Workload:
    name: str                          # e.g. "burstgpt-synthetic", "sharegpt:path"
    requests: tuple[RequestSpec, ...]

    @property
    def total_input_tokens(self) -> int:
        return sum(r.prompt_len for r in self.requests)

    @property
    def total_output_tokens(self) -> int:
        return sum(r.output_len for r in self.requests)

    def with_send_times(self, times: list[float]) -> "Workload":
        if len(times) != len(self.requests):
            raise ValueError(f"{len(times)} send times for {len(self.requests)} requests")
        return Workload(self.name, tuple(replace(r, send_time=t)
                                         for r, t in zip(self.requests, times)))

    def fit_model_len(self, max_model_len: int) -> "Workload":
        """Refuse requests the server would refuse (prompt + output beyond
        max_model_len), naming the first, rather than failing mid-run."""
        for r in self.requests:
            if r.prompt_len + r.output_len > max_model_len:
                raise WorkloadError(
                    f"{self.name}: request {r.req_id} needs {r.prompt_len} + {r.output_len} "
                    f"tokens, more than --max-model-len {max_model_len}")
        return self
