"""Print one of the README's two commands (1: install and verify, 2: install
and test), exactly as README.md's "The two commands" section writes them, so
CI runs what a new user is told to run, in the same order, in one clone."""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
SECTION = "## The two commands"


def readme_commands(text: str) -> list[str]:
    """The bash blocks of the section, in order."""
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start:end if end != -1 else len(text)]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


if __name__ == "__main__":
    commands = readme_commands(README.read_text())
    if len(commands) != 2:
        sys.exit(f"README.md's '{SECTION}' section holds {len(commands)} bash blocks, not 2")
    print(commands[int(sys.argv[1]) - 1])
