"""Run a worker of this package (`replay_worker`, `cost_worker`) on a vLLM
whose version has no entry of its own in the engine tables: a developer's
build (`--vllm-python PATH`, an editable checkout reporting "0.34.1.dev5+g..."),
run with the loop of the nearest known release (replay.py `nearest_release`).

    python -m flightcheck.vllm.release_alias flightcheck.vllm.replay_worker

It imports the worker module as a module (so vLLM is imported with the
worker's own settings), adds the version to the engine tables under the
release's entries when it lacks one, and runs the worker's `main()`. A
known release passes through untouched, and so does every version where the
worker places an unreleased version itself (a bridge with one release table
and no per-version engine tables). Runs inside the vLLM venv; imports
no vLLM itself.
"""

from __future__ import annotations

import importlib
import sys

from . import engine
from .replay import nearest_release


def alias_unreleased(version: str) -> str | None:
    """Give `version` the engine-table entries of its nearest known release
    (none added when it has its own); the release used, or None. Where the
    engine keeps no per-version tables (a bridge whose worker places an
    unreleased version itself), nothing is added."""
    tables = [getattr(engine, name) for name in ("ENGINE_LOOPS", "ENGINE_GATES") if hasattr(engine, name)]
    if not tables:
        return None
    known = tuple(tables[0])
    if version in known:
        return version
    release = nearest_release(version, known)
    if release is None:
        return None
    for table in tables:
        if release in table:
            table.setdefault(version, table[release])
    return release


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m flightcheck.vllm.release_alias WORKER_MODULE", file=sys.stderr)
        return 2
    worker = importlib.import_module(argv[0])
    alias_unreleased(worker.vllm.__version__)
    return int(worker.main())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
