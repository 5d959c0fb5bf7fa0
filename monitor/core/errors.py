"""Errors raised by relmon.

Every error relmon raises on purpose derives from :class:`RelmonError`::

    RelmonError
    ├── ConfigError            bad settings, an unknown canonicalizer, bad arguments
    ├── InputError             bad data from a file or a message (names where it came from)
    │   └── CanonicalizationError  an answer or a label cannot be canonicalized as asked
    ├── CalibrationError       not enough calibration data for what was asked
    └── ModelCallError         a call to the model endpoint failed (retriable: timeouts,
                               429, 5xx, connection errors; not: 4xx, garbage bodies)

Errors that may succeed when tried again carry ``retriable = True``.
"""

from __future__ import annotations

__all__ = [
    "CalibrationError",
    "CanonicalizationError",
    "ConfigError",
    "InputError",
    "ModelCallError",
    "RelmonError",
]


class RelmonError(Exception):
    """Root of relmon's errors."""

    retriable: bool = False


class ConfigError(RelmonError):
    """Settings or arguments that cannot work."""


class InputError(RelmonError):
    """Bad input data. ``source`` and ``line`` say where it came from, when known."""

    def __init__(self, message: str, *, source: str | None = None, line: int | None = None):
        self.source = source
        self.line = line
        where = source or ""
        if source is not None and line is not None:
            where = f"{source}:{line}"
        super().__init__(f"{where}: {message}" if where else message)


class CanonicalizationError(InputError):
    """An answer or label that a canonicalizer cannot handle as configured."""


class CalibrationError(RelmonError):
    """Too little calibration data for the quantity asked for."""


class ModelCallError(RelmonError):
    """A call to the model endpoint failed (after retries, when retriable)."""

    def __init__(self, message: str, *, retriable: bool = False, status: int | None = None):
        super().__init__(message)
        self.retriable = retriable
        self.status = status
