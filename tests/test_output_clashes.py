"""Hypothesis over output-path clashes, for every command that writes a file
(docs/outputs.md): an output named as an input (the same string, another
spelling of it, a symbolic link, a hard link, /proc/self/fd/N) or two outputs
on one file is refused with exit 2 and one stderr line naming the output's
flag, before any work, and every input is byte-identical afterwards."""

from __future__ import annotations

import functools
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightcheck.cli import main

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

WORKLOAD = ('{"name": "w", "config": {"num_stages": 2, "max_num_batched_tokens": 16, "max_num_seqs": 4, '
            '"block_size": 4, "num_blocks": 40}, "requests": [{"id": "a", "prompt_len": 4, "max_tokens": 2}]}\n')


@functools.lru_cache(maxsize=1)
def trace_text() -> str:
    """A small trace with stage events, made once (plot's input)."""
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "t.jsonl"
        assert main(["simulate", "--num-prompts", "2", "--trace", str(path)]) == 0
        return path.read_text()


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]              # with INPUT where the input's path goes
    input_flag: str                    # how the refusal names the input
    outputs: tuple[str, ...]           # the output flags


COMMANDS = {
    "run": Command(("run", "--pp", "1", "--max-tokens", "2", "--prompts", "INPUT"), "--prompts",
                   ("--trace", "--chrome-trace")),
    "simulate": Command(("simulate", "--num-prompts", "2", "--dataset", "sharegpt", "--dataset-path", "INPUT"),
                        "--dataset-path", ("--trace", "--save-result")),
    "bench": Command(("bench", "--pp", "1", "--num-prompts", "2", "--dataset", "sharegpt",
                      "--dataset-path", "INPUT"), "--dataset-path", ("--trace", "--save-result")),
    "plot": Command(("plot", "INPUT"), "input", ("--perfetto", "--out")),
    "vllm replay": Command(("vllm", "replay", "INPUT"), "the workload file", ("--trace",)),
    "vllm campaign": Command(("vllm", "campaign", "--workloads", "1", "--vllm-python", "INPUT"), "--vllm-python",
                             ("--json",)),
}
CONTENTS = {"run": '"hello"\n', "simulate": "[]", "bench": "[]", "vllm replay": WORKLOAD,
            "vllm campaign": "#!/bin/sh\n"}
ALIASES = ("same", "dotted", "symlink", "hardlink", "proc-fd")


def alias(kind: str, target: Path, scratch: Path, name: str, held: list[int]) -> str:
    """Another name for `target`, of the given kind."""
    if kind == "same":
        return str(target)
    if kind == "dotted":
        return f"{scratch}/./sub/../{target.name}"
    if kind == "symlink":
        (scratch / name).symlink_to(target)
    elif kind == "hardlink":
        os.link(target, scratch / name)
    elif kind == "proc-fd":
        held.append(os.open(target, os.O_RDONLY))
        return f"/proc/self/fd/{held[-1]}"
    return str(scratch / name)


def snapshot(scratch: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in scratch.iterdir() if p.is_file() and not p.is_symlink()}


def scratch_with_input(scratch: Path, command: str) -> tuple[Path, Path]:
    """A scratch folder (with a `sub` folder) holding `command`'s input file."""
    (scratch / "sub").mkdir()
    source = scratch / "input.txt"
    source.write_text(trace_text() if command == "plot" else CONTENTS[command])
    return scratch, source


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(sorted(COMMANDS)), kind=st.sampled_from(ALIASES), data=st.data())
def test_an_output_on_an_input_is_refused_and_the_input_kept(capsys, command, kind, data):
    spec = COMMANDS[command]
    flag = data.draw(st.sampled_from(spec.outputs))
    with tempfile.TemporaryDirectory() as where:
        scratch, source = scratch_with_input(Path(where), command)
        capsys.readouterr()
        held: list[int] = []
        try:
            output = alias(kind, source, scratch, "alias.png", held)
            before = snapshot(scratch)
            argv = [str(source) if a == "INPUT" else a for a in spec.argv] + [flag, output]
            code = main(argv)
        finally:
            for fd in held:
                os.close(fd)
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1, (argv, err)
        assert flag in err[0] and spec.input_flag in err[0] and "must not overwrite" in err[0], err[0]
        assert snapshot(scratch) == before


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(["run", "simulate", "bench", "plot"]),
       kind=st.sampled_from(("same", "dotted", "symlink", "hardlink")))
def test_two_outputs_on_one_file_are_refused(capsys, command, kind):
    spec = COMMANDS[command]
    first, second = spec.outputs
    with tempfile.TemporaryDirectory() as where:
        scratch, source = scratch_with_input(Path(where), command)
        capsys.readouterr()
        out = scratch / "out.png"
        if kind == "hardlink":
            out.write_text("kept")                 # a hard link needs a file to link to
        other = alias(kind, out, scratch, "other.png", [])
        before = snapshot(scratch)
        argv = [str(source) if a == "INPUT" else a for a in spec.argv] + [first, str(out), second, other]
        code = main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1, (argv, err)
        assert first in err[0] and second in err[0] and "same file" in err[0], err[0]
        assert snapshot(scratch) == before


def test_an_existing_file_inside_an_input_directory_counts_as_that_input(capsys, tmp_path):
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    code = main(["bench", "--pp", "1", "--num-prompts", "2", "--checkpoint", str(checkpoint),
                 "--trace", str(checkpoint / "config.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "is inside --checkpoint" in err[0]
    assert (checkpoint / "config.json").read_text() == "{}"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_that_writes_is_covered(command):
    """A new output flag must join the clash tests: the parser's flags that
    name a file to write are exactly those listed here."""
    from flightcheck.cli import build_parser

    parser = build_parser()
    words = command.split()
    sub = parser._subparsers._group_actions[0].choices[words[0]]
    if len(words) > 1:
        sub = sub._subparsers._group_actions[0].choices[words[1]]
    writes = {a.option_strings[0] for a in sub._actions if a.option_strings
              and a.option_strings[0] in ("--trace", "--chrome-trace", "--save-result", "--out", "--perfetto",
                                          "--json") and a.nargs != 0}
    assert writes == set(COMMANDS[command].outputs)
