"""Settings for the whole test suite, and its tiers.

Tiers (``pytest -m unit``, ``-m integration``, ``-m slow``):

- ``integration``: the test runs a real server, tool or process (a Kafka broker,
  Prometheus, promtool, Helm, Chromium, nginx, a llama.cpp model server, a ``relmon``
  process). Every test under ``tests/`` in :data:`INTEGRATION_DIRS` is one; elsewhere a test or
  module says so with ``@pytest.mark.integration`` / ``pytestmark``.
- ``slow``: a statistical test that takes more than a few seconds.
- ``unit``: everything else (given here, never by hand): in-process, fakes and loopback
  servers of relmon's own. ``make test-fast`` runs this tier; ``make test`` runs all.

Hypothesis by default fails an example that runs longer than 200 ms (``deadline``) and
a test whose examples are slow to generate (``HealthCheck.too_slow``): both are wall
time, so a loaded CI machine could fail a correct test. Every property here is about
values, never speed, so the suite's default profile turns both off; tests that set
their own ``@settings`` inherit this for whatever they do not set.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

pytest_plugins = [
    "tests.apis_e2e.upstream",  # the `upstream` fixture: a server of every wire API
]

settings.register_profile("relmon", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("relmon")


TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
INTEGRATION_DIRS = frozenset({"kafka", "model", "browser", "deploy", "e2e", "bench", "postgres"})


def pytest_configure(config: pytest.Config) -> None:
    """Refuse to test compiled modules older than their source: Python would load the
    compiled ones (``make compile``, setup.py) and the tests would run yesterday's code.
    Their code is in one shared library; each module's own ``.so`` is a stub."""
    shared = [*(ROOT / "monitor").glob("_compiled__mypyc*.so")]
    built = shared[0].stat().st_mtime if shared else 0.0
    stale = [
        str(so.relative_to(ROOT))
        for top in ("monitor", "adapters")
        for so in (ROOT / top).rglob("*.so")
        if (source := so.with_name(so.name.split(".", 1)[0] + ".py")).exists()
        and source.stat().st_mtime > built
    ]
    if stale:
        raise pytest.UsageError(
            "compiled modules older than their source: "
            + ", ".join(stale)
            + ". Run `make compile` (or `make clean-compiled` to run plain Python)."
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(item.path).resolve().relative_to(TESTS).parts
        if parts[0] in INTEGRATION_DIRS:
            item.add_marker(pytest.mark.integration)
        if item.get_closest_marker("unit") is not None:
            raise pytest.UsageError(f"{item.nodeid}: the unit marker is given by conftest.py")
        if (
            item.get_closest_marker("integration") is None
            and item.get_closest_marker("slow") is None
        ):
            item.add_marker(pytest.mark.unit)
