"""Hypothesis profiles for the suite.

`thorough` runs the property-based tests with many more examples; select it
for one file, e.g. the malformed-trace property (docs/trace-format.md):

    python -m pytest tests/test_check_trace_malformed.py --hypothesis-profile=thorough

The default profile is Hypothesis's own; tests that need fewer examples by
default say so with their own settings.
"""

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
# check-trace's default checker is incremental (verification/traces/incremental.py);
# its claim is the full replay's verdict, property, event and message on every
# trace. A test module that checks traces in this process (directly, through
# the CLI, the refinement fuzzer or the vLLM bridge) declares
#     pytestmark = pytest.mark.usefixtures("both_checkers")
# and every check_events call its tests make then runs both checkers and
# asserts that they agree (`differential_check_events`).
# tests/test_check_trace_incremental.py checks that every module that checks
# traces declares it.

_original_check_events = _check.check_events


def _outcome(events: list, profile: str | None, full: bool) -> tuple:
    try:
        result = _original_check_events([dict(e) for e in events], profile, full=full)
    except _check.MalformedTrace as err:
        return ("malformed", str(err))
    return ("checked", result.ok, result.events, result.event_index, result.property, result.message,
            tuple(result.unchecked), result.profile)


def differential_check_events(events: list, profile: str | None = None, full: bool = False,
                              progress=None) -> _check.CheckResult:
    """check_events, after asserting that the incremental checker and the full
    replay agree on these events (under the same profile)."""
    incremental, whole = _outcome(events, profile, full=False), _outcome(events, profile, full=True)
    assert incremental == whole, f"incremental checker {incremental} != full replay {whole}"
    return _original_check_events(events, profile, full=full, progress=progress)


@pytest.fixture
def both_checkers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every module-level `check_events` bound to the checker's own function
    becomes `differential_check_events` for the test."""
    for module in list(sys.modules.values()):
        if isinstance(module, ModuleType) and vars(module).get("check_events") is _original_check_events:
            monkeypatch.setattr(module, "check_events", differential_check_events)
