"""Regenerate every table and picture of docs/walkthrough.md.

    python benchmarks/walkthrough.py            # writes docs/walkthrough/ and docs/figures/walkthrough-*

1. the vLLM engine test (two 12-token prompts, budget 10, K = 2) as a spec
   step table and as a simulated pipeline timeline, for both policies;
2. the #13637 prefix-caching hang as the counterexample the checker finds;
3. the fixed spec's results (exhaustive search) as the proof that then holds.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from flightcheck.bench.plots.timeline import draw_timeline
from flightcheck.bench.plots.trace_reader import read_timeline
from flightcheck.bench.simulation import SimConfig, simulate
from flightcheck.bench.workload import RequestSpec, Workload
from flightcheck.spec import (Arrive, CompleteOldest, Sample, describe, initial_state,
                              sampling_entries, schedule, step)
from flightcheck.verification.models import ENGINE_TEST

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "walkthrough"
FIGURES = ROOT / "docs" / "figures"


def engine_test_table(continue_prefill: bool) -> str:
    """The engine loop on the spec: schedule while there is room, else complete."""
    from dataclasses import replace
    cfg = replace(ENGINE_TEST.cfg, continue_prefill=continue_prefill)
    s = initial_state(2, cfg.num_blocks)
    for r, prompt in enumerate(ENGINE_TEST.prompts):
        s = step(s, cfg, Arrive(r, prompt))
    table = Table(title=f"vLLM engine test in the spec ({'continue-prefill' if continue_prefill else 'one-batch-per-request'})",
                  show_lines=True)
    for col in ("#", "action", "batch", "state after"):
        table.add_column(col)
    for i in range(1, 60):
        scheduled = schedule(s, cfg)
        if scheduled is not None:
            s = scheduled.state
            batch = ", ".join(f"r{e.req}:[{e.start}:{e.start + e.n})" + ("*" if e.samples else "")
                              for e in scheduled.entries)
            table.add_row(str(i), "schedule", Text(batch), Text(describe(s)))
        elif s.in_flight:
            action = CompleteOldest(tuple(Sample() for _ in sampling_entries(s, cfg)))
            s = step(s, cfg, action)
            table.add_row(str(i), "complete oldest", "", Text(describe(s)))
        else:
            break
    buf = io.StringIO()
    Console(file=buf, width=160).print(table)
    return buf.getvalue() + "\n* = the entry samples (final chunk or decode); r@start+n in Q are in-flight snapshots\n"


def engine_test_timeline(policy: str) -> Path:
    workload = Workload("engine-test", (RequestSpec("r0", 12, 5), RequestSpec("r1", 12, 5)))
    cfg = SimConfig(pp=2, max_num_batched_tokens=10, max_model_len=64, max_num_seqs=2,
                    num_blocks=64, policy=policy)
    trace = OUT / f"engine-test-{policy}.jsonl"
    simulate(workload, cfg, trace_path=str(trace))
    png = FIGURES / f"walkthrough-engine-test-{policy}.png"
    draw_timeline(read_timeline(trace), png, request="r0",
                  title=f"vLLM engine test, {policy}: two 12-token prompts, budget 10, PP = 2 (simulated L4)")
    return png


def hang_trace() -> str:
    """The run to the hang itself: the liveness check's trace for the mutant."""
    from flightcheck.verification.explicit import search as explicit
    from flightcheck.verification.traces.counterexample import from_actions, render
    from flightcheck.verification.models import mutant_model
    model = mutant_model("snapshot_omits_prefix_hit")
    result = explicit.search(model)
    v = next(v for v in result.violations if v.property == "L1_L3_every_request_can_finish")
    cx = from_actions(model, v.property, [a for a, _ in v.path], v.message)
    buf = io.StringIO()
    render(cx, Console(file=buf, width=160))
    return buf.getvalue()


def command_output(*args: str) -> str:
    p = subprocess.run([sys.executable, "-m", "flightcheck.cli", *args], capture_output=True, text=True,
                       env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"})
    return p.stdout + p.stderr


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    FIGURES.mkdir(parents=True, exist_ok=True)
    for cp, name in ((True, "continue-prefill"), (False, "one-batch-per-request")):
        (OUT / f"engine-test-steps-{name}.txt").write_text(engine_test_table(cp))
        print("wrote", engine_test_timeline(name))
    (OUT / "hang-counterexample.txt").write_text(
        command_output("verify", "--mutant", "snapshot_omits_prefix_hit"))
    (OUT / "hang-stuck-run.txt").write_text(hang_trace())
    (OUT / "proof.txt").write_text(command_output("verify", "--no-z3"))
    print("wrote", *sorted(p.name for p in OUT.iterdir()))


if __name__ == "__main__":
    main()
