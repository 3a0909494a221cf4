"""A vLLM with one rule changed, without copying its venv: a small venv
whose site-packages puts a release's site-packages on the path and loads one
module of vLLM from an edited copy of that release's own file.

    python -m flightcheck.vllm.overlay ~/.cache/flightcheck/vllm-0.34.0/bin/python /tmp/lifo lifo-admission
    flightcheck vllm fit --vllm-python /tmp/lifo/bin/python --json
    python -m flightcheck.vllm.overlay ~/.cache/flightcheck/vllm-0.33.0/bin/python /tmp/dev --version 0.33.1.dev3+gfit

What it builds in OUT (a few files, made in about a second):

* `OUT/bin/python`: `python -m venv --without-pip` run by the release's own
  interpreter (so the same Python);
* in its site-packages, `_flightcheck_overlay.pth`: the release venv's
  site-packages as a path line, then an import of
  `_flightcheck_overlay.py`, a meta-path finder that answers for the edited
  module only (everything else imports from the release's files, the
  distribution metadata and `vllm.__version__` included);
* `OUT/overlay/<module>.py`: the release's file with one fragment replaced
  inside one function, found by its qualified name (ast); the fragment must
  occur there exactly once, else the build refuses (OverlayError);
* with `--version V`, `OUT/overlay/vllm/_version.py` saying V, so the copy
  reports an unreleased version, as a developer's build does.

`EDITS` names the one-rule changes the fit tests make (docs/vllm-fit.md):
one whose rule is a profile constant (`threshold-without-company`) and one
whose rule is not (`lifo-admission`). The fragments are patch anchors, the
smallest text that pins the rule; the code around them stays vLLM's, read at
build time from the venv. Standard library only.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


class OverlayError(RuntimeError):
    """The release's source does not have the fragment where the edit expects it."""


@dataclass(frozen=True)
class Edit:
    module: str            # the vLLM module whose file is edited
    function: str          # the qualified name of the one function changed ("Class.method")
    old: str               # a fragment occurring exactly once in that function
    new: str
    rule: str              # the rule it changes, in words


EDITS: dict[str, Edit] = {
    # 0.33 and 0.34 `Scheduler.schedule` apply `long_prefill_token_threshold`
    # only when more than one request is running or waiting (the
    # `threshold_needs_company` constant of both profiles); without the
    # company test a lone long prompt is cut to the threshold too, as 0.8.x does.
    "threshold-without-company": Edit(
        "vllm.v1.core.sched.scheduler", "Scheduler.schedule", "num_eligible_reqs > 1", "True",
        "the long-prefill threshold binds a request alone too (profile constant threshold_needs_company)"),
    # `Scheduler._enqueue_waiting_request` appends a new request to the
    # waiting queue's tail (FCFS); prepending it makes admission LIFO among
    # arrivals, a rule no profile constant covers.
    "lifo-admission": Edit(
        "vllm.v1.core.sched.scheduler", "Scheduler._enqueue_waiting_request",
        "self.waiting.add_request(request)", "self.waiting.prepend_request(request)",
        "a new request joins the head of the waiting queue: LIFO admission (no profile constant)"),
}

_FINDER = '''"""Made by flightcheck.vllm.overlay: load {modules} from edited copies."""
import importlib.abc
import importlib.util
import sys

OVERLAY = {overlay!r}


class _OverlayFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        source = OVERLAY.get(fullname)
        return None if source is None else importlib.util.spec_from_file_location(fullname, source)


sys.meta_path.insert(0, _OverlayFinder())
'''


def _run(python: Path, *argv: str) -> str:
    done = subprocess.run([str(python), *argv], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise OverlayError(f"{python} {' '.join(argv[:2])}: {done.stderr.strip().splitlines()[-1:]}")
    return done.stdout


def _site_packages(python: Path) -> Path:
    return Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())


def edited_source(source: str, edit: Edit) -> str:
    """`source` with `edit.old` replaced by `edit.new` inside `edit.function`."""
    owner, _, name = edit.function.rpartition(".")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == owner:
            method = next((item for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                           and item.name == name), None)
            if method is None or method.end_lineno is None:
                break
            lines = source.splitlines(keepends=True)
            start, end = method.lineno - 1, method.end_lineno
            body = "".join(lines[start:end])
            if body.count(edit.old) != 1:
                raise OverlayError(f"{edit.function} has {body.count(edit.old)} occurrences of {edit.old!r}, "
                                   f"not one")
            return "".join(lines[:start]) + body.replace(edit.old, edit.new) + "".join(lines[end:])
    raise OverlayError(f"{edit.module} has no function {edit.function}")


def _version_module(version: str) -> str:
    """A `vllm/_version.py` of our own saying `version` (what a developer's
    build of an unreleased vLLM reports)."""
    numbers = tuple(int(part) for part in version.split("+")[0].split(".")[:3] if part.isdigit())
    return (f"# made by flightcheck.vllm.overlay: an unreleased version\n"
            f"__version__ = version = {version!r}\n__version_tuple__ = version_tuple = {numbers!r}\n")


def make_overlay(base_python: Path, out: Path, edits: list[Edit], version: str | None = None) -> Path:
    """Build the overlay venv in `out` (created; must not exist) and return
    its python. `version`: it also reports this `vllm.__version__` (an
    unreleased build's, such as "0.33.1.dev3+gfit")."""
    base_python = Path(base_python).expanduser()
    base_site = _site_packages(base_python)
    _run(base_python, "-m", "venv", "--without-pip", str(out))
    python = out / "bin" / "python"
    overlay: dict[str, str] = {}
    if version is not None:
        target = out / "overlay" / "vllm" / "_version.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_version_module(version))
        overlay["vllm._version"] = str(target)
    for edit in edits:
        relative = Path(*edit.module.split(".")).with_suffix(".py")
        target = out / "overlay" / relative
        base = Path(overlay[edit.module]) if edit.module in overlay else base_site / relative
        text = edited_source(base.read_text(), edit)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        overlay[edit.module] = str(target)
    site = _site_packages(python)
    (site / "_flightcheck_overlay.py").write_text(_FINDER.format(modules=", ".join(overlay), overlay=overlay))
    (site / "_flightcheck_overlay.pth").write_text(f"{base_site}\nimport _flightcheck_overlay\n")
    (out / "overlay" / "edits.json").write_text(json.dumps(
        {"base_python": str(base_python), "version": version, "edits": [edit.__dict__ for edit in edits]},
        indent=1))
    return python


def main(argv: list[str]) -> int:
    version = None
    if len(argv) > 1 and argv[-2] == "--version":
        argv, version = argv[:-2], argv[-1]
    if len(argv) < 2 or any(name not in EDITS for name in argv[2:]):
        print(f"usage: python -m flightcheck.vllm.overlay BASE_PYTHON OUT [EDIT...] [--version V] "
              f"(edits: {', '.join(EDITS)})", file=sys.stderr)
        return 2
    try:
        print(make_overlay(Path(argv[0]), Path(argv[1]), [EDITS[name] for name in argv[2:]], version))
    except OverlayError as err:
        print(f"overlay: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
