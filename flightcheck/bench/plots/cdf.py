"""TTFT and TPOT CDFs of several runs, from result JSON files (vLLM's
`ttfts` and `itls` arrays, or a multi-seed result's pooled `ttfts` and
`tpots`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..workload import WorkloadError
from .figure_file import save_figure
from .timeline import _pyplot


def load_latencies(path: str | Path) -> tuple[str, list[float], list[float]]:
    """(label, TTFTs in ms, TPOTs in ms) of one result file."""
    p = Path(path)
    if not p.is_file():
        raise WorkloadError(f"results file not found: {p}")
    try:
        doc: dict[str, Any] = json.loads(p.read_text())
    except json.JSONDecodeError as err:
        raise WorkloadError(f"{p}:{err.lineno}: not JSON: {err.msg}") from None
    if not isinstance(doc, dict) or "ttfts" not in doc:
        raise WorkloadError(f"{p}: not a result JSON with per-request 'ttfts' "
                            f"(run simulate/bench with --json)")
    ttfts = [t * 1000 for t in doc["ttfts"]]
    if "tpots" in doc:
        tpots = [t * 1000 for t in doc["tpots"]]
    else:   # TPOT of a request is the mean of its inter-token gaps
        tpots = [1000 * sum(g) / len(g) for g in doc.get("itls", []) if g]
    label = str(doc.get("policy") or p.stem)
    return label, ttfts, tpots


def _cdf(values: list[float]) -> tuple[list[float], list[float]]:
    xs = sorted(values)
    n = len(xs)
    return xs, [(i + 1) / n for i in range(n)]


def draw_cdfs(paths: list[str], out: str | Path, title: str | None = None) -> None:
    plt = _pyplot()
    runs = [load_latencies(p) for p in paths]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for label, ttfts, tpots in runs:
        a.plot(*_cdf(ttfts), label=f"{label} (n={len(ttfts)})", linewidth=1.4)
        b.plot(*_cdf(tpots), label=label, linewidth=1.4)
    a.set_xscale("log")
    a.set_xlabel("TTFT (ms, log scale)")
    b.set_xlabel("TPOT (ms)")
    for ax in (a, b):
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    a.set_title("Time to first token")
    b.set_title("Time per output token (excl. 1st)")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    try:
        save_figure(fig, out, dpi=110)
    finally:
        plt.close(fig)
