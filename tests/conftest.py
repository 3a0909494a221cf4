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


# -- every trace a test checks is checked twice --------------------------------
# check-trace's default checker is incremental (verification/traces/incremental.py);
# its claim is the full replay's verdict, property, event and message on every
# trace. So wherever a test checks a trace (reference, runtime, simulator,
# mutants, generated), the full replay runs too and the two must agree.

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


@pytest.fixture(autouse=True)
def every_trace_checked_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in list(sys.modules.values()):
        if isinstance(module, ModuleType) and vars(module).get("check_events") is _original_check_events:
            monkeypatch.setattr(module, "check_events", differential_check_events)
