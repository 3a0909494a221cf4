"""A figure's file: its format named by the path's extension (PNG when it has
none), written whole or not at all (output_files.write_whole), so a full disk
or Ctrl-C never leaves a truncated image, and the path written is exactly the
one given (matplotlib alone would write `noext` to `noext.png`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from flightcheck.output_files import write_whole

from ..workload import WorkloadError

DEFAULT_FORMAT = "png"


def supported_formats() -> list[str]:
    from matplotlib.backend_bases import FigureCanvasBase

    return sorted(FigureCanvasBase.get_supported_filetypes())


def figure_format(path: str | Path) -> str:
    """The format `path` asks for; WorkloadError (one line, listing the
    supported extensions) for one matplotlib cannot write."""
    extension = os.path.splitext(str(path))[1][1:].lower()
    if extension in ("", DEFAULT_FORMAT):          # known without loading matplotlib
        return DEFAULT_FORMAT
    formats = supported_formats()
    if extension not in formats:
        raise WorkloadError(f"{path}: matplotlib cannot write .{extension} figures; give one of "
                            f"{', '.join('.' + f for f in formats)} (none: PNG)")
    return extension


def save_figure(fig: Any, path: str | Path, **kwargs: Any) -> None:
    """fig.savefig into `path`, whole or not at all."""
    fmt = figure_format(path)
    write_whole(str(path), lambda f: fig.savefig(f, format=fmt, **kwargs))
