"""The engine: runs live items through the core (sample, re-ask, rank, route to review,
apply verdicts to the calibration window) and talks to the outside only through the
ports in :mod:`monitor.engine.ports`."""

__all__: list[str] = []
