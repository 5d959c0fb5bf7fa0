"""A segment value as a Prometheus label value: short, from a small alphabet, never
free text that could carry a user's words or grow without bound.

:func:`label_value` keeps a raw value as it is when it is at most
:data:`MAX_LABEL_CHARS` (64) characters of ``[A-Za-z0-9_.:-]`` (a tenant id, a plan
name, a language code); anything else becomes ``h:`` and the first 12 hex digits of a
SHA-256 of the value (48 bits: two of a task's top values share one with a chance
under 10⁻¹¹). A hash is not user text, but it is a fingerprint: a value from a small
set (an email address, a phone number) can be found again by hashing guesses, so
segment by an identifier, not by something secret. A deployment that wants more
passes ``key``: the hash is then an HMAC-SHA256 under that key.

Two label values are reserved: :data:`OTHER` (``other``: the traffic of every segment
that has no label of its own, :mod:`monitor.core.segments.table`) and :data:`NONE`
(``none``: the event has no segment value: the header is absent, the field finds
nothing, the language cannot be told). The empty string is no value too (``none``).
A raw value that *is* ``other`` or ``none``, or starts with ``h:``, is hashed like any
unsafe one, so a tenant called ``other`` is never counted as the rest of the traffic
and no value can pass for another one's hash.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Final

__all__ = [
    "HASH_PREFIX",
    "LABEL_PATTERN",
    "MAX_LABEL_CHARS",
    "NONE",
    "OTHER",
    "RESERVED_LABELS",
    "is_label",
    "label_value",
]

MAX_LABEL_CHARS: Final = 64
"""The longest raw value that may be a label as it is."""
LABEL_PATTERN: Final = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
"""What every label value :func:`label_value` returns matches (``fullmatch``)."""
OTHER: Final = "other"
"""The shared label of the segments without a label of their own."""
NONE: Final = "none"
"""The label of an event without a segment value."""
RESERVED_LABELS: Final = frozenset({OTHER, NONE})
HASH_PREFIX: Final = "h:"
_HASH_HEX: Final = 12
_DOMAIN: Final = b"relmon segment\x00"


def _hashed(raw: str, key: bytes) -> str:
    data = raw.encode("utf-8", errors="surrogatepass")
    if key:
        digest = hmac.new(key, data, hashlib.sha256).hexdigest()
    else:
        digest = hashlib.sha256(_DOMAIN + data).hexdigest()
    return HASH_PREFIX + digest[:_HASH_HEX]


def label_value(raw: str | None, *, key: bytes = b"") -> str:
    """The label value of a raw segment value (see the module): ``raw`` itself when it is
    safe, ``none`` for no value (None or ``""``), else ``h:`` and 12 hex digits."""
    if raw is None or raw == "":
        return NONE
    if (
        raw not in RESERVED_LABELS
        and not raw.startswith(HASH_PREFIX)
        and LABEL_PATTERN.fullmatch(raw)
    ):
        return raw
    return _hashed(raw, key)


def is_label(value: object) -> bool:
    """``value`` is something :func:`label_value` can return (``other`` is not)."""
    return isinstance(value, str) and value != OTHER and LABEL_PATTERN.fullmatch(value) is not None
