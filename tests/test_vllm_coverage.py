"""benchmarks/vllm_coverage.py: the statements of vLLM's scheduler that the
campaign runs, per function.

The mapping from statements to functions and the table are checked on a
small source of our own (fast, default suite); one slow test runs the
command for real on vLLM 0.34.0, sync and async, on a few workloads.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from . import fixtures
from .vllm_support import require_venv

pytestmark = pytest.mark.usefixtures("both_checkers")

SOURCE = textwrap.dedent('''\
    """A module docstring."""
    import os


    class Scheduler:
        """A class docstring."""

        limit = 3

        def schedule(self, n):
            """Schedules."""
            total = 0
            for i in range(n):
                total += i

            def skip(x):
                return x + 1

            return skip(total)

        @staticmethod
        def only_docstring():
            """Nothing else."""

        async def drain(self):
            await os.stat(".")
            return None


    def helper(
        a,
        b,
    ):
        if a:
            return b
        return a
    ''')

# coverage's executable lines of SOURCE (the def lines, the class body's
# assignment and the import included; docstrings not), and a run that
# called schedule (and skip) with n = 0 and helper with a falsy a.
STATEMENTS = {2, 5, 8, 10, 12, 13, 14, 16, 17, 19, 21, 22, 25, 26, 27, 30, 34, 35, 36}
EXECUTED = {2, 5, 8, 10, 12, 13, 16, 17, 19, 21, 22, 25, 30, 34, 36}


def coverage_module():
    return fixtures.load_benchmark("vllm_coverage")


def test_each_body_statement_counts_for_its_innermost_function() -> None:
    module = coverage_module()
    rows = module.per_function(SOURCE, STATEMENTS, EXECUTED)
    got = {r.name: (r.statements, r.run) for r in rows}
    # schedule: 12, 13, 14, 16 (the nested def line), 19; skip: 17 alone.
    # only_docstring has no body statement and no row; helper's multi-line
    # signature is no body statement.
    assert got == {"Scheduler.schedule": (5, 4), "Scheduler.schedule.skip": (1, 1),
                   "Scheduler.drain": (2, 0), "helper": (3, 2)}
    assert [r.name for r in rows] == ["Scheduler.schedule", "Scheduler.schedule.skip", "Scheduler.drain",
                                      "helper"]


def test_lines_outside_every_function_belong_to_none() -> None:
    module = coverage_module()
    owners = module.owner_of_lines(module.function_spans(SOURCE), STATEMENTS)
    # the import, the class line, the class attribute and every def line
    # (a nested def's line is its parent's body statement)
    assert set(STATEMENTS) - set(owners) == {2, 5, 8, 10, 21, 22, 25, 30}
    assert owners[16] == "Scheduler.schedule" and owners[17] == "Scheduler.schedule.skip"


def test_the_table_the_uncovered_functions_and_a_chosen_set() -> None:
    module = coverage_module()
    rows = module.per_function(SOURCE, STATEMENTS, EXECUTED)
    lines = module.table(rows)
    assert lines[0].split() == ["function", "statements", "run", "%"]
    assert lines[1].split() == ["Scheduler.schedule", "5", "4", "80.0"]
    assert lines[3].split() == ["Scheduler.drain", "2", "0", "0.0"]
    assert module.uncovered(rows) == ["Scheduler.drain"]
    picked, unknown = module.chosen(rows, ["drain", "helper", "nowhere"])
    assert [r.name for r in picked] == ["Scheduler.drain", "helper"] and unknown == ["nowhere"]
    assert module.figure("chosen", picked) == "chosen: 2 of 5 body statements run (40.0 %)"


def test_the_report_names_every_uncovered_function_and_the_chosen_figure() -> None:
    module = coverage_module()
    rows = module.per_function(SOURCE, STATEMENTS, EXECUTED)
    result = {"version": "0.34.0", "modes": ["sync", "async"], "file": module.SCHEDULER_FILE,
              "statements": len(STATEMENTS), "run": len(EXECUTED), "rows": rows}
    lines = module.report_lines(result, ["schedule", "skip"])
    assert lines[0] == (f"vLLM 0.34.0 (sync + async): 15 of 19 statements of {module.SCHEDULER_FILE} run (78.9 %)")
    assert lines[-3] == "uncovered functions: Scheduler.drain"
    assert lines[-2] == "chosen functions (schedule, skip): 5 of 6 body statements run (83.3 %)"
    assert lines[-1] == "  not run in schedule: lines 14"
    as_json = module.result_json(result, ["drain"])
    assert as_json["chosen"] == {"functions": ["Scheduler.drain"], "statements": 2, "run": 0, "unknown": [],
                                 "missing": {"Scheduler.drain": [26, 27]}}
    assert as_json["functions"][0] == {"name": "Scheduler.schedule", "statements": 5, "run": 4}


def test_kv_names_the_issues_acceptance_set() -> None:
    module = coverage_module()
    names = module.parse_functions("kv,schedule")
    assert names[-1] == "schedule" and len(names) == 11
    assert "_drain_deferred_loads" not in names and "_handle_invalid_blocks" in names


def test_the_launcher_runs_the_worker_under_coverage_of_the_scheduler_and_queue_files_alone(tmp_path: Path) -> None:
    module = coverage_module()
    launcher = module.write_launcher(tmp_path, Path("/venv/bin/python"), Path("/tools"), tmp_path / "data")
    text = launcher.read_text()
    assert text.startswith("#!/bin/sh\n") and launcher.stat().st_mode & 0o111
    assert "/tools\"\nexport PYTHONPATH" in text
    assert f"exec /venv/bin/python -m coverage run --parallel-mode --data-file={tmp_path / 'data' / 'worker'} " \
           f"--include='*/{module.SCHEDULER_FILE},*/{module.QUEUE_FILE}' \"$@\"" in text


def test_the_cut_leaves_out_functions_by_name_and_keeps_the_rest() -> None:
    module = coverage_module()
    rows = [module.FunctionCoverage("Scheduler.schedule", 10, 8), module.FunctionCoverage("Scheduler.make_stats", 5, 0),
            module.FunctionCoverage("Scheduler._try_schedule_encoder_inputs", 9, 0),
            module.FunctionCoverage("Scheduler._mamba_block_aligned_split", 4, 0),
            module.FunctionCoverage("Scheduler.update_from_output", 10, 6)]
    assert [r.name for r in rows if module.in_cut(r)] == ["Scheduler.schedule", "Scheduler.update_from_output"]
    queue = [module.FunctionCoverage("PriorityRequestQueue.add_request", 3, 3)]
    lines = module.cut_lines({"rows": rows, "queue_rows": queue})
    assert lines[0].endswith("14 of 20 body statements run (70.0 %)") and "2 functions of 5" in lines[0]
    assert lines[1] == f"PriorityRequestQueue ({module.QUEUE_FILE}): 3 of 3 body statements run (100.0 %)"


def test_the_real_schedulers_file_maps_every_kv_function() -> None:
    """On vLLM 0.34.0's own source (read, not imported): every function of
    the acceptance set has body statements, and `schedule`'s nested
    `skip_request` is its own row."""
    source = Path("/work/vllm-src/0.34.0/vllm/v1/core/sched/scheduler.py")
    if not source.exists():
        pytest.skip("vLLM 0.34.0's unpacked source is not here")
    module = coverage_module()
    names = {s.name for s in module.function_spans(source.read_text())}
    for name in module.KV_FUNCTIONS:
        assert f"Scheduler.{name}" in names
    assert "Scheduler.schedule.skip_request" in names


@pytest.mark.vllm
@pytest.mark.slow
def test_the_command_measures_vllm_0_34_sync_and_async(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    require_venv("0.34.0")
    module = coverage_module()
    out = tmp_path / "coverage.json"
    assert module.main(["--versions", "0.34.0", "--workloads", "3", "--seed", "1", "--functions", "kv,schedule",
                        "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())["results"][0]
    assert report["modes"] == ["sync", "async"] and report["campaign_exit"] == {"sync": 0, "async": 0}
    rows = {r["name"]: r for r in report["functions"]}
    # the campaign schedules and applies outputs: most of schedule runs
    assert rows["Scheduler.schedule"]["run"] > rows["Scheduler.schedule"]["statements"] // 3
    assert rows["Scheduler.update_from_output"]["run"] > 0
    # without a connector, no invalid block is ever handled
    assert rows["Scheduler._handle_invalid_blocks"]["run"] == 0
    assert "Scheduler._handle_invalid_blocks" in report["uncovered"]
    assert 0 < report["run"] < report["statements"]
    assert sum(r["statements"] for r in report["functions"]) < report["statements"]
    assert report["chosen"]["statements"] > rows["Scheduler.schedule"]["statements"]
    assert "uncovered functions:" in printed and "chosen functions (" in printed


def test_the_campaigns_run_per_mode_and_once_with_a_connector() -> None:
    import argparse

    module = coverage_module()
    plain = argparse.Namespace(workloads=5, seed=2, kv_connector=False, modes=["sync", "async"])
    runs = module.campaign_runs("0.34.0", plain)
    common = ["--versions", "0.34.0", "--workloads", "5", "--seed", "2", "--no-mutants"]
    assert runs == [("sync", common), ("async", [*common, "--async"])]
    # the campaign's --kv-connector runs sync and async itself
    both = argparse.Namespace(workloads=5, seed=2, kv_connector=True, modes=["sync", "async"])
    assert module.campaign_runs("0.34.0", both) == [("sync+async", [*common, "--kv-connector"])]
    only_async = argparse.Namespace(workloads=5, seed=2, kv_connector=True, modes=["async"])
    assert module.campaign_runs("0.34.0", only_async) == [("async", [*common, "--kv-connector", "--async"])]
    every = argparse.Namespace(workloads=5, seed=2, kv_connector=False, all_features=True, modes=["sync", "async"])
    assert module.campaign_runs("0.34.0", every) == [("sync+async", [*common, "--all-features"])]
    # drafts, and lookahead slots, passed on
    drafted = argparse.Namespace(workloads=5, seed=2, kv_connector=False, all_features=True, modes=["sync", "async"],
                                 spec_tokens=2, lookahead=True)
    assert module.campaign_runs("0.34.0", drafted) == [
        ("sync+async", [*common, "--spec-tokens", "2", "--lookahead", "--all-features"])]
