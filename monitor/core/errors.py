"""Errors raised by relmon.

Every error relmon raises on purpose derives from :class:`RelmonError`::

    RelmonError
    ├── ConfigError            bad settings, an unknown canonicalizer, bad arguments
    ├── InputError             bad data from a file or a message (names where it came from)
    │   ├── CanonicalizationError  an answer or a label cannot be canonicalized as asked
    │   └── TooLargeError      a field or a message over its documented size limit (HTTP
    │                          413, a Kafka dead letter; the limits: monitor.core.review)
    ├── CalibrationError       not enough calibration data for what was asked
    ├── ModelCallError         a call to the model endpoint failed (retriable: timeouts,
    │                          429, 5xx, connection errors; not: 4xx, garbage bodies)
    ├── StoreError             a read or write of a calibration store failed (retriable:
    │                          a busy or locked database)
    ├── LimitError             a caller over a configured limit (a reviewer's review
    │                          leases: HTTP 429)
    └── StateError             an object used out of order: started twice, or used
                               before it was started or after it was stopped

Errors that may succeed when tried again carry ``retriable = True``. Adapters add their
own subclasses where a caller must tell them apart (``KafkaUnavailableError``,
retriable, in :mod:`adapters.kafka.source`).

:class:`ConfigError` and :class:`InputError` are also :class:`ValueError` s, and
:class:`StateError` a :class:`RuntimeError`: what these raised before relmon had its own
errors, so a caller's ``except ValueError`` keeps working. Catch :class:`RelmonError`
for everything relmon raises on purpose.
"""

from __future__ import annotations

__all__ = [
    "CalibrationError",
    "CanonicalizationError",
    "ConfigError",
    "InputError",
    "LimitError",
    "ModelCallError",
    "RelmonError",
    "StateError",
    "StoreError",
    "TooLargeError",
]


class RelmonError(Exception):
    """Root of relmon's errors."""

    retriable: bool = False


class ConfigError(RelmonError, ValueError):
    """Settings or arguments that cannot work."""


class InputError(RelmonError, ValueError):
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


class TooLargeError(InputError):
    """Input over a documented size limit; the message names the field and the limit."""


class CalibrationError(RelmonError):
    """Too little calibration data for the quantity asked for."""


class ModelCallError(RelmonError):
    """A call to the model endpoint failed (after retries, when retriable)."""

    def __init__(self, message: str, *, retriable: bool = False, status: int | None = None):
        super().__init__(message)
        self.retriable = retriable
        self.status = status


class StoreError(RelmonError):
    """A read or write of a calibration store failed."""

    def __init__(self, message: str, *, retriable: bool = False) -> None:
        super().__init__(message)
        self.retriable = retriable


class LimitError(RelmonError):
    """A caller is over a configured limit (``review.max_leases_per_reviewer``): refused
    until it gives something back."""


class StateError(RelmonError, RuntimeError):
    """An object used out of order (a bug in the caller, never bad data or settings)."""
