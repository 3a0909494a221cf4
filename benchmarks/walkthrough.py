"""Regenerate every table, picture and code excerpt of docs/walkthrough.md.

    python benchmarks/walkthrough.py                  # rewrites them in place
    python benchmarks/walkthrough.py --into DIR       # writes them under DIR instead (same layout)
    python benchmarks/walkthrough.py --without-proof  # skips proof.txt (`flightcheck verify --no-z3`, the slow part)

What it writes (paths relative to the repository, or to DIR):

1. the state machine, derived from the spec by exhaustive search of a small
   model: every change of a request's status and of a batch entry's fate
   that some step makes, with the action that makes it
   (docs/walkthrough/state-machine.txt, drawn as
   docs/figures/walkthrough-state-machine.png);
2. the spec's rule of the PR as code, cut out of spec/ (the generated block
   `spec-rule` of docs/walkthrough.md);
3. the vLLM engine test (two 12-token prompts, budget 10, K = 2) as a spec
   step table and as a simulated pipeline timeline, for both policies;
4. the gentlest counterexample (mutant `advance_at_completion`) and the
   prefix-caching hang (`snapshot_omits_prefix_hit`) as the checker finds them;
5. the fixed spec's results (exhaustive search) as the proof that then holds.

Timings are left out of the command outputs, so that regenerating changes
nothing (tests/test_walkthrough_outputs.py checks it).
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import subprocess
import sys
from collections import deque
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from flightcheck.bench.plots.timeline import draw_timeline
from flightcheck.bench.plots.trace_reader import read_timeline
from flightcheck.bench.simulation import SimConfig, simulate
from flightcheck.bench.workload import RequestSpec, Workload
from flightcheck.spec import (Abort, Arrive, ArriveAs, CompleteOldest, FailKvLoad, ReceiveKv, Sample, Schedule, SendKv, State,
                              describe, initial_state, sampling_entries, schedule, step)
from flightcheck.verification.explicit.search import initial, successors
from flightcheck.verification.grammar_models import GRAMMAR_K2
from flightcheck.verification.kv_models import KV_LOAD_ERROR_K2, KV_LOAD_FAIL_K2
from flightcheck.verification.session_models import SESSION_K2
from flightcheck.verification.models import ENGINE_TEST, MODELS, Model

ROOT = Path(__file__).resolve().parent.parent
WALKTHROUGH_MD = Path("docs/walkthrough.md")
OUT = Path("docs/walkthrough")
FIGURES = Path("docs/figures")
STATE_MACHINE_MODEL = "tight-k2"     # two requests, K = 2, three blocks; stops and aborts allowed
WIDTH = 160

# -- 1. the state machine, derived from the spec --------------------------------

SCHEDULED, RETURNED = "(scheduled)", "(output returned)"


def action_name(action) -> str:
    if isinstance(action, (Arrive, ArriveAs)):
        return "arrive"
    if isinstance(action, CompleteOldest):
        return "complete_oldest"
    if isinstance(action, Abort):
        return "abort"
    if isinstance(action, ReceiveKv):
        return "receive_kv"
    if isinstance(action, FailKvLoad):
        return "fail_kv_load"
    if isinstance(action, SendKv):
        return "send_kv"
    if not isinstance(action, Schedule):       # a session's input, a grammar's event: their own names
        return _snake(type(action).__name__)
    return "schedule"


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _entry_edges(before: State, after: State, name: str) -> set[tuple[str, str, str]]:
    """How one step changes the fates of the batch entries in flight: a new
    batch's entries appear, the oldest batch's return, the others may age."""
    edges = set()
    unchanged = before.in_flight
    if name == "complete_oldest":
        edges |= {(e.fate.name, RETURNED, name) for e in before.in_flight[0]}
        unchanged = before.in_flight[1:]
    for old, new in zip(unchanged, after.in_flight):
        edges |= {(a.fate.name, b.fate.name, name) for a, b in zip(old, new) if a.fate != b.fate}
    if name == "schedule" and len(after.in_flight) > len(unchanged):
        edges |= {(SCHEDULED, e.fate.name, name) for e in after.in_flight[-1]}
    return edges


def state_machine(model: Model) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]], int]:
    """Every (status before, status after, action) a request's status takes,
    and every (fate before, fate after, action) a batch entry's fate takes, on
    some step of the model's reachable state graph; and its number of states."""
    statuses, fates = set(), set()
    start = initial(model)
    seen, queue = {start}, deque([start])
    while queue:
        state = queue.popleft()
        for action, nxt in successors(model, state):
            name = action_name(action)
            statuses |= {(a.status.name, b.status.name, name)
                         for a, b in zip(state.requests, nxt.requests) if a.status != b.status}
            fates |= _entry_edges(state, nxt, name)
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return sorted(statuses), sorted(fates), len(seen)


def state_machine_text(model: Model) -> tuple[str, list, list]:
    statuses, fates, num_states = state_machine(model)
    lines = [f"# Derived from the spec by exhaustive search of model {model.name} "
             f"({num_states} states, profile {model.cfg.profile}): every change some step makes.",
             "# request status: before -> after (action)"]
    lines += [f"{a} -> {b} ({n})" for a, b, n in statuses]
    lines.append("# batch entry fate: before -> after (action)")
    lines += [f"{a} -> {b} ({n})" for a, b, n in fates]
    return "\n".join(lines) + "\n", statuses, fates


# The KV connector's models (docs/kv-connector.md): the edges a connector
# adds, listed in the text only (the picture draws the spec without one).
CONNECTOR_MODELS = (KV_LOAD_FAIL_K2, KV_LOAD_ERROR_K2)


def more_state_machine_text(title: str, models: tuple, base_statuses: list, base_fates: list) -> str:
    """The changes the models of a feature add to the base machine's, under `title`."""
    statuses, fates, counts = set(), set(), []
    for model in models:
        more_statuses, more_fates, num_states = state_machine(model)
        statuses |= set(more_statuses) - set(base_statuses)
        fates |= set(more_fates) - set(base_fates)
        counts.append(f"{model.name} ({num_states} states, profile {model.cfg.profile})")
    lines = [f"# {title}, by exhaustive search of {' and '.join(counts)}: the changes it adds.",
             "# request status: before -> after (action)"]
    lines += [f"{a} -> {b} ({n})" for a, b, n in sorted(statuses)]
    lines.append("# batch entry fate: before -> after (action)")
    lines += [f"{a} -> {b} ({n})" for a, b, n in sorted(fates)]
    return "\n".join(lines) + "\n"


def connector_state_machine_text(base_statuses: list, base_fates: list) -> str:
    return more_state_machine_text("With a KV connector", CONNECTOR_MODELS, base_statuses, base_fates)


def request_states_text(base_statuses: list, base_fates: list) -> str:
    """Streaming sessions' and structured output's changes (docs/request-states.md)."""
    return (more_state_machine_text("With streaming sessions", (SESSION_K2,), base_statuses, base_fates)
            + more_state_machine_text("With structured output", (GRAMMAR_K2,), base_statuses, base_fates))


# Where each node sits in the picture (layout only: which edges exist is derived).
STATUS_AT = {"NEW": (0.0, 1.4), "WAITING": (1.5, 1.4), "RUNNING": (3.4, 2.4), "PREEMPTED": (3.4, 0.2),
             "FINISHED_STOPPED": (6.0, 2.4), "FINISHED_LENGTH": (6.0, 0.2), "FINISHED_ABORTED": (1.5, -0.9)}
FATE_AT = {SCHEDULED: (0.0, 0.0), "LIVE": (1.8, 0.0), "ORPHANED": (3.9, 2.9), "SUPERSEDED": (6.0, 0.0),
           RETURNED: (3.9, 1.0)}
WHAT_RETURNS = {"LIVE": "tokens applied", "ORPHANED": "tokens appended,\nnum_computed untouched",
                "SUPERSEDED": "tokens dropped"}
BEND = {("LIVE", "SUPERSEDED"): 0.25}
LABEL_AT = {("ORPHANED", "SUPERSEDED"): 0.65, ("PREEMPTED", "FINISHED_STOPPED"): 0.75,
            ("RUNNING", "FINISHED_LENGTH"): 0.75}      # where along its edge a label sits, where the default crowds


def _grouped(edges) -> dict[tuple[str, str], str]:
    labels: dict[tuple[str, str], list[str]] = {}
    for a, b, name in edges:
        labels.setdefault((a, b), []).append(name)
    return {k: " / ".join(v) for k, v in labels.items()}


def _draw_nodes(ax, at: dict) -> dict:
    boxes = {}
    for node, (x, y) in at.items():
        final = node.startswith("FINISHED") or node == RETURNED
        boxes[node] = ax.text(x, y, node.replace("_", "_\n", 1) if node.startswith("FINISHED") else node,
                              fontsize=8.5, ha="center", va="center", fontweight="bold", zorder=3,
                              bbox=dict(boxstyle="round,pad=0.4", fc="#e8e8e8" if final else "#dbe9f6",
                                        ec="#555555"))
    return boxes


def _draw_graph(ax, edges, at: dict, title: str, notes: dict | None = None) -> None:
    from matplotlib.patches import FancyArrowPatch
    missing = {n for a, b, _ in edges for n in (a, b)} - set(at)
    if missing:
        raise SystemExit(f"walkthrough: the spec has states the picture does not place: {sorted(missing)}")
    ax.set_xlim(-0.8, 6.9)
    ax.set_ylim(-1.5, 3.8)
    ax.axis("off")
    ax.set_title(title, fontsize=10)
    boxes = _draw_nodes(ax, at)
    ax.figure.canvas.draw()                      # place the boxes, so arrows can stop at their edges
    grouped = _grouped(edges)
    for (a, b), label in grouped.items():
        rad = BEND.get((a, b), 0.2 if (b, a) in grouped else 0.0)
        ax.add_patch(FancyArrowPatch(at[a], at[b], connectionstyle=f"arc3,rad={rad}", arrowstyle="-|>",
                                     mutation_scale=13, patchA=boxes[a].get_bbox_patch(),
                                     patchB=boxes[b].get_bbox_patch(), shrinkA=2, shrinkB=2,
                                     color="#444444", linewidth=1.1, zorder=1))
        (x0, y0), (x1, y1) = at[a], at[b]
        cx, cy = (x0 + x1) / 2 + rad * (y1 - y0), (y0 + y1) / 2 - rad * (x1 - x0)   # arc3's control point
        crowded = (b, a) in grouped or (abs(x1 - x0) > 1 and abs(y1 - y0) > 1)
        t = LABEL_AT.get((a, b), 0.3 if crowded else 0.5)     # a diagonal's or a pair's label near its start
        mx = (1 - t) ** 2 * x0 + 2 * t * (1 - t) * cx + t ** 2 * x1
        my = (1 - t) ** 2 * y0 + 2 * t * (1 - t) * cy + t ** 2 * y1
        if notes and a in notes and b == RETURNED:
            label += "\n(" + notes[a] + ")"
        ax.text(mx, my, label, fontsize=7.5, ha="center", va="center", color="#1f4e79", zorder=2,
                bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.9))


def draw_state_machine(statuses, fates, png: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.6))
    _draw_graph(left, statuses, STATUS_AT, "A request's status (spec/state.py Status)")
    returned = {a: WHAT_RETURNS[a] for a, b, _ in fates if b == RETURNED}
    _draw_graph(right, fates, FATE_AT, "A batch entry's fate while in flight (spec/state.py Fate)", returned)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110, metadata={"Software": None})     # no version stamp: same bytes every run
    plt.close(fig)


# -- 2. the spec's rule, cut out of spec/ -----------------------------------------

def function_source(path: Path, name: str) -> str:
    """The source of function (or `Class.method`) `name` in `path`, dedented."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    owner, _, func = name.rpartition(".")
    scope = tree.body
    if owner:
        scope = next(n.body for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner)
    node = next((n for n in scope if isinstance(n, ast.FunctionDef) and n.name == func), None)
    if node is None:
        raise SystemExit(f"walkthrough: {path} has no function {name}; update SPEC_RULE")
    lines = text.splitlines()[node.lineno - 1:node.end_lineno]
    indent = len(lines[0]) - len(lines[0].lstrip())
    return "\n".join(line[indent:] for line in lines)


def lines_between(path: Path, first: str, last: str) -> str:
    """The lines of `path` from the one containing `first` to the next one
    containing `last`, dedented (the excerpt fails loudly when they move)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    try:
        i = next(k for k, line in enumerate(lines) if first in line)
        j = next(k for k in range(i, len(lines)) if last in lines[k])
    except StopIteration:
        raise SystemExit(f"walkthrough: {path} no longer has {first!r} ... {last!r}; update SPEC_RULE")
    indent = min(len(line) - len(line.lstrip()) for line in lines[i:j + 1] if line.strip())
    return "\n".join(line[indent:] for line in lines[i:j + 1])


def spec_rule(root: Path) -> str:
    """The PR's rule, as the spec states it: what a running request may still
    schedule, the skip when that is nothing, which entry samples, and the
    counter advanced at schedule time."""
    state_py, schedule_py = root / "spec" / "state.py", root / "spec" / "schedule.py"
    parts = [
        ("spec/state.py, State", function_source(state_py, "State.num_new_tokens")),
        ("spec/schedule.py, _schedule_running", lines_between(schedule_py, "num_new = _num_new_running(step, r)",
                                                              "continue")),
        ("spec/schedule.py, _add_entry", lines_between(schedule_py, "known = req.num_tokens + req.placeholders",
                                                       "samples = ")),
        ("spec/schedule.py", function_source(schedule_py, "_advance_counter")),
    ]
    return "\n\n".join(f"# {where}\n{code}" for where, code in parts)


def fill_block(markdown: str, name: str, body: str, fence: str = "") -> str:
    """Replace the generated block `name` of `markdown` with `body`."""
    pattern = re.compile(rf"(<!-- generated: {name} -->\n).*?(<!-- end generated: {name} -->)", re.DOTALL)
    if not pattern.search(markdown):
        raise SystemExit(f"walkthrough: docs/walkthrough.md has no generated block {name!r}")
    inner = f"```{fence}\n{body.rstrip()}\n```\n" if fence else body.rstrip() + "\n"
    return pattern.sub(lambda m: m.group(1) + inner + m.group(2), markdown)


# -- 3. the vLLM engine test ------------------------------------------------------

def render(table: Table) -> str:
    buf = io.StringIO()
    Console(file=buf, width=WIDTH).print(table)
    return buf.getvalue()


def engine_test_table(continue_prefill: bool) -> str:
    """The engine loop on the spec: schedule while there is room, else complete."""
    cfg = replace(ENGINE_TEST.cfg, continue_prefill=continue_prefill)
    s = initial_state(2, cfg.num_blocks)
    for r, prompt in enumerate(ENGINE_TEST.prompts):
        s = step(s, cfg, Arrive(r, prompt))
    policy = "continue-prefill" if continue_prefill else "one-batch-per-request"
    table = Table(title=f"vLLM engine test in the spec ({policy})", show_lines=True)
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
            s = step(s, cfg, CompleteOldest(tuple(Sample() for _ in sampling_entries(s, cfg))))
            table.add_row(str(i), "complete oldest", "", Text(describe(s)))
        else:
            break
    return render(table) + "\n* = the entry samples (final chunk or decode); r@start+n in Q are in-flight snapshots\n"


def engine_test_timeline(policy: str, into: Path) -> None:
    workload = Workload("engine-test", (RequestSpec("r0", 12, 5), RequestSpec("r1", 12, 5)))
    cfg = SimConfig(pp=2, max_num_batched_tokens=10, max_model_len=64, max_num_seqs=2,
                    num_blocks=64, policy=policy)
    trace = into / OUT / f"engine-test-{policy}.jsonl"
    simulate(workload, cfg, trace_path=str(trace))
    draw_timeline(read_timeline(trace), into / FIGURES / f"walkthrough-engine-test-{policy}.png", request="r0",
                  title=f"vLLM engine test, {policy}: two 12-token prompts, budget 10, PP = 2 (simulated L4)")


# -- 4. and 5. what the checker prints --------------------------------------------

def stuck_run(mutant: str) -> str:
    """The run to the hang itself: the liveness check's trace for the mutant."""
    from flightcheck.verification.explicit import search as explicit
    from flightcheck.verification.models import mutant_model
    from flightcheck.verification.traces.counterexample import from_actions
    from flightcheck.verification.traces.counterexample import render as render_counterexample
    model = mutant_model(mutant)
    v = next(v for v in explicit.search(model).violations if v.property == "L1_L3_every_request_can_finish")
    buf = io.StringIO()
    render_counterexample(from_actions(model, v.property, [a for a, _ in v.path], v.message),
                          Console(file=buf, width=WIDTH))
    return buf.getvalue()


TIMING = re.compile(r"(\d+\.\d+)(\s*│)$")          # the `seconds` cell ending a table row


def without_timings(text: str) -> str:
    """A command's output with its wall-clock figures blanked, cell widths kept."""
    lines = []
    for line in text.splitlines():
        line = TIMING.sub(lambda m: "-".ljust(len(m.group(1))) + m.group(2), line)
        line = re.sub(r"\): \d+(\.\d+)? s$", ")", line)                 # "[1] exhaustive m (n states, depth d): 6.00 s"
        line = re.sub(r" in \d+(\.\d+)? s$", "", line)                  # "OK (profile p) in 34.8 s"
        lines.append(line)
    return "\n".join(lines) + "\n"


PROGRESS = re.compile(r"^flightcheck verify \([^)]*\) \[ *[\d.]+ s\] ")


def command_output(*args: str) -> str:
    p = subprocess.run([sys.executable, "-m", "flightcheck.cli", *args], capture_output=True, text=True,
                       env={"COLUMNS": str(WIDTH), "PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"})
    # verify's per-phase progress lines (stderr, off a terminal) carry
    # elapsed seconds and say nothing the walkthrough shows: left out
    stderr = "".join(line for line in p.stderr.splitlines(keepends=True) if not PROGRESS.match(line))
    return without_timings(p.stdout + stderr)


# -- all of it --------------------------------------------------------------------

def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--into", type=Path, default=ROOT, help="root to write under (default: the repository)")
    parser.add_argument("--without-proof", action="store_true", help="skip proof.txt (about a minute)")
    args = parser.parse_args(argv)
    into: Path = args.into
    text, statuses, fates = state_machine_text(MODELS[STATE_MACHINE_MODEL])
    write(into / OUT / "state-machine.txt", text + connector_state_machine_text(statuses, fates)
          + request_states_text(statuses, fates))
    draw_state_machine(statuses, fates, into / FIGURES / "walkthrough-state-machine.png")
    advance = command_output("verify", "--mutant", "advance_at_completion")
    write(into / OUT / "advance-at-completion.txt", advance)
    markdown = (ROOT / WALKTHROUGH_MD).read_text(encoding="utf-8")
    markdown = fill_block(markdown, "spec-rule", spec_rule(ROOT), "python")
    markdown = fill_block(markdown, "advance-at-completion", advance, "text")
    write(into / WALKTHROUGH_MD, markdown)
    for continue_prefill, policy in ((True, "continue-prefill"), (False, "one-batch-per-request")):
        write(into / OUT / f"engine-test-steps-{policy}.txt", engine_test_table(continue_prefill))
        engine_test_timeline(policy, into)
    write(into / OUT / "hang-counterexample.txt", command_output("verify", "--mutant", "snapshot_omits_prefix_hit"))
    write(into / OUT / "hang-stuck-run.txt", stuck_run("snapshot_omits_prefix_hit"))
    if not args.without_proof:
        write(into / OUT / "proof.txt", command_output("verify", "--no-z3"))
    print("wrote", *sorted(str(p.relative_to(into)) for p in (into / OUT).iterdir()), into / WALKTHROUGH_MD)


if __name__ == "__main__":
    main()
