"""The pipeline timeline as a PNG: stages top to bottom, time left to right,
one box per batch per stage. Inside a box, each prefill chunk is a band
coloured by its request, its height the chunk's share of the batch's tokens;
decodes share one grey band. Hatched gaps are idle stages (bubbles).

By default the window follows the request with the most prefill chunks, from
its first chunk's scheduling to its first token, so the picture shows what
the policy does to a long prompt: continue-prefill has two of its chunks in
different stages at once; one-batch-per-request sends the next chunk only
after the previous one has left the last stage.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..workload import WorkloadError
from .figure_file import save_figure
from .trace_reader import Span, TimelineData, most_chunked_request

HIGHLIGHT = "#d62728"
DECODE = "#c7c7c7"
PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
           "#ff7f0e", "#393b79", "#637939")


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise WorkloadError("drawing PNGs needs matplotlib (pip install matplotlib); "
                            "--perfetto output works without it") from None
    return plt


def default_window(data: TimelineData, request: str | None, margin: float = 0.25) -> tuple[float, float]:
    """From the request's first prefill chunk to the end of its last one."""
    spans_by_batch: dict[int, list[Span]] = {}
    for span in data.spans:
        spans_by_batch.setdefault(span.batch, []).append(span)
    chunks = data.chunks_of(request) if request else []
    batches = [b for b, _ in chunks if b in spans_by_batch]
    if not batches:
        t0 = min(s.t0 for s in data.spans)
        return t0, t0 + 2.0
    start = min(s.t0 for s in spans_by_batch[batches[0]])
    end = max(s.t1 for s in spans_by_batch[batches[-1]])
    pad = margin * (end - start) + 0.05
    first = min(s.t0 for s in data.spans)
    return max(start - pad, first - 0.02 * (end - start)), end + pad


def draw_timeline(data: TimelineData, path: str | Path, *, start: float | None = None,
                  end: float | None = None, request: str | None = None,
                  title: str | None = None) -> tuple[float, float]:
    """Write the PNG; returns the window drawn (seconds)."""
    plt = _pyplot()
    from matplotlib.patches import Patch, Rectangle

    request = request or most_chunked_request(data)
    if request is not None and request not in data.prompt_lens and not data.chunks_of(request):
        raise WorkloadError(f"request {request!r} is not in the trace")
    w0, w1 = default_window(data, request)
    w0 = start if start is not None else w0
    w1 = end if end is not None else w1
    colours: dict[str, str] = {}

    def colour(req: str) -> str:
        if req == request:
            return HIGHLIGHT
        if req not in colours:
            colours[req] = PALETTE[len(colours) % len(PALETTE)]
        return colours[req]

    k = data.num_stages
    fig, ax = plt.subplots(figsize=(13, 1.1 * k + 1.4))
    row_h = ROW_H
    for stage in range(k):
        y = k - 1 - stage                                  # stage 0 on top
        spans = sorted((s for s in data.spans if s.stage == stage and s.t1 > w0 and s.t0 < w1),
                       key=lambda s: s.t0)
        previous_end = w0
        for span in spans:
            if span.t0 - previous_end > 1e-4:              # idle: a bubble
                ax.add_patch(Rectangle((previous_end, y - row_h / 2), span.t0 - previous_end,
                                       row_h, facecolor="none", edgecolor="#bbbbbb",
                                       hatch="///", linewidth=0))
            previous_end = max(previous_end, span.t1)
            _draw_batch(ax, data, span, y, colour, request)
        if w1 - previous_end > 1e-4:
            ax.add_patch(Rectangle((previous_end, y - row_h / 2), w1 - previous_end, row_h,
                                   facecolor="none", edgecolor="#bbbbbb", hatch="///", linewidth=0))
    ax.set_xlim(w0, w1)
    ax.set_ylim(-0.6, k - 0.4)
    ax.set_yticks(range(k), [f"stage {k - 1 - y}" for y in range(k)])
    ax.set_xlabel("time (s)")
    ax.set_title(title or f"{data.policy or 'pipeline'}: request {request} "
                 f"({data.prompt_lens.get(request, '?')}-token prompt) highlighted")
    handles = [Patch(facecolor=HIGHLIGHT, label=f"{request} prefill chunk"),
               Patch(facecolor=PALETTE[0], label="other prefill chunks"),
               Patch(facecolor=DECODE, label="decodes"),
               Patch(facecolor="none", edgecolor="#999999", hatch="///", label="idle (bubble)")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=4,
              frameon=False)
    fig.tight_layout()
    try:
        save_figure(fig, path, dpi=110)
    finally:
        plt.close(fig)
    return w0, w1


# A stage's row height on the plot's y axis (rows are 1 apart).
ROW_H = 0.8


def _draw_batch(ax, data: TimelineData, span: Span, y: float, colour: Callable[[str], str],
                request: str | None) -> None:
    """One batch on one stage, from `span.t0` to `span.t1` on the row at `y`:
    a band per prefill chunk (the request's labelled), one for its decodes."""
    from matplotlib.patches import Rectangle

    row_h = ROW_H
    entries = data.batches.get(span.batch, [])
    total = sum(e.n for e in entries) or 1
    width = span.t1 - span.t0
    bottom = y - row_h / 2
    decode_tokens = sum(e.n for e in entries if not e.prefill)
    bands = [(e.n, colour(e.req), e) for e in entries if e.prefill]
    if decode_tokens:
        bands.append((decode_tokens, DECODE, None))
    # Decodes are a token each; give every band a visible minimum height.
    heights = [max(n / total, 0.12) for n, _, _ in bands]
    scale = row_h / sum(heights) if heights else 0
    for (n, face, entry), h in zip(bands, heights):
        ax.add_patch(Rectangle((span.t0, bottom), width, h * scale, facecolor=face,
                               edgecolor="white", linewidth=0.3))
        if entry is not None and entry.req == request:
            ax.text(span.t0 + width / 2, bottom + h * scale / 2,
                    f"{entry.req}\n[{entry.start}:{entry.start + entry.n})", ha="center",
                    va="center", fontsize=7, color="white")
        bottom += h * scale
    ax.add_patch(Rectangle((span.t0, y - row_h / 2), width, row_h, facecolor="none",
                           edgecolor="black", linewidth=0.6))
    ax.text(span.t0 + width / 2, y + row_h / 2 + 0.02, str(span.batch), ha="center",
            va="bottom", fontsize=6, color="#444444")
