"""`bmc` with its paths shared among processes: each process runs BMC on the
paths of one `Cube` (cubes.py), and the parts' results merge into one (a
property holds to the depth every part reached; a violation or target is
reported at the smallest depth any part found it)."""

from __future__ import annotations

import multiprocessing
import queue
import time
import traceback

from flightcheck.verification.models import Model
from flightcheck.verification.z3.bmc.cubes import Cube, split
from flightcheck.verification.z3.bmc.engine import BmcOptions, Progress, bmc
from flightcheck.verification.z3.results import EngineResult


def bmc_split(model: Model, max_depth: int, options: BmcOptions = BmcOptions(), jobs: int = 2,
              progress: Progress | None = None) -> EngineResult:
    """`bmc` with the paths shared among `jobs` processes (one `Cube` each),
    merged: a property holds to the depth every part completed; a violation
    or a reached target is the shallowest any part found. `progress` is called
    once every part has completed a depth, with their solver counts summed."""
    cubes = split(model, jobs)
    if len(cubes) == 1:
        return bmc(model, max_depth, options, progress=progress)
    started = time.perf_counter()
    context = multiprocessing.get_context("spawn")      # Z3 contexts do not survive a fork
    events = context.Queue()
    workers = [context.Process(target=_part, args=(part, model, max_depth, cube, options, events), daemon=True)
               for part, cube in enumerate(cubes)]
    for worker in workers:
        worker.start()
    try:
        results, finished_at = _collect(workers, events, started, progress)
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
            worker.join()
    result = _merge(model, [results[part] for part in range(len(cubes))], time.perf_counter() - started)
    for part, cube in enumerate(cubes):
        times = ", ".join(f"{depth}: {seconds:.1f}" for depth, seconds in sorted(finished_at[part].items()))
        result.notes.append(f"part {part} ({cube}) completed depths at seconds {{{times}}}")   # depth: seconds
    return result


def _collect(workers: list, events, started: float,
             progress: Progress | None) -> tuple[dict[int, EngineResult], dict[int, dict[int, float]]]:
    """The parts' results, as their events arrive: each part's result, and
    the second at which it completed each depth. A part's failure is raised
    here with its traceback; `progress` is told of each depth once every part
    has completed it."""
    num_parts = len(workers)
    counts_at: dict[int, dict[int, dict[str, int]]] = {part: {} for part in range(num_parts)}
    finished_at: dict[int, dict[int, float]] = {part: {} for part in range(num_parts)}
    results: dict[int, EngineResult] = {}
    reported = -1
    while len(results) < num_parts:
        try:
            kind, part, payload = events.get(timeout=5)
        except queue.Empty:
            dead = [j for j, worker in enumerate(workers) if not worker.is_alive() and j not in results]
            if dead and events.empty():
                raise RuntimeError(f"BMC part {dead[0]} died (exit code {workers[dead[0]].exitcode})")
            continue
        if kind == "error":
            raise RuntimeError(f"BMC part {part} failed:\n{payload}")
        if kind == "result":
            results[part] = payload
            continue
        depth, counts = payload
        counts_at[part][depth] = counts
        finished_at[part][depth] = time.perf_counter() - started
        while progress is not None and all(reported + 1 in by_depth for by_depth in counts_at.values()):
            reported += 1
            at_depth = [by_depth[reported] for by_depth in counts_at.values()]
            progress(reported, time.perf_counter() - started,
                     {key: sum(counts[key] for counts in at_depth) for key in at_depth[0]})
    return results, finished_at


def _part(part: int, model: Model, max_depth: int, cube: Cube, options: BmcOptions, events) -> None:
    """One process of `bmc_split`: its events are ("depth" | "result" | "error", part, payload)."""
    try:
        result = bmc(model, max_depth, options, cube=cube,
                     progress=lambda depth, _seconds, counts: events.put(("depth", part, (depth, counts))))
        events.put(("result", part, result))
    except Exception:       # noqa: BLE001 - the parent re-raises it with the traceback
        events.put(("error", part, traceback.format_exc()))


def _merge(model: Model, parts: list[EngineResult], seconds: float) -> EngineResult:
    """One result from the parts': each row from the part that found it
    shallowest, or else from the part that got least deep (an "unknown"
    there outweighs a "bounded" elsewhere at the same depth)."""
    completed = min(part.depth for part in parts)
    rows = []
    for first in parts[0].properties:
        mine = [part.by_name()[first.name] for part in parts]
        found = [row for row in mine if row.status in ("violated", "reached")]
        if found:
            row = min(found, key=lambda row: (row.depth, row.seconds))
            if completed < row.depth - 1:
                row.message = (f"found at depth {row.depth}; a part stopped at depth {completed}, "
                               "so a shorter one may exist")
        else:
            row = min(mine, key=lambda row: (row.depth, row.status != "unknown"))
        rows.append(row)
    return EngineResult(model.name, "bmc", seconds, completed, rows,
                        notes=[f"paths shared among {len(parts)} processes (z3.bmc.cubes.split)"])
