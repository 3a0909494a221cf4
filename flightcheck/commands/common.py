"""Shared helpers for the subcommands."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Callable

from flightcheck.reference.profiles import DEFAULT_PROFILE as DEFAULT_REFERENCE_PROFILE
from flightcheck.reference.profiles import PROFILES as _REFERENCE_PROFILES


class Parser(argparse.ArgumentParser):
    """argparse, with errors as one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"flightcheck: error: {message}\n")
        sys.exit(2)


# The vLLM versions the reference scheduler follows (`--profile` of run,
# simulate and bench), read from its profiles so a new one is offered at once.
REFERENCE_PROFILES: tuple[str, ...] = tuple(_REFERENCE_PROFILES)

MAX_INT = 2**31 - 1              # counts and sizes: vLLM holds them in int32
MAX_SEED = 2**32 - 1             # torch, numpy and Python all take seeds this large
# run, simulate and bench hold every prompt, its tokens and its metrics in
# memory: simulate's 10,000 BurstGPT-like prompts take 43 s and 0.45 GB on
# the project's 2-core VM, 100,000 take 9.5 min and 3.2 GB (docs/limits.md)
MAX_PROMPTS = 100_000
MAX_MODEL_LEN = 2**24            # tokens per request and per block: a trace's own bound (check-trace)
PP_PER_CORE = 4                  # local stage processes per core before --force is needed

# What a command may plan to fill of this machine's physical memory, and what
# the reference scheduler keeps per KV block (a KVCacheBlock and its entry in
# the free queue: 190 bytes measured, rounded up).
MEMORY_SHARE = 0.5
SCHEDULER_BYTES_PER_BLOCK = 256
# ... and builds them one by one, ~6 us each on that VM: 4 Mi blocks take
# ~25 s before the first step (vLLM's own pools are under 1 Mi blocks; the
# simulator's default for a 1B model on 16 H200s, block size 16, is 3.8 Mi).
MAX_POOL_BLOCKS = 2**22
UNKNOWN_MEMORY = 8 * 2**30       # where the OS does not say: assume a small machine


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high], refused in one line otherwise."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {_short(text)}")
        if value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high}, got {_short(text)}")
        return value
    return parse


def positive_int(text: str) -> int:
    """An integer from 1 to 2**31 - 1."""
    return int_in(1, MAX_INT)(text)


def count_int(text: str) -> int:
    """An integer from 0 to 2**31 - 1."""
    return int_in(0, MAX_INT)(text)


def seed_int(text: str) -> int:
    """A seed every generator takes: an integer from 0 to 2**32 - 1."""
    return int_in(0, MAX_SEED)(text)


def real(low: float | None = None, high: float | None = None, *, low_open: bool = False,
         high_open: bool = False, allow_inf: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number (or +inf where `allow_inf`) in the
    given interval; NaN is never accepted."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {_short(text)}") from None
        if math.isnan(value) or (math.isinf(value) and not (allow_inf and value > 0)):
            raise argparse.ArgumentTypeError(f"must be a finite number{' or inf' if allow_inf else ''}, "
                                             f"got {_short(text)}")
        too_low = low is not None and (value <= low if low_open else value < low)
        too_high = high is not None and (value >= high if high_open else value > high)
        if (too_low or too_high) and low == 0 and low_open and high is None:
            raise argparse.ArgumentTypeError(f"must be positive{' (or inf)' if allow_inf else ''}, "
                                             f"got {_short(text)}")
        if too_low or too_high:
            left = "(" if low_open else "["
            right = ")" if high_open else "]"
            lower = "-inf" if low is None else f"{low:g}"
            upper = "inf" if high is None else f"{high:g}"
            interval = f"{left}{lower}, {upper}{right}"
            raise argparse.ArgumentTypeError(f"must be in {interval}, got {_short(text)}")
        return value
    return parse


def physical_memory() -> int:
    """This machine's physical memory in bytes (SC_PHYS_PAGES x SC_PAGE_SIZE)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return UNKNOWN_MEMORY


def memory_budget() -> int:
    """The bytes a command may plan to allocate: MEMORY_SHARE of physical memory."""
    return int(physical_memory() * MEMORY_SHARE)


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB"


def max_pool_blocks() -> int:
    """The largest KV pool the reference scheduler may keep: MAX_POOL_BLOCKS,
    or fewer where its per-block bookkeeping would not fit the memory budget."""
    return min(MAX_POOL_BLOCKS, memory_budget() // SCHEDULER_BYTES_PER_BLOCK)


def pool_blocks(text: str) -> int:
    """An argparse type for --num-blocks: from 1 to max_pool_blocks(), the
    refusal saying why."""
    value = positive_int(text)
    limit = max_pool_blocks()
    if value > limit:
        raise argparse.ArgumentTypeError(
            f"must be at most {limit} on this machine, got {_short(text)} (the scheduler builds an "
            f"object of {SCHEDULER_BYTES_PER_BLOCK} bytes per block: at most {MAX_POOL_BLOCKS}, and at "
            f"most {MEMORY_SHARE:.0%} of this machine's {gib(physical_memory())} of memory)")
    return value


DTYPE_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}


def kv_cache_problem(num_blocks: int, block_size: int, model: object, dtype: str) -> str | None:
    """Refuse a runtime KV cache larger than the memory budget, before any
    stage allocates it. The stages together hold, for every layer, a K and a
    V pool of num_blocks x block_size token slots of n_kv_heads x head_dim.
    `model` is a runtime ModelConfig (n_layers, n_kv_heads, head_dim)."""
    per_slot = model.n_layers * model.n_kv_heads * model.head_dim * 2 * DTYPE_BYTES[dtype]  # type: ignore[attr-defined]
    need = num_blocks * block_size * per_slot
    if need <= memory_budget():
        return None
    most = memory_budget() // (block_size * per_slot)
    return (f"--num-blocks {num_blocks} x --block-size {block_size}: the KV cache would take {gib(need)} "
            f"({per_slot} bytes per token slot), more than {MEMORY_SHARE:.0%} of this machine's "
            f"{gib(physical_memory())} of memory; at most {most} blocks of {block_size} fit")


def _short(text: str) -> str:
    return repr(text) if len(text) <= 24 else repr(text[:20] + "...")


def check_writable(path: str | None, flag: str) -> str | None:
    """Why `path` cannot be written (None if it can), changing nothing there:
    outputs.py's checks of one output (a directory, a device, no room, a FIFO
    with no reader are refused)."""
    from .outputs import Output, OutputRefused, claim

    if path is None:
        return None
    try:
        claim([Output(flag, path)]).release()
    except OutputRefused as err:
        return str(err)
    return None


def local_pp_problem(pp: int, force: bool) -> str | None:
    """Refuse more local stage processes than the machine can run, unless forced."""
    cores = os.cpu_count() or 1
    if pp > PP_PER_CORE * cores and not force:
        return (f"--pp {pp} would start {pp} stage processes on {cores} cores; at most "
                f"{PP_PER_CORE * cores} ({PP_PER_CORE} per core) without --force")
    return None


NO_CUDA = "--device cuda: no CUDA device on this machine (use --device cpu)"


def cuda_problem(device: str) -> str | None:
    """Refuse --device cuda on a machine without a CUDA device. Without a GPU
    driver (or with every device hidden) that is known at once; otherwise ask
    torch, through the runtime that owns it (the import rules keep it there),
    which takes the second or more that loading torch does."""
    if device != "cuda":
        return None
    if not _gpu_driver_present() or os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1"):
        return NO_CUDA
    from flightcheck.runtime import launch

    return None if launch.torch.cuda.is_available() else NO_CUDA


def _gpu_driver_present() -> bool:
    """An NVIDIA driver's device nodes, or ROCm's (whose torch answers to "cuda" too)."""
    return (any(Path("/dev").glob("nvidia[0-9]*")) or Path("/proc/driver/nvidia").exists()
            or Path("/dev/kfd").exists())


def bad(message: str) -> int:
    """Report a bad argument found after parsing; exit code 2."""
    sys.stderr.write(f"flightcheck: error: {message}\n")
    return 2


# The optional packages a command may need, with how to get each: torch and
# safetensors come with the runtime extra (torch's CPU build first, so pip
# does not pull a CUDA build onto a machine without a GPU), transformers with
# the test extra.
INSTALL_TORCH = "pip install torch==2.13.0 (the CPU build), then pip install -e '.[runtime]'"
OPTIONAL_PACKAGES: dict[str, str] = {
    "torch": INSTALL_TORCH,
    "safetensors": "pip install -e '.[runtime]'",
    "transformers": "pip install -e '.[test]'",
}


def missing_dependency(err: ModuleNotFoundError, command: str) -> str | None:
    """One line naming the optional package `command` needs and how to
    install it, when `err` says that package is missing; None for any other
    missing module (a bug of ours: its traceback is shown as it is)."""
    import importlib.util

    package = (err.name or "").split(".")[0]
    if package not in OPTIONAL_PACKAGES:
        return None
    try:
        present = importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        present = False
    if present and err.name != package:
        return None                      # the package is there; a part of it is not
    return (f"flightcheck {command} needs {package}, which is not installed; "
            f"install it with: {OPTIONAL_PACKAGES[package]}")


INTERNAL_ERROR = 3


CRASH_REPORTS_KEPT = 20


def crash_directory() -> Path:
    """Where exit 3 saves its tracebacks: one folder per user, the newest
    CRASH_REPORTS_KEPT kept, so crashes never pile up in the temporary folder."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "flightcheck" / "crashes"


def internal_error(err: BaseException, command: str) -> tuple[str, int]:
    """Report an exception flightcheck did not expect: a bug of ours, not a
    verdict and not bad input. The traceback goes to a file (crash_directory)
    so the terminal gets one line; returns (that line, exit code 3). An
    OSError from a standard output that cannot be written is no bug: one
    line and exit code 2."""
    from . import interrupts

    if isinstance(err, OSError) and interrupts.stdout_is_broken():
        message = interrupts.flush_stdout() or interrupts.stdout_problem(err)   # said once, then silenced
        sys.stderr.write(f"flightcheck: error: {message}\n")
        return message, 2
    where = _save_traceback(err, command)
    summary = ascii(str(err))[1:-1][:200]
    message = (f"internal error in flightcheck {command} (a bug in flightcheck, not a verdict on the "
               f"input): {type(err).__name__}: {summary}; {where}")
    sys.stderr.write(f"flightcheck: {message}\n")
    return message, INTERNAL_ERROR


def _save_traceback(err: BaseException, command: str) -> str:
    """Save `err`'s traceback in crash_directory (oldest beyond the kept
    number removed); where it went, as the message says it."""
    import tempfile
    import traceback

    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    folder = crash_directory()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, prefix=f"{command}-", suffix=".txt",
                                         delete=False, encoding="utf-8", errors="backslashreplace") as out:
            out.write(text)
    except OSError as save_error:
        return f"and the traceback could not be saved in {folder} ({save_error.strerror})"
    reports = sorted(folder.glob("*.txt"), key=_modified)
    for old in reports[:-CRASH_REPORTS_KEPT]:
        old.unlink(missing_ok=True)
    return f"traceback saved to {out.name}"


def _modified(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:                       # removed meanwhile by another flightcheck
        return 0.0
