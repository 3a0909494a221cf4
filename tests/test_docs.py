"""The documentation stays usable: README.md is a front door (short), and no
relative link in the project's Markdown points at a file that is not there
(files move; a link that silently dangles is how a newcomer gets lost)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 150

# Every Markdown file a reader is sent to: the front door, the layer and
# method READMEs, and docs/. Recorded outputs (docs/results) are not Markdown.
DOCUMENTS = sorted(
    {README}
    | set(ROOT.glob("spec/README.md"))
    | set(ROOT.glob("reference/*.md"))
    | set(ROOT.glob("runtime/README.md"))
    | set(ROOT.glob("verification/**/README.md"))
    | set(ROOT.glob("docs/*.md"))
)

FENCED_BLOCK = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
# [text](target) and ![alt](target); a target has no spaces (titles are not used).
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)


def links_of(markdown: str) -> list[str]:
    """The link targets of a Markdown text, code blocks and code spans left
    out (they show commands and paths, not links)."""
    prose = INLINE_CODE.sub("", FENCED_BLOCK.sub("", markdown))
    return LINK.findall(prose)


def is_relative(target: str) -> bool:
    return not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target)   # http:, https:, mailto:, ...


def anchor_of(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, code marks and punctuation
    dropped (hyphens and underscores kept), spaces as hyphens."""
    text = heading.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors_in(markdown: str) -> set[str]:
    return {anchor_of(h) for h in HEADING.findall(FENCED_BLOCK.sub("", markdown))}


def broken_links(document: Path, markdown: str) -> list[str]:
    """Each relative link of `markdown` (read from `document`) whose file is
    missing, or whose #anchor names no heading of the Markdown file it
    points into."""
    broken = []
    for target in links_of(markdown):
        if not is_relative(target):
            continue
        path_part, _, anchor = target.partition("#")
        destination = (document.parent / path_part).resolve() if path_part else document
        if not destination.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and destination.suffix == ".md" and destination.is_file():
            if anchor not in anchors_in(destination.read_text(encoding="utf-8")):
                broken.append(f"{target} (no heading #{anchor})")
    return broken


def test_readme_is_a_front_door_of_at_most_150_lines():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move detail to docs/"


def test_every_method_folder_of_verification_has_a_readme():
    for folder in ("", "explicit", "traces", "refinement", "z3"):
        assert (ROOT / "verification" / folder / "README.md").is_file(), folder


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_an_existing_file(document: Path):
    assert broken_links(document, document.read_text(encoding="utf-8")) == []


def test_the_readme_links_to_every_layer_and_method():
    targets = {t.partition("#")[0] for t in links_of(README.read_text(encoding="utf-8"))}
    for needed in ("spec/README.md", "verification/README.md", "reference/README.md",
                   "runtime/README.md", "docs/proofs.md", "docs/renames.md"):
        assert needed in targets, needed


def test_the_link_check_catches_a_missing_file_and_a_missing_heading(tmp_path: Path):
    # The check must be able to fail: a dangling file, a dangling anchor.
    (tmp_path / "there.md").write_text("# A heading: with `code`\n", encoding="utf-8")
    document = tmp_path / "doc.md"
    markdown = ("[ok](there.md#a-heading-with-code) [gone](missing.md) "
                "![img](gone.png) [bad anchor](there.md#nope) [web](https://example.com) "
                "`[in code](missing-too.md)`\n")
    assert broken_links(document, markdown) == [
        "missing.md (no such file)", "gone.png (no such file)", "there.md#nope (no heading #nope)"]


def test_the_readme_test_command_is_the_one_ci_runs():
    readme = README.read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    for step in ("pip install torch==2.13.0", "pip install -e '.[runtime,test]'", "python -m pytest -q"):
        assert step in readme, step
        assert step.replace("pip install", "python -m pip install -q") in ci or step in ci, step
