"""`flightcheck run`: results, JSON, traces, one-line errors, torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from flightcheck.cli import main
from flightcheck.runtime import ModelConfig, WeightSource, build_model, save_hf_checkpoint
from flightcheck.verification.traces.check import check_trace

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

torch.set_num_threads(1)
SMALL = ["--max-model-len", "96", "--block-size", "4", "--num-blocks", "40",
         "--max-num-batched-tokens", "32"]


def run_json(capsys, *argv: str) -> dict:
    assert main(["run", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_run_prints_json_results_and_writes_legal_traces(capsys, tmp_path):
    trace, chrome = tmp_path / "t.jsonl", tmp_path / "t.chrome.json"
    out = run_json(capsys, "--num-prompts", "5", "--max-tokens", "6", "--seed", "3",
                   "--num-spec-tokens", "2", "--trace", str(trace), "--chrome-trace", str(chrome),
                   *SMALL)
    assert set(out) == {"requests", "seconds"}
    assert [r["id"] for r in out["requests"]] == [f"r{i}" for i in range(5)]
    for r in out["requests"]:
        assert set(r) == {"id", "prompt_len", "output_token_ids", "finish_reason"}
        assert r["finish_reason"] in ("length", "stop") and 1 <= len(r["output_token_ids"]) <= 6
    assert check_trace(trace).ok
    events = json.loads(chrome.read_text())["traceEvents"]
    assert any(e["ph"] == "X" and e["tid"] == 1 for e in events)      # stage 0 slices


def test_run_with_async_scheduling_gives_the_sync_outputs_and_a_legal_async_trace(capsys, tmp_path):
    """`--profile vllm-0.33-async`: stage processes (PP = 2), K + 1 batches
    in flight, each decode's previous token from the last stage; greedy
    float64 outputs equal the sync 0.33 run's, and the trace is checked
    under the profile it names."""
    args = ["--num-prompts", "4", "--max-tokens", "6", "--pp", "2", "--dtype", "float64", *SMALL]
    trace = tmp_path / "async.jsonl"
    asynchronous = run_json(capsys, *args, "--profile", "vllm-0.33-async", "--trace", str(trace))
    synchronous = run_json(capsys, *args, "--profile", "vllm-0.33")
    assert asynchronous["requests"] == synchronous["requests"]
    check = check_trace(trace)
    assert check.ok and check.profile == "vllm-0.33-async", (check.property, check.message)
    # With drafts too (the refusal is gone): async + drafts equals sync + drafts.
    drafted = tmp_path / "async-drafts.jsonl"
    asynchronous = run_json(capsys, *args, "--num-spec-tokens", "2", "--profile", "vllm-0.33-async",
                            "--trace", str(drafted))
    synchronous = run_json(capsys, *args, "--num-spec-tokens", "2", "--profile", "vllm-0.33")
    assert asynchronous["requests"] == synchronous["requests"]
    check = check_trace(drafted)
    assert check.ok and check.profile == "vllm-0.33-async", (check.property, check.message)


def test_seed_fixes_weights_workload_and_sampling(capsys):
    args = ["--num-prompts", "3", "--max-tokens", "5", "--temperature", "0.8", "--top-p", "0.9",
            *SMALL]
    a = run_json(capsys, "--seed", "1", *args)["requests"]
    b = run_json(capsys, "--seed", "1", *args)["requests"]
    c = run_json(capsys, "--seed", "2", *args)["requests"]
    assert a == b and a != c


def test_prompts_file_of_text_and_token_ids(capsys, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('"hello world"\n[1, 2, 3, 4]\n{"id": "x", "prompt": "abc", "max_tokens": 2}\n')
    out = run_json(capsys, "--prompts", str(prompts), "--max-tokens", "3", *SMALL)["requests"]
    assert [(r["id"], r["prompt_len"]) for r in out] == [("p0", 11), ("p1", 4), ("x", 3)]
    for r, limit in zip(out, (3, 3, 2)):            # "x" has its own max_tokens
        n = len(r["output_token_ids"])
        assert n == limit or (n < limit and r["finish_reason"] == "stop"), r


def _error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        code = main(["run", *argv])
        raise SystemExit(code)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("flightcheck: error: ")
    return err[-1]


def test_bad_input_is_one_line_and_exit_code_2(capsys, tmp_path):
    assert "not a directory" in _error(capsys, "--num-prompts", "2", "--checkpoint",
                                       str(tmp_path / "missing"))
    long = tmp_path / "long.json"
    long.write_text(json.dumps([list(range(100))]))
    assert "at most 95 fit" in _error(capsys, "--prompts", str(long), *SMALL)
    oov = tmp_path / "oov.json"
    oov.write_text(json.dumps([[1, 2, 9999]]))
    assert "outside the vocabulary" in _error(capsys, "--prompts", str(oov))
    junk = tmp_path / "junk.txt"
    junk.write_text("not json")
    assert "not JSON" in _error(capsys, "--prompts", str(junk))
    assert "exceeds the model's 6 layers" in _error(capsys, "--num-prompts", "1", "--pp", "7")
    assert "num_blocks" in _error(capsys, "--num-prompts", "1", "--num-blocks", "2")
    _error(capsys, "--pp", "2")                           # neither --prompts nor --num-prompts


def test_checkpoint_whose_weights_do_not_match_config_json_is_refused(capsys, tmp_path):
    cfg = ModelConfig(n_layers=2)
    src = WeightSource(seed=1, config_overrides=tuple(cfg.to_dict().items()))
    save_hf_checkpoint(build_model(cfg, src, torch.float32), cfg, tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    hf["intermediate_size"] = 256
    (tmp_path / "config.json").write_text(json.dumps(hf))
    assert "shape" in _error(capsys, "--num-prompts", "1", "--checkpoint", str(tmp_path))


def test_torchrun_standalone_matches_the_in_process_run(capsys):
    """torchrun --standalone, 3 ranks: a driver and PP = 2 stages (float64)."""
    args = ["run", "--json", "--pp", "2", "--num-prompts", "4", "--max-tokens", "5",
            "--dtype", "float64", "--seed", "5", *SMALL]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "3", "-m", "flightcheck.cli", *args],
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    args[args.index("--pp") + 1] = "1"
    want = run_json(capsys, *args[2:])
    assert got["requests"] == want["requests"]
