"""Settings for the whole test suite.

Hypothesis by default fails an example that runs longer than 200 ms (``deadline``) and
a test whose examples are slow to generate (``HealthCheck.too_slow``): both are wall
time, so a loaded CI machine could fail a correct test. Every property here is about
values, never speed, so the suite's default profile turns both off; tests that set
their own ``@settings`` inherit this for whatever they do not set.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile("relmon", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("relmon")
