"""Run a worker of this package (`replay_worker`, `cost_worker`) on a vLLM
whose version has no entry of its own in the engine tables: a developer's
build (`--vllm-python PATH`, an editable checkout reporting "0.34.1.dev5+g..."),
run with the loop of the nearest known release (replay.py `nearest_release`).

    python -m flightcheck.vllm.release_alias flightcheck.vllm.replay_worker

It imports the worker module as a module (so vLLM is imported with the
worker's own settings), adds the version to the engine tables under the
release's entries when it lacks one, and runs the worker's `main()`. A
known release passes through untouched. Runs inside the vLLM venv; imports
no vLLM itself.
"""

from __future__ import annotations

import importlib
import sys

from . import engine
from .replay import nearest_release


def alias_unreleased(version: str) -> str | None:
    """Give `version` the engine-table entries of its nearest known release
    (none added when it has its own); the release used, or None."""
    known = tuple(engine.ENGINE_LOOPS)
    if version in known:
        return version
    release = nearest_release(version, known)
    if release is None:
        return None
    for table in (engine.ENGINE_LOOPS, engine.ENGINE_GATES):
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
