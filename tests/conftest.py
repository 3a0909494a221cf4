"""Hypothesis profiles for the suite.

`thorough` runs the property-based tests with many more examples; select it
for one file, e.g. the malformed-trace property (docs/trace-format.md):

    python -m pytest tests/test_check_trace_malformed.py --hypothesis-profile=thorough

The default profile is Hypothesis's own; tests that need fewer examples by
default say so with their own settings.
"""

import sys
from types import ModuleType

import pytest
from hypothesis import HealthCheck, settings

from flightcheck.verification.traces import check as _check

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
