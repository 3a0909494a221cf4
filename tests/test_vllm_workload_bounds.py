"""`flightcheck vllm replay` validates its workload file with the discipline of
check-trace (issue 37): a bounded read, then every key checked with its type
and range, one line naming the key path, exit 2, before vLLM's worker starts
(so none of these needs a vLLM venv). The limits: workload_limits.py and
docs/limits.md."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightcheck.cli import main
from flightcheck.vllm.workload import WorkloadError, read_workloads
from flightcheck.vllm.workload_limits import MAX_NUM_BLOCKS, MAX_PROMPT_LEN, MAX_WORKLOAD_TOKENS

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

VALID: dict[str, Any] = {
    "name": "w", "seed": 3, "max_steps": 500, "draft_acceptance": 0.5,
    "config": {"num_stages": 2, "max_num_batched_tokens": 32, "max_num_seqs": 4, "block_size": 4,
               "num_blocks": 64, "max_model_len": 256, "num_spec_tokens": 1,
               "kv_connector": {"consumer": True, "producer": True, "max_inflight_loads": 2}},
    "prefixes": {"sys": 8},
    "requests": [
        {"id": "a", "prompt_len": 12, "prefix": "sys", "max_tokens": 4, "eos_probability": 0.1,
         "kv": {"hit": 4, "async": True, "load_steps": 2, "fail_from_block": 1, "send_steps": 1}},
        {"id": "b", "prompt_token_ids": [5, 6, 7], "max_tokens": 2, "arrival_step": 1, "abort_step": 3,
         "ignore_eos": True},
    ],
}


def write(tmp_path: Path, content: bytes | str, name: str = "w.json") -> Path:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def replay_refuses(capsys, path: Path | str) -> str:
    """`flightcheck vllm replay PATH` in this process: exit 2, one line."""
    try:
        code = main(["vllm", "replay", str(path)])
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2, (code, err)
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("flightcheck: error: "), err
    return err


def test_the_valid_workload_is_read(tmp_path):
    assert read_workloads(write(tmp_path, json.dumps(VALID))) == [VALID]


@pytest.mark.parametrize("content, fragment", [
    (b'{"name": "w",\n\xff\xfe\x00', "w.json:2: not UTF-8"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    (json.dumps(VALID).replace('"max_tokens": 4', '"max_tokens": ' + "9" * 5000), "4300 digits"),
], ids=["binary", "deep", "digits"])
def test_a_file_that_is_not_readable_json_is_one_line(capsys, tmp_path, content, fragment):
    assert fragment in replay_refuses(capsys, write(tmp_path, content))


def test_dev_zero_is_refused_without_reading_it(capsys):
    assert "is a character device, not a regular file" in replay_refuses(capsys, "/dev/zero")


def with_value(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    raw = copy.deepcopy(VALID)
    place = raw
    for part in path[:-1]:
        place = place[part]
    place[path[-1]] = value
    return raw


@pytest.mark.parametrize("path, value, message", [
    (("requests", 0, "prompt_len"), 10**9,
     f"requests[0].prompt_len: must be at most {MAX_PROMPT_LEN} (the replay draws every prompt token), "
     f"got 1000000000"),
    (("config", "num_blocks"), 10**9, f"config.num_blocks: must be at most {MAX_NUM_BLOCKS}"),
    (("requests", 0, "prompt_len"), 1e9, "requests[0].prompt_len: must be an integer, got 1000000000.0"),
    (("requests", 1, "max_tokens"), 10**40, "requests[1].max_tokens: must be at most 2147483647"),
    (("requests", 0, "kv", "hit"), -1, "requests[0].kv.hit: must be at least 0"),
    (("requests", 0, "eos_probability"), float("nan"), "requests[0].eos_probability: must be a number from 0 to 1"),
    (("requests", 1, "ignore_eos"), "yes", "requests[1].ignore_eos: must be true or false"),
    (("config", "max_model_len"), 2**31, "config.max_model_len: must be at most"),
    (("max_steps", ), 10**12, "max_steps: must be at most 1000000"),
    (("config", "kv_connector", "max_inflight_loads"), True,
     "config.kv_connector.max_inflight_loads: must be an integer"),
])
def test_a_value_out_of_range_is_refused_naming_its_key_path(capsys, tmp_path, path, value, message):
    assert message in replay_refuses(capsys, write(tmp_path, json.dumps(with_value(path, value))))


def test_the_prompt_tokens_of_a_workload_are_bounded_before_any_is_drawn(tmp_path, monkeypatch):
    from flightcheck.vllm import workload

    assert workload.MAX_WORKLOAD_TOKENS == MAX_WORKLOAD_TOKENS == 4 * MAX_PROMPT_LEN
    monkeypatch.setattr(workload, "MAX_WORKLOAD_TOKENS", 4000)      # the same rule, drawn faster
    drawn = []
    monkeypatch.setattr(workload, "_seeded_tokens", lambda seed, label, count: drawn.append(count) or [5] * count)
    raw = {**VALID, "requests": [{"id": str(i), "prompt_len": 1000} for i in range(5)]}
    with pytest.raises(WorkloadError, match=r"requests\[4\]: the workload's prompts hold more than 4000"):
        read_workloads(write(tmp_path, json.dumps(raw)))
    assert drawn == [1000] * 4                                          # the fifth never drawn


# -- any mutation of a valid workload: read, or refused in one line -----------------

def leaf_paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in the workload a value stands (objects' keys, lists' indices)."""
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    else:
        return []
    found = []
    for key, inner in items:
        found.append((*prefix, key))
        found.extend(leaf_paths(inner, (*prefix, key)))
    return found


PATHS = leaf_paths(VALID)
ODD_VALUES = st.one_of(
    st.integers(min_value=-(10**400), max_value=10**400), st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(), st.none(), st.text(max_size=20), st.sampled_from([10**308 * 10, 2**31, 2**63, -1, 0, 1e9]),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=3))


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@st.composite
def mutated_files(draw) -> bytes:
    """A valid workload file, changed one way: a value replaced, a key
    dropped, bytes flipped or cut, deep nesting or a huge integer put in."""
    how = draw(st.sampled_from(["value", "drop", "bytes", "cut", "deep", "digits", "lines"]))
    raw = copy.deepcopy(VALID)
    if how in ("value", "drop"):
        path = draw(st.sampled_from(PATHS))
        place = raw
        for part in path[:-1]:
            place = place[part]
        if how == "drop" and isinstance(place, dict):
            del place[path[-1]]
        else:
            place[path[-1]] = draw(ODD_VALUES)
    text = json.dumps(raw)
    if how == "lines":
        return (text + "\n" + draw(st.sampled_from([text, "{", "[]", "7", deep(3000)]))).encode()
    data = text.encode()
    if how == "bytes":
        spots = draw(st.lists(st.integers(0, len(data) - 1), min_size=1, max_size=5))
        changed = bytearray(data)
        for spot in spots:
            changed[spot] = draw(st.integers(0, 255))
        return bytes(changed)
    if how == "cut":
        return data[:draw(st.integers(0, len(data)))]
    if how in ("deep", "digits"):
        spot = text.index('"max_tokens": 4') + len('"max_tokens": ')
        inner = deep(draw(st.integers(900, 50_000))) if how == "deep" else "7" * draw(st.integers(300, 6000))
        return (text[:spot] + inner + text[spot + 1:]).encode()
    return data


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=mutated_files())
def test_a_mutated_workload_is_read_or_refused_in_one_line(tmp_path, content):
    path = tmp_path / "m.json"
    path.write_bytes(content)
    try:
        read_workloads(path)
    except WorkloadError as err:
        message = str(err)
        assert message and "\n" not in message and "\r" not in message and len(message) < 600, message
