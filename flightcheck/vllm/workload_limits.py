"""How large a replay workload may be, and the checks that name a bad value
by its key path (`requests[3].prompt_len: must be at most 1048576, got
1000000000`), so that `flightcheck vllm replay` refuses it in one line (exit
code 2) before the vLLM worker starts.

The bounds are what a replay does in reasonable time and memory on a small
machine (docs/limits.md): the fabricated model draws every
prompt token in Python (0.3 s per million here, in the CLI and again in the
worker), vLLM's `BlockPool` and the reference's keep one object per KV
block (about 200 bytes, a few microseconds each), and every engine step is
a Python call into vLLM's scheduler.

Standard library only: the replay worker imports it in vLLM's venv.
"""

from __future__ import annotations

import json
from typing import Any

MAX_WORKLOAD_FILE_BYTES = 64 * 2**20    # a workload file, read whole
MAX_COUNT = 2**31 - 1                   # budgets, steps, token counts: vLLM's int32
MAX_PROMPT_LEN = 2**20                  # tokens of one prompt (and max_model_len, block_size)
MAX_WORKLOAD_TOKENS = 2**22             # prompt tokens of one workload in all: ~1.2 s to draw
MAX_NUM_BLOCKS = 2**20                  # KV pool: ~200 MB of Python objects in vLLM's pool
MAX_REQUESTS = 100_000                  # requests of one workload
MAX_STEPS = 10**6                       # engine steps of one replay (default 100,000)
MAX_STAGES = 1024                       # pipeline stages (the trace format's bound)
MAX_SPEC_TOKENS = 1024                  # drafts per request per step
MAX_SEED = 2**63 - 1
MAX_ID_CHARS = 1024                     # a request id or a prefix name
# Workloads of a fit or a campaign (--workloads): every one is built before the
# first runs, then replayed through vLLM (0.1 s to seconds each): 10,000 are hours.
MAX_WORKLOADS = 10_000

class LimitError(ValueError):
    """A value out of its type or range, with its key path in the message."""


def show(value: Any) -> str:
    """A short one-line rendering of a JSON value for a message."""
    if isinstance(value, dict):
        return f"an object with {len(value)} keys"
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**15:
        return f"an integer of {len(str(abs(value)))} digits"
    if isinstance(value, str):               # repr escapes control characters: one line
        return repr(value) if len(value) <= 40 else repr(value[:36]) + "..."
    return json.dumps(value)


def key(name: Any) -> str:
    """An object key as a path component: as it is when it is a plain name."""
    text = str(name)
    return text if text.isidentifier() and text.isascii() else show(text)


def whole(where: str, value: Any, low: int, high: int, why: str = "") -> int:
    """An integer in [low, high] (bool is not one); `why` the bound, for the message."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise LimitError(f"{where}: must be an integer, got {show(value)}")
    if value < low:
        raise LimitError(f"{where}: must be at least {low}, got {show(value)}")
    if value > high:
        reason = f" ({why})" if why else ""
        raise LimitError(f"{where}: must be at most {high}{reason}, got {show(value)}")
    return value


def share(where: str, value: Any) -> float:
    """A number from 0 to 1 (a probability or a usage)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
        raise LimitError(f"{where}: must be a number from 0 to 1, got {show(value)}")
    return float(value)


def flag(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise LimitError(f"{where}: must be true or false, got {show(value)}")
    return value


def name(where: str, value: Any) -> str:
    """A request id or a name: a string, or an integer (written as a string)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise LimitError(f"{where}: must be a string, got {show(value)}")
    text = str(value)
    if len(text) > MAX_ID_CHARS:
        raise LimitError(f"{where}: must be at most {MAX_ID_CHARS} characters, got {len(text)}")
    return text


def unknown_keys(where: str, unknown: set[Any]) -> str:
    """The message for keys a part of the workload does not have (five named)."""
    names = sorted(str(k) for k in unknown)
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    return f"{where} has unknown keys {', '.join(key(k) for k in names[:5])}{more}"
