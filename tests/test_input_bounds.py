"""Numbers and sizes are bounded where they are read (issue 37, point 3):
trace numbers past float range, CLI values that would allocate past the
machine, temperatures that underflow, input files that never end. Each is
one line and exit 2 (or, for a tiny temperature, greedy sampling), never a
traceback, a MemoryError or a hang. docs/limits.md states the limits."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from flightcheck.cli import main
from flightcheck.commands import common
from flightcheck.verification.traces.schema import EVENTS, Nullable, Number, Record, SchemaError, validate_event

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

HUGE_INT = 10**309                              # 1 followed by 309 zeros: past the largest float
CONFIG = {"ev": "config", "num_stages": 2, "max_num_batched_tokens": 8, "block_size": 4,
          "num_blocks": 8, "max_model_len": 16}


def cli(capsys, *argv: str) -> tuple[int, str]:
    """Run the CLI in this process: (exit code, stderr)."""
    try:
        code = main(list(argv))
    except SystemExit as stop:                  # argparse's refusals
        code = stop.code
    return code, capsys.readouterr().err


def refused(capsys, *argv: str) -> str:
    code, err = cli(capsys, *argv)
    assert code == 2, (code, err)
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("flightcheck: error: "), err
    return err


# -- trace numbers ---------------------------------------------------------------

def number_fields() -> list[tuple[str, str]]:
    """(event kind, field) of every number field of the schema (t, t0, t1, recv, ...)."""
    found = []
    for kind, record in EVENTS.items():
        for field, (field_kind, _) in record.fields.items():
            inner = field_kind.inner if isinstance(field_kind, Nullable) else field_kind
            if isinstance(inner, Number):
                found.append((kind, field))
    return found


def minimal_event(kind: str) -> dict[str, Any]:
    """A valid event of `kind` (its required fields), for the config above."""
    if kind == "config":
        return dict(CONFIG)
    values = {"req": "a", "prompt_len": 1, "max_tokens": 1, "entries": [], "batch": 0, "stage": 0,
              "t0": 0, "t1": 1, "reason": "stop", "from_block": 0, "count": 1, "running": True, "state": "none",
              "in": "schedule", "error": "AssertionError"}
    record: Record = EVENTS[kind]
    event = {"ev": kind, **{f: values[f] for f, (_, required) in record.fields.items() if required}}
    if kind == "input":
        event["end_of_session"] = True        # (an input that goes on gives num_tokens and max_tokens)
    return event


@pytest.mark.parametrize("kind, field", number_fields())
@pytest.mark.parametrize("value", [HUGE_INT, -HUGE_INT], ids=["1e309", "-1e309"])
def test_a_number_field_past_float_range_is_malformed_naming_the_field(kind, field, value):
    # a config under which every event is allowed: a connector's, a grammar's, a session's
    config = None if kind == "config" else {**CONFIG, "kv_connector": {"consumer": True, "producer": True},
                                            "structured_output": True, "streaming_sessions": True}
    event = {**minimal_event(kind), field: value}
    if kind != "config":
        validate_event(minimal_event(kind), config)           # the event is valid without the number
    with pytest.raises(SchemaError) as caught:
        validate_event(event, config)
    assert caught.value.path == field and "beyond float range" in caught.value.message


def test_the_number_kinds_are_covered():
    assert {("end", "t"), ("stage", "t0"), ("stage", "t1"), ("stage", "recv")} <= set(number_fields())


@pytest.mark.parametrize("line", [
    '{"ev":"end","t":1' + "0" * 309 + "}",
    '{"ev":"stage","batch":0,"stage":0,"t0":0,"t1":1,"recv":-1' + "0" * 309 + "}",
    '{"ev":"end","step":' + "9" * 5000 + "}",            # past Python's 4,300-digit conversion limit
], ids=["t", "recv", "digits"])
def test_check_trace_refuses_an_out_of_range_number_with_the_line(capsys, tmp_path, line):
    import json
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps(CONFIG) + "\n" + line + "\n")
    err = refused(capsys, "check-trace", str(trace))
    assert "line 2:" in err


def test_plot_refuses_a_time_past_float_range_naming_the_line(capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"ev":"config","num_stages":2}\n{"ev":"stage","batch":1,"stage":0,"t0":0,"t1":1'
                     + "0" * 309 + "}\n")
    assert "t.jsonl:2: a number beyond float range" in refused(capsys, "plot", str(trace), "--no-png",
                                                                "--perfetto", str(tmp_path / "p.json"))


# -- CLI values that would allocate past the machine -----------------------------

@pytest.mark.parametrize("argv, fragment", [
    (["run", "--num-prompts", "10000000"], f"--num-prompts: must be at most {common.MAX_PROMPTS}"),
    (["simulate", "--num-prompts", "10000000"], f"--num-prompts: must be at most {common.MAX_PROMPTS}"),
    (["bench", "--num-prompts", "10000000"], f"--num-prompts: must be at most {common.MAX_PROMPTS}"),
    (["simulate", "--num-blocks", "2147483647"], "bytes per block"),
    (["simulate", "--num-blocks", str(2**22 + 1)], "--num-blocks: must be at most"),
    (["bench", "--num-blocks", "2147483647"], "bytes per block"),
    (["run", "--num-prompts", "2", "--num-blocks", "2147483647"], "bytes per block"),
    (["run", "--num-prompts", "2", "--block-size", "2147483647"], "--block-size: must be at most 16777216"),
    (["simulate", "--block-size", "2147483647"], "--block-size: must be at most 16777216"),
    (["simulate", "--max-model-len", "2147483647"], "--max-model-len: must be at most 16777216"),
    (["bench", "--num-prompts", "2", "--request-rate", "1e-300"], "bench sends in wall-clock time, within 86400 s"),
    (["vllm", "fit", "--workloads", "2147483647"], "--workloads: must be at most 10000"),
    (["vllm", "campaign", "--workloads", "2147483647"], "--workloads: must be at most 10000"),
    (["vllm", "campaign", "--workloads", "-1"], "--workloads: must be at least 1"),
    (["vllm", "campaign", "--workloads", "1", "--spec-tokens", "100000"], "--spec-tokens: must be at most 1024"),
], ids=["run-prompts", "simulate-prompts", "bench-prompts", "simulate-blocks", "simulate-blocks-2**22",
        "bench-blocks", "run-blocks", "run-block-size", "simulate-block-size", "simulate-model-len",
        "bench-rate", "fit-workloads", "campaign-workloads", "campaign-negative", "campaign-spec-tokens"])
def test_a_value_past_the_stated_limit_is_refused_before_any_work(capsys, argv, fragment):
    assert fragment in refused(capsys, *argv)


def test_simulate_refuses_a_default_pool_past_the_limit(capsys):
    err = refused(capsys, "simulate", "--model", "llama-3.2-1b", "--gpu", "H200", "--pp", "16", "--block-size", "1",
                  "--num-prompts", "2")
    assert "fits 60914560 KV blocks of 1 tokens, more than the" in err and "give --num-blocks" in err


def test_the_pool_limit_follows_physical_memory(monkeypatch):
    monkeypatch.setattr(common, "physical_memory", lambda: 2**30)
    limit = common.max_pool_blocks()
    assert limit == 2**29 // common.SCHEDULER_BYTES_PER_BLOCK < common.MAX_POOL_BLOCKS
    assert common.pool_blocks(str(limit)) == limit
    with pytest.raises(Exception, match=f"must be at most {limit} on this machine"):
        common.pool_blocks(str(limit + 1))


def test_the_runtime_kv_cache_is_refused_past_the_memory_share(monkeypatch):
    from flightcheck.runtime.config import PRESETS

    monkeypatch.setattr(common, "physical_memory", lambda: 8 * 2**30)
    tiny = PRESETS["tiny"]                    # 6 layers x 2 KV heads x 16 dims x K and V x 4 bytes
    per_slot = 6 * 2 * 16 * 2 * 4
    fits = 4 * 2**30 // (16 * per_slot)
    assert common.kv_cache_problem(fits, 16, tiny, "float32") is None
    problem = common.kv_cache_problem(fits + 1, 16, tiny, "float32")
    assert problem and f"at most {fits} blocks of 16 fit" in problem and "--num-blocks" in problem
    assert common.kv_cache_problem(fits, 16, tiny, "float64") is not None


def test_run_refuses_a_kv_cache_past_memory_before_any_stage_starts(capsys, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setattr(common, "physical_memory", lambda: 2**30)
    err = refused(capsys, "run", "--num-prompts", "2", "--num-blocks", "1000000")
    assert "the KV cache would take" in err and "--num-blocks 1000000" in err


def test_bench_refuses_more_stages_than_layers_before_any_starts(capsys):
    pytest.importorskip("torch")
    assert "--pp 100 exceeds the model's 6 layers" in refused(capsys, "bench", "--num-prompts", "2", "--pp", "100",
                                                              "--force")


# -- temperatures that underflow --------------------------------------------------

@pytest.mark.parametrize("temperature", [1e-310, 5e-324, 1e-6, 0.0])
def test_a_temperature_below_the_floor_samples_greedily(temperature):
    torch = pytest.importorskip("torch")
    from flightcheck.runtime.sampler import GREEDY_BELOW, sample_tokens

    assert temperature < GREEDY_BELOW
    logits = torch.tensor([[0.5, 3.0, -2.0, 1.0], [9.0, -9.0, 0.0, 8.5]])
    assert sample_tokens(logits, [0, 1], temperature, seed=7) == [1, 0]


# -- input files that never end, or are not text ----------------------------------

@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("make, fragment", [
    (lambda tmp, fifo: "/dev/zero", "is a character device, not a regular file"),
    (lambda tmp, fifo: str(fifo), "is a FIFO or pipe, not a regular file"),
    (lambda tmp, fifo: str(tmp), "is a directory"),
], ids=["dev-zero", "fifo", "directory"])
def test_a_prompts_file_that_never_ends_is_refused(capsys, tmp_path, fifo, make, fragment):
    pytest.importorskip("torch")
    assert fragment in refused(capsys, "run", "--prompts", make(tmp_path, fifo))


def test_a_binary_prompts_file_is_refused_naming_the_line(capsys, tmp_path):
    pytest.importorskip("torch")
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"prompt": "hi"}\n\xff\xfe\n')
    assert "p.jsonl:2: not UTF-8" in refused(capsys, "run", "--prompts", str(path))


def test_a_prompts_file_is_read_with_a_bound(monkeypatch, tmp_path):
    pytest.importorskip("torch")
    from flightcheck.runtime import workload
    from flightcheck.runtime.tokenizer import load_tokenizer

    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hello"}\n' * 100)
    monkeypatch.setattr(workload, "MAX_PROMPTS_FILE_BYTES", 1000)
    with pytest.raises(workload.PromptFileError, match="larger than 1000 bytes"):
        workload.read_prompts(path, load_tokenizer(None), 4)


@pytest.mark.parametrize("field", ['"temperature": NaN', '"temperature": 1e400', '"max_tokens": 1e30',
                                   '"seed": -1', '"ignore_eos": "no"', '"id": [1]'])
def test_a_prompt_field_out_of_range_is_refused(tmp_path, field):
    pytest.importorskip("torch")
    from flightcheck.runtime.tokenizer import load_tokenizer
    from flightcheck.runtime.workload import PromptFileError, read_prompts

    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hi", ' + field + "}\n")
    with pytest.raises(PromptFileError, match="prompt 0"):
        read_prompts(path, load_tokenizer(None), 4)


CSV_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


@pytest.mark.parametrize("content, fragment", [
    ((CSV_HEADER + "1,GPT-4,4,5,9,x\n").encode() + b"\xff\n", "d.csv:3: not UTF-8"),
    ((CSV_HEADER + "1,GPT-4,1e400,5,9,x\n").encode(), "d.csv:2: column 'Request tokens' must be a count"),
    ((CSV_HEADER + "1,GPT-4,nan,5,9,x\n").encode(), "d.csv:2: column 'Request tokens'"),
], ids=["binary", "1e400", "nan"])
def test_a_bad_burstgpt_file_is_one_line_naming_the_line(capsys, tmp_path, content, fragment):
    path = tmp_path / "d.csv"
    path.write_bytes(content)
    assert fragment in refused(capsys, "simulate", "--num-prompts", "2", "--dataset-path", str(path))


@pytest.mark.parametrize("make, fragment", [
    (lambda tmp, fifo: "/dev/zero", "is a character device"),
    (lambda tmp, fifo: str(fifo), "is a FIFO or pipe"),
], ids=["dev-zero", "fifo"])
def test_a_dataset_that_never_ends_is_refused(capsys, tmp_path, fifo, make, fragment):
    assert fragment in refused(capsys, "simulate", "--num-prompts", "2", "--dataset-path", make(tmp_path, fifo))


def test_a_sharegpt_file_nested_too_deeply_is_one_line(capsys, tmp_path):
    path = tmp_path / "s.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    assert "nested too deeply" in refused(capsys, "simulate", "--dataset", "sharegpt", "--num-prompts", "2",
                                          "--dataset-path", str(path))

