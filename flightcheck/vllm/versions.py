"""The vLLM releases the bridge supports, in one table: per release the
spec and reference profile that models it, the profile under async
scheduling (where the release has an `AsyncScheduler` the replay drives),
whose engine loop the replay copies (engine.py), whether that loop gates
`schedule()` on unscheduled requests (0.8.4), and the pins file
`scripts/build-vllm-venv.sh` installs the import chain from.

Everything that depends on the release reads it here: the CLI's
`--vllm-version` choices and its `--async` check, the campaign's profiles
(`reference_run.profile_for`), the replay worker's engine, the
differential's deviations per release, the venv build script (which runs
this file: `python3 flightcheck/vllm/versions.py pins VERSION`). What a
release's *objects* look like (which attribute holds what) is compat.py's.

Standard library only; runnable as a script without flightcheck installed.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Release:
    version: str
    profile: str                          # the spec and reference profile (sync scheduling)
    async_profile: str | None             # ... under async scheduling; None: no AsyncScheduler driven
    # Whose `EngineCore.step_with_batch_queue` the replay runs (engine.py):
    # "0.8" (0.8.x), "0.33" (empty batches queued, aborts queue),
    # "0.34" (0.33's, plus inputs handled while a batch's output is awaited).
    engine_loop: str
    # 0.8.4's engine calls schedule() only while get_num_unscheduled_requests() > 0.
    gates_on_unscheduled: bool
    pins: str                             # file in flightcheck/vllm/pins/

    @property
    def has_async_scheduler(self) -> bool:
        return self.async_profile is not None

    @property
    def has_kv_connector_api(self) -> bool:
        """Whether the replay drives a KV connector here (kv_connector.py):
        the V1 connector API with async loads, failures and sends, read in
        0.33.0 and 0.34.0 (docs/kv-connector.md); 0.8.x has none of those."""
        return self.engine_loop in ("0.33", "0.34")


RELEASES: dict[str, Release] = {release.version: release for release in (
    Release("0.8.5", "vllm-0.8.5", None, "0.8", False, "vllm-0.8-cpu.txt"),
    Release("0.8.4", "vllm-0.8.4", None, "0.8", True, "vllm-0.8-cpu.txt"),
    Release("0.33.0", "vllm-0.33", "vllm-0.33-async", "0.33", False, "vllm-0.33-0.34-cpu.txt"),
    Release("0.34.0", "vllm-0.34", "vllm-0.34-async", "0.34", False, "vllm-0.33-0.34-cpu.txt"),
)}
SUPPORTED_VERSIONS: tuple[str, ...] = tuple(RELEASES)
DEFAULT_VERSION = "0.8.5"
# Engine loops that queue empty batches and keep an aborts queue (0.33's
# `step_with_batch_queue` and its descendants).
BATCH_QUEUE_V033_LOOPS = frozenset({"0.33", "0.34"})


class UnknownRelease(ValueError):
    """A version the table does not list (one line, for the CLI)."""


def release(version: str) -> Release:
    """The table's row for `version` (a local suffix, `+g1234`, is ignored)."""
    found = RELEASES.get(version.split("+", 1)[0])
    if found is None:
        raise UnknownRelease(f"vLLM {version} is not a supported release (supported: {', '.join(SUPPORTED_VERSIONS)})")
    return found


def _number(version: str) -> tuple[int, ...]:
    """0.34.0, 0.35.0.dev12+g1a2b, 0.8.5.post1 -> (0, 34, 0), (0, 35, 0), (0, 8, 5)."""
    parts = []
    for part in version.split("+", 1)[0].split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def nearest_release(version: str) -> Release:
    """The release whose engine loop a vLLM of `version` runs: its own row,
    else the newest listed release not newer than it (a developer's branch
    of 0.34 runs 0.34's loop); UnknownRelease if it predates them all."""
    try:
        return release(version)
    except UnknownRelease:
        pass
    number = _number(version)
    older = [r for r in RELEASES.values() if _number(r.version) <= number]
    if not number or not older:
        raise UnknownRelease(f"vLLM {version} predates every supported release "
                             f"({', '.join(SUPPORTED_VERSIONS)}): no engine loop to run it with")
    return max(older, key=lambda r: _number(r.version))


def release_of_profile(profile: str) -> Release | None:
    """The release a spec and reference profile models (sync or async), if any."""
    return next((r for r in RELEASES.values() if profile in (r.profile, r.async_profile)), None)


def async_versions() -> tuple[str, ...]:
    """The releases whose AsyncScheduler the replay drives (`--async`)."""
    return tuple(r.version for r in RELEASES.values() if r.has_async_scheduler)


def kv_connector_versions() -> tuple[str, ...]:
    """The releases the replay drives a fabricated KV connector on (`--kv-connector`)."""
    return tuple(r.version for r in RELEASES.values() if r.has_kv_connector_api)


def main(argv: list[str]) -> int:
    """`versions.py pins VERSION`: the pins file's name (for the build script);
    `versions.py list`: the supported versions. Exit 2 on an unknown one."""
    if len(argv) == 2 and argv[0] == "pins":
        try:
            print(release(argv[1]).pins)
        except UnknownRelease as err:
            print(err, file=sys.stderr)
            return 2
        return 0
    if argv == ["list"]:
        print(" ".join(SUPPORTED_VERSIONS))
        return 0
    print("usage: versions.py pins VERSION | list", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
