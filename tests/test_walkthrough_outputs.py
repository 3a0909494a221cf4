"""The walkthrough's committed outputs are what `python benchmarks/walkthrough.py`
makes today: regenerating them (into a temporary folder, with the same
layout) changes nothing. So docs/walkthrough.md's tables, its state-machine
picture's source data, the spec code it quotes and the checker's outputs
cannot go stale unnoticed.

The pictures are compared by their source data (the engine-test traces, the
derived state machine), not byte for byte: their pixels depend on the
installed matplotlib and fonts. The script writes them without a version
stamp, so on one machine they regenerate byte-identical too."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "walkthrough.py"
PROOF = Path("docs/walkthrough/proof.txt")


def regenerate(into: Path, *extra: str) -> list[Path]:
    """Run the script into `into`; the files it wrote, relative to `into`."""
    subprocess.run([sys.executable, str(SCRIPT), "--into", str(into), *extra], cwd=ROOT, check=True,
                   capture_output=True, text=True, timeout=600)
    return sorted(p.relative_to(into) for p in into.rglob("*") if p.is_file())


def differing(into: Path, written: list[Path]) -> list[str]:
    """The written files whose committed copy differs (pictures: only that one exists)."""
    out = []
    for rel in written:
        committed = ROOT / rel
        if not committed.is_file():
            out.append(f"{rel} (not committed)")
        elif rel.suffix == ".png":
            continue
        elif (into / rel).read_bytes() != committed.read_bytes():
            out.append(str(rel))
    return out


def test_regenerating_the_walkthrough_changes_nothing(tmp_path: Path):
    written = regenerate(tmp_path, "--without-proof")
    names = {str(p) for p in written}
    for needed in ("docs/walkthrough.md", "docs/walkthrough/state-machine.txt",
                   "docs/figures/walkthrough-state-machine.png",
                   "docs/walkthrough/advance-at-completion.txt", "docs/walkthrough/hang-counterexample.txt",
                   "docs/walkthrough/engine-test-steps-continue-prefill.txt"):
        assert needed in names, needed
    assert differing(tmp_path, written) == [], "run `python benchmarks/walkthrough.py` and commit its outputs"


@pytest.mark.slow
def test_regenerating_the_proof_changes_nothing(tmp_path: Path):
    written = regenerate(tmp_path)
    assert PROOF in written
    assert differing(tmp_path, [PROOF]) == []


def test_the_committed_outputs_carry_no_timing():
    # Wall-clock figures would make every regeneration a diff.
    for path in (ROOT / "docs" / "walkthrough").glob("*.txt"):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"\d+\.\d+ s\b|│ \d+\.\d\d\s+│$", text, re.MULTILINE), path.name


def test_the_state_machine_is_the_spec_s_own():
    """The picture's data names every status and fate of spec/state.py, and
    only those: it is derived from the spec, so a new status shows up here."""
    from flightcheck.spec import Fate, Status
    text = (ROOT / "docs" / "walkthrough" / "state-machine.txt").read_text(encoding="utf-8")
    edges = [re.match(r"(\S+) -> (\S+ ?\S*) \((\w+)\)$", line) for line in text.splitlines()
             if not line.startswith("#")]
    assert all(edges)
    nodes = {n for m in edges for n in (m.group(1), m.group(2))}
    assert {s.name for s in Status} <= nodes
    assert {f.name for f in Fate} <= nodes
    assert nodes - {s.name for s in Status} - {f.name for f in Fate} == {"(scheduled)", "(output returned)"}
    assert ("RUNNING", "PREEMPTED", "schedule") in {m.groups() for m in edges}
