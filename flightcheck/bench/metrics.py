"""Serving metrics with vLLM benchmark_serving's definitions (`calculate_metrics`).

All times are the client's: a request's send time and the times its streamed
chunks arrive.

* TTFT: first chunk - send time.
* ITL: gaps between consecutive chunks after the first, pooled over all
  requests before the mean, median and percentiles are taken.
* E2EL: last chunk - send time.
* TPOT, per request with more than one output token:
  (E2EL - TTFT) / (output tokens - 1): excludes the first token; aggregated
  over requests.
* Throughputs: completed / duration, output tokens / duration,
  (input + output tokens) / duration; duration runs from the benchmark's
  start to the last completion.
* Percentiles interpolate linearly between order statistics (numpy's
  default), so P99 of 150 values lies between the two largest.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

METRICS = ("ttft", "tpot", "itl", "e2el")
DEFAULT_PERCENTILES = (99.0,)


@dataclass
class RequestRecord:
    """One request as the client saw it."""

    req_id: str
    prompt_len: int
    send_time: float
    chunk_times: list[float] = field(default_factory=list)   # arrival time of each streamed chunk
    output_len: int = 0                                        # tokens received

    @property
    def ttft(self) -> float:
        return self.chunk_times[0] - self.send_time

    @property
    def latency(self) -> float:
        return self.chunk_times[-1] - self.send_time

    @property
    def itls(self) -> list[float]:
        t = self.chunk_times
        return [t[i + 1] - t[i] for i in range(len(t) - 1)]

    @property
    def tpot(self) -> float | None:
        if self.output_len <= 1:
            return None
        return (self.latency - self.ttft) / (self.output_len - 1)


def percentile(values: Sequence[float], p: float) -> float:
    """numpy.percentile's linear interpolation; 0.0 for no values (as vLLM's
    `np.percentile(x or 0, p)`)."""
    if not values:
        return 0.0
    xs = sorted(values)
    rank = (len(xs) - 1) * p / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(xs) - 1)
    return xs[low] + (xs[high] - xs[low]) * (rank - low)


def percentile_key(p: float) -> str:
    """vLLM's spelling: 99 -> 'p99', 99.9 -> 'p99.9'."""
    return f"p{int(p)}" if float(p).is_integer() else f"p{p}"


@dataclass(frozen=True)
class BenchmarkMetrics:
    completed: int
    total_input_tokens: int
    total_output_tokens: int
    duration: float
    stats: dict[str, float]                     # "mean_ttft_ms", "p99_itl_ms", ... (vLLM keys)
    percentiles: tuple[float, ...]
    ttfts: tuple[float, ...]                    # seconds, per completed request
    tpots: tuple[float, ...]                    # seconds, requests with > 1 output token
    itls: tuple[tuple[float, ...], ...]         # seconds, per request
    input_lens: tuple[int, ...]
    output_lens: tuple[int, ...]

    @property
    def request_throughput(self) -> float:
        return self.completed / self.duration if self.duration > 0 else 0.0

    @property
    def output_throughput(self) -> float:
        return self.total_output_tokens / self.duration if self.duration > 0 else 0.0

    @property
    def total_token_throughput(self) -> float:
        total = self.total_input_tokens + self.total_output_tokens
        return total / self.duration if self.duration > 0 else 0.0

    def summary(self) -> dict[str, float]:
        """The scalar results under vLLM's result-JSON keys."""
        out: dict[str, float] = {
            "duration": self.duration, "completed": self.completed,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "request_throughput": self.request_throughput,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
        }
        out.update(self.stats)
        return out


def _describe(name: str, values_s: Sequence[float], percentiles: Sequence[float]) -> dict[str, float]:
    ms = [v * 1000.0 for v in values_s]
    out = {
        f"mean_{name}_ms": statistics.fmean(ms) if ms else 0.0,
        f"median_{name}_ms": statistics.median(ms) if ms else 0.0,
        f"std_{name}_ms": statistics.pstdev(ms) if ms else 0.0,   # np.std: population
    }
    for p in percentiles:
        out[f"{percentile_key(p)}_{name}_ms"] = percentile(ms, p)
    return out


def compute_metrics(records: Sequence[RequestRecord], duration: float,
                    percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> BenchmarkMetrics:
    done = [r for r in records if r.chunk_times]
    ttfts = [r.ttft for r in done]
    tpots = [t for t in (r.tpot for r in done) if t is not None]
    itls = [r.itls for r in done]
    e2els = [r.latency for r in done]
    stats: dict[str, float] = {}
    stats.update(_describe("ttft", ttfts, percentiles))
    stats.update(_describe("tpot", tpots, percentiles))
    stats.update(_describe("itl", [g for gaps in itls for g in gaps], percentiles))
    stats.update(_describe("e2el", e2els, percentiles))
    return BenchmarkMetrics(
        completed=len(done), total_input_tokens=sum(r.prompt_len for r in done),
        total_output_tokens=sum(r.output_len for r in done), duration=duration, stats=stats,
        percentiles=tuple(percentiles), ttfts=tuple(ttfts), tpots=tuple(tpots),
        itls=tuple(tuple(g) for g in itls), input_lens=tuple(r.prompt_len for r in done),
        output_lens=tuple(r.output_len for r in done))
