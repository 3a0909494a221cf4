"""Hypothesis profiles for the suite.

`thorough` runs the property-based tests with many more examples; select it
for one file, e.g. the malformed-trace property (docs/trace-format.md):

    python -m pytest tests/test_check_trace_malformed.py --hypothesis-profile=thorough

The default profile is Hypothesis's own; tests that need fewer examples by
default say so with their own settings.
"""

from hypothesis import HealthCheck, settings

settings.register_profile("thorough", max_examples=2_000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
