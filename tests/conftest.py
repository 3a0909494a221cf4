"""Hypothesis profiles for the suite.

`thorough` runs the property-based tests with many more examples; select it
for one file, e.g. the malformed-trace property (docs/trace-format.md):

    python -m pytest tests/test_check_trace_malformed.py --hypothesis-profile=thorough

The default profile is Hypothesis's own; tests that need fewer examples by
default say so with their own settings.
"""

import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, settings

from flightcheck.verification.traces import check as _check

# -- the default suite's time budget --------------------------------------------
# tests/slow_tests.txt lists, with their measured seconds, the tests moved
# behind the `slow` marker to keep the default suite within 15 minutes on
# CI's machine; they are marked here, before `-m` selects.

SLOW_TESTS_FILE = Path(__file__).resolve().parent / "slow_tests.txt"


def slow_test_ids() -> set[str]:
    lines = SLOW_TESTS_FILE.read_text(encoding="utf-8").splitlines()
    return {line.split()[0] for line in lines if line.strip() and not line.startswith("#")}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    listed = slow_test_ids()
    found = set()
    for item in items:
        if item.nodeid in listed:
            item.add_marker(pytest.mark.slow)
            found.add(item.nodeid)
    # only a whole-suite collection can tell a stale line from a test not collected now
    whole_suite = all(Path(arg).resolve() == Path(config.rootpath, "tests").resolve()
                      for arg in config.args) if config.args else True
    if whole_suite and listed - found:
        raise pytest.UsageError(f"{SLOW_TESTS_FILE.name} names tests that do not exist: "
                                f"{sorted(listed - found)}")


settings.register_profile("thorough", max_examples=2_000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])


# -- the two checkers, compared where a module asks for it ---------------------
# check-trace's default checker is incremental (verification/traces/incremental.py),
# with fast.py's path for the steady state; its claim is the full replay's
# verdict, property, event and message on every trace. A test module that checks traces in this process (directly, through
# the CLI, the refinement fuzzer or the vLLM bridge) declares
#     pytestmark = pytest.mark.usefixtures("both_checkers")
# and every check_events call its tests make then runs both checkers and
# asserts that they agree (`differential_check_events`).
# tests/test_check_trace_incremental.py checks that every module that checks
# traces declares it.

_original_check_events = _check.check_events


def _outcome(events: list, profile: str | None, full: bool, fast: bool = False) -> tuple:
    try:
        result = _original_check_events([dict(e) for e in events], profile, full=full, fast=fast)
    except _check.MalformedTrace as err:
        return ("malformed", str(err))
    return ("checked", result.ok, result.events, result.event_index, result.property, result.message,
            tuple(result.unchecked), result.profile)


def _with_state_before(events: list, profile: str | None, fast: bool) -> tuple:
    """The incremental checker's outcome (fast.py's path or not) with the
    state before a violation and its line."""
    try:
        result = _original_check_events([dict(e) for e in events], profile, fast=fast)
    except _check.MalformedTrace as err:
        return ("malformed", str(err))
    return ("checked", result.ok, result.events, result.event_index, result.property, result.message,
            tuple(result.unchecked), result.profile, result.line, result.state_before)


def differential_check_events(events: list, profile: str | None = None, full: bool = False,
                              progress=None, fast: bool = False) -> _check.CheckResult:
    """check_events, after asserting that the incremental checker and the full
    replay agree on these events (under the same profile), that the fast
    path (fast.py) gives the incremental checker's outcome, state before a
    violation included, and that the streaming checker (stream.py, with the
    fast path: its default) agrees with them on the lines they came from."""
    slow = _with_state_before(events, profile, fast=False)
    incremental, whole = slow[:8], _outcome(events, profile, full=True)
    assert incremental == whole, f"incremental checker {incremental} != full replay {whole}"
    fast = _with_state_before(events, profile, fast=True)
    assert fast == slow, f"fast path {fast} != incremental checker {slow}"
    streamed = streamed_outcome(events, profile)
    assert streamed is None or streamed_agrees(*streamed, _comparable(incremental)), \
        f"streaming checker {streamed} != whole-trace checker {_comparable(incremental)}"
    return _original_check_events(events, profile, full=full, progress=progress, fast=fast)


def streamed_outcome(events: list, profile: str | None) -> tuple[tuple, int | None] | None:
    """The streaming checker's outcome on the events written back as the lines
    they were read from (blank lines where `read_events` skipped them), in the
    form `_comparable` gives, and the line of its violation; None for events
    JSON cannot write."""
    from flightcheck.verification.traces.stream import check_lines

    numbers = getattr(events, "line_numbers", None) or list(range(1, len(events) + 1))
    lines = [""] * (max(numbers, default=0))
    try:
        for number, event in zip(numbers, events):
            lines[number - 1] = json.dumps(event)
    except (TypeError, ValueError):
        return None
    verdict = list(check_lines(lines, profile))[-1]
    if verdict.result is None:
        return ("malformed", verdict.malformed), None
    r = verdict.result
    return _comparable(("checked", r.ok, r.events, r.event_index, r.property, r.message, tuple(r.unchecked),
                        r.profile)), r.line


def streamed_agrees(streamed: tuple, line: int | None, whole: tuple) -> bool:
    """The streaming checker's outcome is the whole-trace checker's, but for
    what it documents (stream.py): a violation before the first malformed
    line is reported; a pool too large to model is refused at the arrival
    that makes it so."""
    if streamed == whole:
        return True
    if whole[0] != "malformed":
        return False
    malformed_line = re.match(r"line (\d+):", whole[1])
    if streamed[0] == "checked" and not streamed[1] and malformed_line:
        return line is not None and line < int(malformed_line.group(1))
    pool = "the checker models pools of at most"
    return streamed[0] == "malformed" and pool in whole[1] and pool in streamed[1]


def _comparable(outcome: tuple) -> tuple:
    """An outcome without what the streaming checker cannot know when it stops
    at a violation: the count of events after it."""
    if outcome[0] == "checked" and not outcome[1]:
        return outcome[:2] + outcome[3:]
    return outcome


@pytest.fixture
def both_checkers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every module-level `check_events` bound to the checker's own function
    becomes `differential_check_events` for the test."""
    for module in list(sys.modules.values()):
        if isinstance(module, ModuleType) and vars(module).get("check_events") is _original_check_events:
            monkeypatch.setattr(module, "check_events", differential_check_events)
