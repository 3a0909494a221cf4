"""The benchmark's printed report block (benchmark_serving's layout) and its
result JSON (benchmark_serving's keys), plus a parser for such blocks so
published tables can be read back as numbers."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .metrics import BenchmarkMetrics, percentile_key

WIDTH = 50
SECTIONS = {
    "ttft": ("TTFT", "Time to First Token"),
    "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
    "itl": ("ITL", "Inter-token Latency"),
    "e2el": ("E2EL", "End-to-end Latency"),
}
DEFAULT_SECTIONS = ("ttft", "tpot", "itl")     # vLLM's default --percentile-metrics


def _line(label: str, value: Any) -> str:
    text = f"{value:.2f}" if isinstance(value, float) else str(value)
    return f"{label:<40} {text:<10}".rstrip()


def format_report(summary: dict[str, float], percentiles: Sequence[float] = (99.0,),
                  sections: Sequence[str] = DEFAULT_SECTIONS,
                  title: str = " Serving Benchmark Result ") -> str:
    """`summary` as `BenchmarkMetrics.summary()` (or a median over seeds)."""
    lines = [f"{title:=^{WIDTH}}",
             _line("Successful requests:", int(summary["completed"])),
             _line("Benchmark duration (s):", float(summary["duration"])),
             _line("Total input tokens:", int(summary["total_input_tokens"])),
             _line("Total generated tokens:", int(summary["total_output_tokens"])),
             _line("Request throughput (req/s):", float(summary["request_throughput"])),
             _line("Output token throughput (tok/s):", float(summary["output_throughput"])),
             _line("Total Token throughput (tok/s):", float(summary["total_token_throughput"]))]
    for key in sections:
        short, header = SECTIONS[key]
        lines.append(f"{header:-^{WIDTH}}")
        lines.append(_line(f"Mean {short} (ms):", float(summary[f"mean_{key}_ms"])))
        lines.append(_line(f"Median {short} (ms):", float(summary[f"median_{key}_ms"])))
        for p in percentiles:
            name = percentile_key(p)
            lines.append(_line(f"{name.upper()} {short} (ms):", float(summary[f"{name}_{key}_ms"])))
    lines.append("=" * WIDTH)
    return "\n".join(lines)


def result_json(metrics: BenchmarkMetrics, **extra: Any) -> dict[str, Any]:
    """vLLM's result JSON: the scalar keys, then per-request arrays (seconds)."""
    out: dict[str, Any] = dict(extra)
    out.update(metrics.summary())
    out.update({
        "input_lens": list(metrics.input_lens), "output_lens": list(metrics.output_lens),
        "ttfts": list(metrics.ttfts), "itls": [list(g) for g in metrics.itls],
    })
    return out


_LABELS = {
    "Successful requests:": "completed", "Benchmark duration (s):": "duration",
    "Total input tokens:": "total_input_tokens", "Total generated tokens:": "total_output_tokens",
    "Request throughput (req/s):": "request_throughput",
    "Output token throughput (tok/s):": "output_throughput",
    "Total Token throughput (tok/s):": "total_token_throughput",
}
_STAT = re.compile(r"^(Mean|Median|P[\d.]+) (TTFT|TPOT|ITL|E2EL) \(ms\):$")


def parse_report(text: str) -> dict[str, float]:
    """The numbers of one report block, under the result-JSON keys."""
    out: dict[str, float] = {}
    for raw in text.splitlines():
        label, _, value = raw.strip().rpartition(" ")
        label = label.strip()
        if not label or not re.fullmatch(r"-?[\d.]+", value):
            continue
        if label in _LABELS:
            out[_LABELS[label]] = float(value)
            continue
        m = _STAT.match(label)
        if m:
            stat = m.group(1).lower()
            out[f"{stat}_{m.group(2).lower()}_ms"] = float(value)
    return out


def side_by_side(blocks: Sequence[str], headers: Sequence[str], gap: int = 3) -> str:
    """Report blocks next to each other, each under its header."""
    columns = [[h.center(WIDTH)] + b.splitlines() for h, b in zip(headers, blocks)]
    height = max(len(c) for c in columns)
    rows = []
    for i in range(height):
        rows.append((" " * gap).join(
            (c[i] if i < len(c) else "").ljust(WIDTH) for c in columns).rstrip())
    return "\n".join(rows)
