"""The bridge's compatibility module (flightcheck/vllm/compat.py) without a
real vLLM: its readers on objects shaped like each release's, and a stub
vLLM package, written here into tmp_path, that has everything the bridge
reads but one attribute: the replay refuses it with exit 2 and one line
naming that attribute and the version, never a traceback. The complete
stub passes the same check, so the refusal is the one attribute's doing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from flightcheck.vllm import compat
from flightcheck.vllm.compat import NEEDED, IncompatibleVllm

REPO = Path(__file__).resolve().parent.parent

# A vLLM shaped like 0.34.0 as far as the bridge's class-level checks go:
# {placeholder} is where the test drops one attribute.
STUB = {
    "vllm/__init__.py": '__version__ = "{version}"\n',
    "vllm/v1/__init__.py": "",
    "vllm/v1/core/__init__.py": "",
    "vllm/v1/core/sched/__init__.py": "",
    "vllm/v1/core/sched/scheduler.py": """
        class Scheduler:
            def add_request(self, request): ...
            def schedule(self): ...
            def update_from_output(self, scheduler_output, model_runner_output): ...
            def finish_requests(self, request_ids, finished_status): ...
            def has_requests(self): ...
        """,
    "vllm/v1/core/sched/async_scheduler.py": """
        from .scheduler import Scheduler
        class AsyncScheduler(Scheduler): ...
        """,
    "vllm/v1/core/sched/output.py": """
        from dataclasses import dataclass
        @dataclass
        class NewRequestData:
            req_id: str
            prompt_token_ids: list
            block_ids: tuple
            num_computed_tokens: int
            prefill_token_ids: list
        @dataclass
        class CachedRequestData:
            req_ids: list
            new_block_ids: list
            num_computed_tokens: list
        @dataclass
        class SchedulerOutput:
            scheduled_new_reqs: list
            scheduled_cached_reqs: object
            {num_scheduled_tokens}
            total_num_scheduled_tokens: int
            scheduled_spec_decode_tokens: dict
            finished_req_ids: set
        """,
    "vllm/v1/outputs.py": """
        from dataclasses import dataclass, field
        @dataclass
        class ModelRunnerOutput:
            req_ids: list
            sampled_token_ids: list = field(default_factory=list)
        """,
    "vllm/v1/request.py": """
        class Request:
            @property
            def prefill_token_ids(self): ...
        """,
    "vllm/utils/__init__.py": "",
    "vllm/utils/import_utils.py": """
        def resolve_obj_by_qualname(qualname): ...
        """,
    "vllm/config.py": """
        class VllmConfig:
            max_concurrent_batches = 2
        """,
}


def write_stub(root: Path, version: str = "0.34.0", drop_num_scheduled_tokens: bool = False) -> Path:
    for relative, text in STUB.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        field = "" if drop_num_scheduled_tokens else "num_scheduled_tokens: dict"
        path.write_text(textwrap.dedent(text).format(version=version, num_scheduled_tokens=field))
    return root


def stub_python(tmp_path: Path, stub: Path) -> Path:
    """An 'interpreter' that is this Python with the stub vLLM on its path
    (the replay gives the worker a PYTHONPATH of its own; this appends)."""
    wrapper = tmp_path / "stub-python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="$PYTHONPATH:{stub}" exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def problem_under(stub: Path, async_scheduling: bool = False) -> str | None:
    """compat.problem() in a fresh interpreter that imports the stub as vllm."""
    code = f"from flightcheck.vllm import compat; print(repr(compat.problem({async_scheduling})))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(stub), str(REPO)])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return eval(out.stdout.strip())


def test_the_complete_stub_has_everything_the_bridge_reads(tmp_path: Path):
    stub = write_stub(tmp_path / "stub")
    assert problem_under(stub) is None
    assert problem_under(stub, async_scheduling=True) is None


def test_a_vllm_lacking_one_attribute_is_refused_by_the_replay_in_one_line(tmp_path: Path):
    stub = write_stub(tmp_path / "stub", drop_num_scheduled_tokens=True)
    workload = tmp_path / "w.json"
    workload.write_text(json.dumps({"name": "w", "config": {"num_stages": 2, "max_num_batched_tokens": 8,
                                                            "num_blocks": 100},
                                    "requests": [{"prompt_len": 4}]}))
    env = {**os.environ, "FLIGHTCHECK_VLLM_PYTHON_0_34_0": str(stub_python(tmp_path, stub))}
    done = subprocess.run([sys.executable, "-m", "flightcheck.cli", "vllm", "replay", str(workload),
                           "--vllm-version", "0.34.0"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("flightcheck: error")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "vLLM 0.34.0 lacks SchedulerOutput.num_scheduled_tokens" in errors[0]


def test_resumed_requests_need_resumed_req_ids_or_the_witness_that_they_travel_as_new(tmp_path: Path):
    """0.34 dropped CachedRequestData.resumed_req_ids because resumed
    requests are sent in full as new-request data; without the witness
    (Request.prefill_token_ids) the absence is not read as that rule."""
    stub = write_stub(tmp_path / "stub", version="0.35.0.dev1")
    (stub / "vllm/v1/request.py").write_text("class Request: ...\n")
    found = problem_under(stub)
    assert found is not None and found.startswith("vLLM 0.35.0.dev1 lacks CachedRequestData.resumed_req_ids and "
                                                  "Request.prefill_token_ids")


def test_outputs_are_indexed_by_req_id_to_index_where_a_release_has_it_else_by_req_ids_order():
    up_to_033 = SimpleNamespace(req_id_to_index={"a": 1, "b": 0}, req_ids=["b", "a"])
    from_034 = SimpleNamespace(req_ids=["b", "a"])
    assert compat.output_index(up_to_033) == {"a": 1, "b": 0}
    assert compat.output_index(from_034) == {"b": 0, "a": 1}
    with pytest.raises(IncompatibleVllm):
        compat.output_index(SimpleNamespace(sampled_token_ids=[]))


def test_cached_rows_read_per_request_and_batch_level_data():
    per_request = [SimpleNamespace(req_id="a", num_computed_tokens=3, new_block_ids=[1],
                                   resumed_from_preemption=True)]
    assert compat.cached_rows(per_request) == [("a", 3, [1], True)]
    batch = SimpleNamespace(req_ids=["a", "b"], num_computed_tokens=[3, 4], new_block_ids=[None, [2]],
                            resumed_req_ids={"b"})
    assert compat.cached_rows(batch) == [("a", 3, None, False), ("b", 4, [2], True)]


def test_every_needed_attribute_is_named_once_with_its_releases():
    names = [item.qualified for item in NEEDED]
    assert len(names) == len(set(names))
    assert all(item.releases and item.why for item in NEEDED)
    # the four 0.34 changes the recorder stumbled on are in the catalogue
    for name in ("ModelRunnerOutput.req_id_to_index", "CachedRequestData.resumed_req_ids",
                 "Scheduler.use_v2_model_runner", "ModelRunnerOutput.req_ids"):
        assert name in names
